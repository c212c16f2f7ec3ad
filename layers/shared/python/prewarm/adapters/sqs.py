"""Per-node task queues and the status queue on SQS.

Node queue URLs are derived, not looked up: same endpoint and account as the status queue, name from
`node_queue_name`. So a send costs one call.

Only the control plane creates node queues (`provide_queue`, with the shared DLQ redrive, the senders'
policy and the stack's tags), on a hello its cluster's API vouches for, and sets back to the stack's a
queue found otherwise (`provide_queue`, `repair_queue`); the agent only finds its queue (`find_queue`)
and waits for it. A send to a node without a queue finds no agent there, and is made again once its
queue exists; the sweep deletes the queues of departed nodes (docs/architecture.md, "Who owns the node
queues").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped, split_scoped
from prewarm.domain.messages import (
    ClusterProbe,
    FromAgent,
    NodeBound,
    PullTask,
    RequiredImages,
    cluster_queue_prefix,
    is_cluster_queue,
    node_queue_name,
)
from prewarm.domain.node_queues import (
    TAG_CLUSTER,
    TAG_NODE,
    TAG_PREFIX,
    ProvidedQueue,
    attribute_drift,
    queue_attributes,
    queue_tags,
    tags_differ,
)
from prewarm.services.ports import NodeQueueError

__all__ = ["TAG_CLUSTER", "TAG_NODE", "TAG_PREFIX", "NodeQueues", "QueueError", "QueueGoneError",
           "QueueRetryableError", "StatusQueue", "name_refused", "queue_error"]
_MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
# QueueDeletedRecently: SQS refuses a deleted queue's name for 60 s (CreateQueue, "Quotas related to
# queues"); EKS reuses node names with IPs, so a node can come back just after the sweep deleted its queue.
_RETRYABLE = {"RequestThrottled", "ThrottlingException", "ServiceUnavailable", "InternalError", "KmsThrottled",
              "OverLimit", "QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently"}

log = logging.getLogger(__name__)


class QueueError(NodeQueueError):
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


def name_refused(name: str, node: str) -> QueueRetryableError:
    """SQS refuses a queue's name for 60 s after the queue's deletion (CreateQueue, QueueDeletedRecently)."""
    return QueueRetryableError(f"create queue {name}: a queue of that name was deleted less than 60 s ago (node "
                               f"{node} left and came back under the same name); made once SQS allows the name")


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
        return queue_attributes(visibility_seconds=self.visibility_seconds, dlq_arn=self.dlq_arn,
                                max_receive_count=self.max_receive_count, sender_arns=self.sender_arns)

    def _tags(self, node: str, cluster: str | None = None) -> dict[str, str]:
        # The tags mark the queue as this stack's, so `sweep` never deletes another stack's queue
        # that happens to share the name prefix (`prewarm-` also matches `prewarm-staging-…`).
        return queue_tags(self.prefix, node, self.cluster if cluster is None else cluster)

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

    def provide_queue(self, node: str, cluster: str | None = None) -> ProvidedQueue:
        """The node's queue with the stack's attributes and tags: created when missing, and a queue found
        with another policy, other attributes or without the stack's tags set back to them."""
        name = self.queue_name(node, cluster)
        url = self.find_queue(node, cluster)
        if url is None:
            try:
                created = self.client.create_queue(QueueName=name, Attributes=self._attributes(),
                                                   tags=self._tags(node, cluster))
                return ProvidedQueue(str(created["QueueUrl"]), created=True)
            except (ClientError, BotoCoreError) as e:
                code = _code(e) if isinstance(e, ClientError) else ""
                if code not in {"QueueAlreadyExists", "QueueNameExists"}:
                    if "QueueDeletedRecently" in code:
                        raise name_refused(name, node) from e
                    raise _error(e, f"create queue {name}") from e
                # Made meanwhile by someone else, with other attributes: set back below.
                url = self.queue_url(node, cluster)
        return ProvidedQueue(url, repaired=self._repair(url, self._tags(node, cluster)))

    def ensure_queue(self, node: str, cluster: str | None = None) -> str:
        """`provide_queue`'s URL."""
        return self.provide_queue(node, cluster).url

    def find_queue(self, node: str, cluster: str | None = None) -> str | None:
        """The node's queue URL when the queue exists (`GetQueueUrl`: what an agent waits on), else None."""
        name = self.queue_name(node, cluster)
        try:
            return str(self.client.get_queue_url(QueueName=name)["QueueUrl"])
        except (ClientError, BotoCoreError) as e:
            if isinstance(e, ClientError) and _code(e) in _MISSING:
                return None
            raise _error(e, f"find queue {name}") from e

    def repair_queue(self, url: str) -> tuple[str, ...] | None:
        """Sets a queue of this stack (by its tags) back to the stack's attributes: what was set back
        (attribute names), or None when the queue is not this stack's or is gone."""
        tagged = self.queue_node(url)
        if tagged is None:
            return None
        cluster, node = split_scoped(tagged)
        return self._repair(url, self._tags(node, cluster) if node else None)

    def _repair(self, url: str, tags: dict[str, str] | None) -> tuple[str, ...]:
        """Sets what differs from the stack's: tags first (`tags`; None leaves them), then attributes."""
        repaired: list[str] = []
        try:
            if tags is not None and tags_differ(self.client.list_queue_tags(QueueUrl=url).get("Tags", {}), tags):
                self.client.tag_queue(QueueUrl=url, Tags=tags)
                repaired.append("tags")
            expected = self._attributes()
            actual = self.client.get_queue_attributes(
                QueueUrl=url, AttributeNames=sorted({*expected, "Policy", "RedrivePolicy"})).get("Attributes", {})
            drift = attribute_drift(actual, expected)
            if drift:
                self.client.set_queue_attributes(QueueUrl=url, Attributes=drift)
                repaired += sorted(drift)
        except (ClientError, BotoCoreError) as e:
            raise _error(e, f"set {url} back to the stack's attributes") from e
        if repaired:
            log.warning("node queue %s was not the stack's (%s): set back", url, ", ".join(repaired))
        return tuple(repaired)

    def send(self, message: NodeBound) -> bool:
        """Sends to the node's queue; False when the node has none (no agent has started there yet)."""
        # Held back for the start its registry's budget gave it (`services.pacing`).
        delay = {"DelaySeconds": message.delay_seconds} if isinstance(message, PullTask) and message.delay_seconds \
            else {}
        try:
            self.client.send_message(QueueUrl=self.queue_url(message.node, message.cluster),
                                     MessageBody=message.model_dump_json(), **delay)
        except ClientError as e:
            if _code(e) in _MISSING:
                log.info("%s for node %s waits for its agent: the node has no task queue yet", message.kind,
                         message.node)
                return False
            raise _error(e, f"send {message.kind} to {message.node}") from e
        return True

    def send_many(self, messages: Sequence[NodeBound]) -> list[tuple[str, str]]:
        """Sends to many nodes concurrently; returns (node, error) for those that failed, each logged."""
        if len(messages) <= 1:
            return [r for r in map(self._send_or_fail, messages) if r is not None]
        _ = self.client  # build once, before the threads share it
        with ThreadPoolExecutor(max_workers=min(self.workers, len(messages))) as pool:
            return [r for r in pool.map(self._send_or_fail, messages) if r is not None]

    def _send_or_fail(self, message: NodeBound) -> tuple[str, str] | None:
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


class ProbeQueue(_SqsAdapter):
    """The probe queue: the control plane's probes of clusters that parked jobs wait for (`ClusterProbes`)."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.url = url
        self._client = client

    def send_probe(self, probe: ClusterProbe, *, delay: int) -> None:
        """Sends the probe of a cluster, delivered `delay` seconds later (`DelaySeconds`: SQS takes 0 to 900)."""
        if not self.url:
            raise QueueError(f"cluster {probe.cluster or '(own)'} not probed: PROBE_QUEUE_URL is not set")
        try:
            self.client.send_message(QueueUrl=self.url, MessageBody=probe.model_dump_json(), DelaySeconds=delay)
        except (ClientError, BotoCoreError) as e:
            raise queue_error(e, f"send the probe of cluster {probe.cluster or '(own)'}") from e
