"""Per-node task queues and the status queue on SQS.

Node queue URLs are derived, not looked up: same endpoint and account as the status queue, name from
`node_queue_name`. So a send costs one call.

Each node's agent creates its own queue (`ensure_queue`, with the shared DLQ redrive and the senders'
policy) before it says hello, and again when it is deleted under it; the sweep deletes the queues of
departed nodes. The control plane never creates one: a send to a node without a queue finds no agent
there, and is made again when that agent says hello (docs/architecture.md, "Who owns the node queues").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped
from prewarm.domain.messages import (
    CancelTask,
    FromAgent,
    PullTask,
    RequiredImages,
    cluster_queue_prefix,
    is_cluster_queue,
    node_queue_name,
)

TAG_PREFIX = "prewarm:node-queue-prefix"
TAG_NODE = "prewarm:node"
# On queues of a registered cluster's nodes only (`prewarm.domain.clusters`): node names repeat across clusters.
TAG_CLUSTER = "prewarm:cluster"
_MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
# QueueDeletedRecently: SQS refuses a deleted queue's name for 60 s (CreateQueue, "Quotas related to
# queues"); EKS reuses node names with IPs, so a node can come back just after the sweep deleted its queue.
_RETRYABLE = {"RequestThrottled", "ThrottlingException", "ServiceUnavailable", "InternalError", "KmsThrottled",
              "OverLimit", "QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently"}

log = logging.getLogger(__name__)


class QueueError(Exception):
    """A queue operation failed for good (permissions, a malformed request)."""


class QueueRetryableError(QueueError):
    """Throttling or a transient SQS failure: retry later."""


class QueueGoneError(QueueError):
    """The queue does not exist (deleted while in use): create it again to go on."""


def queue_error(e: ClientError | BotoCoreError, what: str) -> QueueError:
    """The queue error for a botocore failure: connection problems and throttling are retryable."""
    if isinstance(e, BotoCoreError):
        return QueueRetryableError(f"{what}: {e}")
    error = e.response.get("Error", {})
    code = str(error.get("Code", ""))
    cls = QueueRetryableError if code in _RETRYABLE else QueueGoneError if code in _MISSING else QueueError
    message = error.get("Message", "")
    return cls(f"{what}: {code or e}" + (f": {message}" if message else ""))


_error = queue_error


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _sqs_client() -> Any:
    import boto3
    from botocore.config import Config

    # Pools sized for the fan-out's worker threads; standard retries absorb RequestThrottled.
    return boto3.client("sqs", config=Config(retries={"mode": "standard", "max_attempts": 8},
                                             max_pool_connections=32))


class _SqsAdapter:
    """Holds the injected SQS client, or builds one on first use."""

    _client: Any

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _sqs_client()
        return self._client


class NodeQueues(_SqsAdapter):
    """`TaskQueues` on SQS: one queue per node named `<prefix>-<node>`, sharing one DLQ."""

    def __init__(
        self,
        prefix: str,
        status_queue_url: str,
        *,
        dlq_arn: str = "",
        visibility_seconds: int = 120,
        max_receive_count: int = 5,
        sender_arns: Sequence[str] = (),
        client: Any = None,
        workers: int = 16,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        if not status_queue_url:
            raise QueueError("the status queue URL is needed to derive node queue URLs (STATUS_QUEUE_URL)")
        self.prefix = prefix
        self.base_url = status_queue_url.rsplit("/", 1)[0]
        self.dlq_arn = dlq_arn
        self.visibility_seconds = visibility_seconds
        self.max_receive_count = max_receive_count
        self.sender_arns = list(sender_arns)
        self.workers = workers
        self._client = client
        #: The cluster whose node queues `ensure_queue` makes (an agent's); sends find theirs per message.
        self.cluster = cluster

    def queue_name(self, node: str, cluster: str | None = None) -> str:
        return node_queue_name(self.prefix, node, self.cluster if cluster is None else cluster)

    def queue_url(self, node: str, cluster: str | None = None) -> str:
        return f"{self.base_url}/{self.queue_name(node, cluster)}"

    def _attributes(self) -> dict[str, str]:
        attrs = {
            "VisibilityTimeout": str(self.visibility_seconds),
            "MessageRetentionPeriod": str(4 * 24 * 3600),
            "ReceiveMessageWaitTimeSeconds": "20",
            "SqsManagedSseEnabled": "true",
        }
        if self.dlq_arn:
            attrs["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": self.dlq_arn, "maxReceiveCount": str(self.max_receive_count)}
            )
        if self.sender_arns:
            attrs["Policy"] = json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "OnlyPrewarmSends",
                            "Effect": "Allow",
                            "Principal": {"AWS": self.sender_arns},
                            "Action": "sqs:SendMessage",
                            "Resource": "*",
                        },
                        # In one account an Allow only adds to IAM grants: the Deny makes the list exclusive.
                        {
                            "Sid": "NobodyElseSends",
                            "Effect": "Deny",
                            "Principal": "*",
                            "Action": "sqs:SendMessage",
                            "Resource": "*",
                            "Condition": {"ArnNotEquals": {"aws:PrincipalArn": self.sender_arns}},
                        },
                    ],
                }
            )
        return attrs

    def _tags(self, node: str) -> dict[str, str]:
        # The tags mark the queue as this stack's, so `sweep` never deletes another stack's queue
        # that happens to share the name prefix (`prewarm-` also matches `prewarm-staging-…`).
        tags = {TAG_PREFIX: self.prefix, TAG_NODE: node[:256]}
        return {**tags, TAG_CLUSTER: self.cluster} if self.cluster else tags

    def owns_queue(self, url: str) -> bool:
        return self.queue_node(url) is not None

    def queue_node(self, url: str) -> str | None:
        """The node whose queue `url` is, scoped by its cluster (`<cluster>:<node>`, plain for the stack's
        own); None for a queue that is not this stack's."""
        try:
            tags = self.client.list_queue_tags(QueueUrl=url).get("Tags", {})
        except ClientError as e:
            if _code(e) in _MISSING:
                return None
            raise _error(e, f"read tags of {url}") from e
        if tags.get(TAG_PREFIX) != self.prefix:
            return None
        return scoped(str(tags.get(TAG_CLUSTER, "")), str(tags.get(TAG_NODE, "")))

    def ensure_queue(self, node: str) -> str:
        """Creates the node's queue if missing (idempotent) and returns its URL."""
        name = self.queue_name(node)
        try:
            created = self.client.create_queue(QueueName=name, Attributes=self._attributes(), tags=self._tags(node))
            return str(created["QueueUrl"])
        except ClientError as e:
            if _code(e) in {"QueueAlreadyExists", "QueueNameExists"}:
                # Exists with other attributes (an older stack version): use it as it is.
                return str(self.client.get_queue_url(QueueName=name)["QueueUrl"])
            if "QueueDeletedRecently" in _code(e):
                raise QueueRetryableError(
                    f"create queue {name}: a queue of that name was deleted less than 60 s ago (node {node} left "
                    "and came back under the same name); the task is sent again once SQS allows the name"
                ) from e
            raise _error(e, f"create queue {name}") from e

    def send(self, message: PullTask | CancelTask | RequiredImages) -> bool:
        """Sends to the node's queue; False when the node has none (no agent has started there yet)."""
        try:
            self.client.send_message(QueueUrl=self.queue_url(message.node, message.cluster),
                                     MessageBody=message.model_dump_json())
        except ClientError as e:
            if _code(e) in _MISSING:
                log.info("%s for node %s waits for its agent: the node has no task queue yet", message.kind,
                         message.node)
                return False
            raise _error(e, f"send {message.kind} to {message.node}") from e
        return True

    def send_many(self, messages: Sequence[PullTask | CancelTask | RequiredImages]) -> list[tuple[str, str]]:
        """Sends to many nodes concurrently; returns (node, error) for those that failed, each logged."""
        if len(messages) <= 1:
            return [r for r in map(self._send_or_fail, messages) if r is not None]
        _ = self.client  # build once, before the threads share it
        with ThreadPoolExecutor(max_workers=min(self.workers, len(messages))) as pool:
            return [r for r in pool.map(self._send_or_fail, messages) if r is not None]

    def _send_or_fail(self, message: PullTask | CancelTask | RequiredImages) -> tuple[str, str] | None:
        try:
            self.send(message)
        except QueueError as e:
            # Logged here: callers that leave the retry to the sweep would otherwise say nothing.
            what = message.kind if isinstance(message, RequiredImages) else f"{message.kind} of {message.job}"
            log.warning("%s for node %s not sent: %s", what, message.node, e)
            return (message.node, str(e))
        return None

    def list_node_queues(self, cluster: str = DEFAULT_CLUSTER) -> dict[str, str]:
        """Queue name → URL of every node queue of `cluster` under the prefix."""
        out: dict[str, str] = {}
        kwargs: dict[str, Any] = {"QueueNamePrefix": cluster_queue_prefix(self.prefix, cluster), "MaxResults": 1000}
        while True:
            try:
                page = self.client.list_queues(**kwargs)
            except ClientError as e:
                raise _error(e, "list node queues") from e
            for url in page.get("QueueUrls", []):
                name = url.rsplit("/", 1)[1]
                if is_cluster_queue(self.prefix, name, cluster):
                    out[name] = url
            if not page.get("NextToken"):
                return out
            kwargs["NextToken"] = page["NextToken"]

    def delete_queue(self, url: str) -> None:
        try:
            self.client.delete_queue(QueueUrl=url)
        except ClientError as e:
            if _code(e) not in _MISSING:
                raise _error(e, f"delete queue {url}") from e





class StatusQueue(_SqsAdapter):
    """The status queue: the agents send reports, hellos and warm-ups; `record_status` says when the
    messages it hands back are delivered again (`Redelivery`)."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.url = url
        self._client = client

    def send(self, message: FromAgent) -> None:
        try:
            self.client.send_message(QueueUrl=self.url, MessageBody=message.model_dump_json())
        except ClientError as e:
            raise _error(e, f"send {message.kind} report") from e

    def deliver_again_after(self, delays: Sequence[tuple[str, int]]) -> None:
        """Hides each message (by receipt handle) for its seconds from now, ten a call
        (ChangeMessageVisibilityBatch). "The new timeout period takes effect immediately" and counts from
        the call (SQS developer guide, "Visibility timeout"). Refusals are logged, not raised: the
        batch's outcome stands, and such a message comes back after the queue's own timeout."""
        for start in range(0, len(delays), 10):
            chunk = delays[start : start + 10]
            entries = [{"Id": str(i), "ReceiptHandle": receipt, "VisibilityTimeout": seconds}
                       for i, (receipt, seconds) in enumerate(chunk)]
            try:
                failed = self.client.change_message_visibility_batch(QueueUrl=self.url, Entries=entries).get(
                    "Failed", [])
            except (ClientError, BotoCoreError) as e:
                log.warning("%d returned messages keep the queue's visibility timeout: %s", len(chunk),
                            _error(e, "change message visibility"))
                continue
            for failure in failed:
                log.warning("a returned message keeps the queue's visibility timeout: %s: %s",
                            failure.get("Code"), failure.get("Message", ""))
