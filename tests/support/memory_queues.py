"""The node queues and the status queue's redelivery in memory, for the services' unit tests.

`MemoryTaskQueues` is `prewarm.adapters.sqs.NodeQueues` on a `MemorySqs` (the queues of one account and
region): the same queue names and URLs (derived from the status queue's), the same tags marking a queue
as this stack's, the same attributes (SQS's defaults on a queue made without any), a send to a node with
no queue is False (no agent there yet); the control plane makes a queue, or sets a queue found otherwise
back to the stack's attributes and tags (`provide_queue`, `repair_queue`), and an agent finds it
(`find_queue`). Messages are kept as the JSON the adapter sends, and parsed when taken.
`tests/unit/adapters/test_memory_store_contract.py` runs the same scenarios on both.

A deleted queue's name is refused for 60 s, as SQS (and moto) refuse it, on the wall clock or `clock`.
Not modelled: visibility timeouts and the DLQ.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prewarm.adapters.sqs import TAG_CLUSTER, TAG_NODE, TAG_PREFIX, QueueError, QueueRetryableError, name_refused
from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped, split_scoped
from prewarm.domain.messages import (
    ClusterProbe,
    NodeBound,
    PullTask,
    RequiredImages,
    cluster_queue_prefix,
    is_cluster_queue,
    node_queue_name,
    parse_node_message,
)
from prewarm.domain.node_queues import ProvidedQueue, attribute_drift, queue_attributes, queue_tags, tags_differ
from prewarm.domain.registry_budget import MAX_SEND_DELAY_SECONDS

# SQS's largest message body (moto's too): 1 MiB.
MAX_MESSAGE_BYTES = 1_048_576
ACCOUNT_URL = "https://sqs.us-west-2.amazonaws.com/123456789012"
# SQS refuses the name of a queue deleted less than 60 s ago (CreateQueue, QueueDeletedRecently).
NAME_REUSE_SECONDS = 60.0
# What GetQueueAttributes answers for a queue created without attributes (SQS API Reference, CreateQueue).
SQS_DEFAULTS = {"VisibilityTimeout": "30", "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
                "DelaySeconds": "0", "SqsManagedSseEnabled": "true"}

log = logging.getLogger(__name__)


@dataclass
class MemoryQueue:
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    bodies: list[str] = field(default_factory=list)
    # Messages sent with a delay: (when they become visible, on the queue's clock, body).
    delayed: list[tuple[float, str]] = field(default_factory=list)
    attributes: dict[str, str] = field(default_factory=lambda: dict(SQS_DEFAULTS))


class QueueDeletedRecentlyError(Exception):
    """CreateQueue of a name whose queue was deleted less than 60 s ago."""


class QueueExistsError(Exception):
    """CreateQueue of an existing queue's name with other attributes (QueueAlreadyExists)."""


class MemorySqs:
    """The queues of one account and region, by URL (`<base_url>/<name>`)."""

    def __init__(self, base_url: str = ACCOUNT_URL, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url
        self.queues: dict[str, MemoryQueue] = {}
        self.clock = clock
        self._deleted: dict[str, float] = {}
        self._lock = threading.Lock()  # the services send from several threads at once

    def url_of(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def create_queue(self, name: str, tags: dict[str, str] | None = None,
                     attributes: dict[str, str] | None = None) -> str:
        """CreateQueue: the queue's URL; an existing queue is kept as it is, tags and all, and refused when
        `attributes` differ from its own."""
        with self._lock:
            if name not in self.queues and self.clock() - self._deleted.get(name, -NAME_REUSE_SECONDS) < (
                    NAME_REUSE_SECONDS):
                raise QueueDeletedRecentlyError(name)
            existing = self.queues.get(name)
            if existing is None:
                self.queues[name] = MemoryQueue(name, dict(tags or {}), attributes={**SQS_DEFAULTS,
                                                                                   **(attributes or {})})
            elif any(existing.attributes.get(k) != v for k, v in (attributes or {}).items()):
                raise QueueExistsError(name)
        return self.url_of(name)

    def queue(self, url: str) -> MemoryQueue | None:
        base, _, name = url.rpartition("/")
        return self.queues.get(name) if base == self.base_url else None

    def delete_queue(self, url: str) -> bool:
        """DeleteQueue; False when there was no such queue."""
        with self._lock:
            queue = self.queue(url)
            if queue is None:
                return False
            del self.queues[queue.name]
            self._deleted[queue.name] = self.clock()
            return True

    def send(self, url: str, body: str, delay_seconds: int = 0) -> bool:
        with self._lock:
            queue = self.queue(url)
            if queue is None:
                return False
            if delay_seconds:
                queue.delayed.append((self.clock() + delay_seconds, body))
            else:
                queue.bodies.append(body)
            return True

    def take(self, url: str) -> list[NodeBound]:
        """Takes every message off a queue, parsed (none when the queue does not exist)."""
        with self._lock:
            queue = self.queue(url)
            if queue is None:
                return []
            now = self.clock()
            queue.bodies += [body for at, body in queue.delayed if at <= now]
            queue.delayed = [(at, body) for at, body in queue.delayed if at > now]
            bodies, queue.bodies = queue.bodies, []
        return [parse_node_message(body) for body in bodies]


class MemoryTaskQueues:
    """`TaskQueues` in memory: one queue per node named `<prefix>-<node>`, as `NodeQueues` names them."""

    def __init__(self, prefix: str, status_queue_url: str, *, dlq_arn: str = "", sqs: MemorySqs | None = None,
                 cluster: str = DEFAULT_CLUSTER, visibility_seconds: int = 120,
                 sender_arns: Sequence[str] = ()) -> None:
        if not status_queue_url:
            raise QueueError("the status queue URL is needed to derive node queue URLs (STATUS_QUEUE_URL)")
        self.prefix = prefix
        self.base_url = status_queue_url.rsplit("/", 1)[0]
        self.dlq_arn = dlq_arn
        self.visibility_seconds = visibility_seconds
        self.sender_arns = list(sender_arns)
        self.sqs = sqs if sqs is not None else MemorySqs(self.base_url)
        #: The cluster whose node queues `ensure_queue` makes (an agent's); sends find theirs per message.
        self.cluster = cluster

    def for_cluster(self, cluster: str) -> MemoryTaskQueues:
        """The same queues as an agent of `cluster` makes them (`NodeQueues(..., cluster=cluster)`)."""
        return MemoryTaskQueues(self.prefix, f"{self.base_url}/status", dlq_arn=self.dlq_arn, sqs=self.sqs,
                                cluster=cluster, visibility_seconds=self.visibility_seconds,
                                sender_arns=self.sender_arns)

    def queue_name(self, node: str, cluster: str | None = None) -> str:
        return node_queue_name(self.prefix, node, self.cluster if cluster is None else cluster)

    def queue_url(self, node: str, cluster: str | None = None) -> str:
        return f"{self.base_url}/{self.queue_name(node, cluster)}"

    def _tags(self, node: str, cluster: str | None = None) -> dict[str, str]:
        return queue_tags(self.prefix, node, self.cluster if cluster is None else cluster)

    def _attributes(self) -> dict[str, str]:
        return queue_attributes(visibility_seconds=self.visibility_seconds, dlq_arn=self.dlq_arn,
                                sender_arns=self.sender_arns)

    def owns_queue(self, url: str) -> bool:
        return self.queue_node(url) is not None

    def queue_node(self, url: str) -> str | None:
        queue = self.sqs.queue(url)
        if queue is None or queue.tags.get(TAG_PREFIX) != self.prefix:
            return None
        return scoped(str(queue.tags.get(TAG_CLUSTER, "")), str(queue.tags.get(TAG_NODE, "")))

    def provide_queue(self, node: str, cluster: str | None = None) -> ProvidedQueue:
        name = self.queue_name(node, cluster)
        url = self.find_queue(node, cluster)
        if url is None:
            try:
                return ProvidedQueue(self.sqs.create_queue(name, self._tags(node, cluster), self._attributes()),
                                     created=True)
            except QueueDeletedRecentlyError:
                raise name_refused(name, node) from None
            except QueueExistsError:
                url = self.queue_url(node, cluster)
        return ProvidedQueue(url, repaired=self._repair(url, self._tags(node, cluster)))

    def ensure_queue(self, node: str, cluster: str | None = None) -> str:
        return self.provide_queue(node, cluster).url

    def find_queue(self, node: str, cluster: str | None = None) -> str | None:
        url = self.queue_url(node, cluster)
        return url if self.sqs.queue(url) is not None else None

    def repair_queue(self, url: str) -> tuple[str, ...] | None:
        tagged = self.queue_node(url)
        if tagged is None:
            return None
        cluster, node = split_scoped(tagged)
        return self._repair(url, self._tags(node, cluster) if node else None)

    def _repair(self, url: str, tags: dict[str, str] | None) -> tuple[str, ...]:
        queue = self.sqs.queue(url)
        if queue is None:
            raise QueueError(f"set {url} back to the stack's attributes: AWS.SimpleQueueService.NonExistentQueue")
        repaired: list[str] = []
        if tags is not None and tags_differ(queue.tags, tags):
            queue.tags.update(tags)
            repaired.append("tags")
        drift = attribute_drift(queue.attributes, self._attributes())
        for name, value in drift.items():
            if value:
                queue.attributes[name] = value
            else:
                queue.attributes.pop(name, None)
        return (*repaired, *sorted(drift))

    def send(self, message: NodeBound) -> bool:
        cluster = message.cluster
        body = message.model_dump_json()
        if len(body.encode()) > MAX_MESSAGE_BYTES:
            raise QueueError(f"send {message.kind} to {message.node}: InvalidParameterValue: One or more parameters "
                             f"are invalid. Reason: Message must be shorter than {MAX_MESSAGE_BYTES} bytes.")
        delay = message.delay_seconds if isinstance(message, PullTask) else 0
        if not self.sqs.send(self.queue_url(message.node, cluster), body, delay):
            log.info("%s for node %s waits for its agent: the node has no task queue yet", message.kind,
                     message.node)
            return False
        return True

    def send_many(self, messages: Sequence[NodeBound]) -> list[tuple[str, str]]:
        return [r for r in map(self._send_or_fail, messages) if r is not None]

    def _send_or_fail(self, message: NodeBound) -> tuple[str, str] | None:
        try:
            self.send(message)
        except QueueError as e:
            what = message.kind if isinstance(message, RequiredImages) else f"{message.kind} of {message.job}"
            log.warning("%s for node %s not sent: %s", what, message.node, e)
            return (message.node, str(e))
        return None

    def list_node_queues(self, cluster: str = DEFAULT_CLUSTER) -> dict[str, str]:
        head = cluster_queue_prefix(self.prefix, cluster)
        return {name: self.sqs.url_of(name) for name in sorted(self.sqs.queues)
                if name.startswith(head) and is_cluster_queue(self.prefix, name, cluster)}

    def delete_queue(self, url: str) -> None:
        self.sqs.delete_queue(url)


class MemoryProbeQueue:
    """`ClusterProbes` in memory, as `ProbeQueue`: the probes sent, with their delays (`refuse`: each send fails
    as SQS's throttling)."""

    def __init__(self) -> None:
        self.probes: list[tuple[ClusterProbe, int]] = []
        self.refuse = False

    def send_probe(self, probe: ClusterProbe, *, delay: int) -> None:
        if self.refuse:
            raise QueueRetryableError(f"send the probe of cluster {probe.cluster or '(own)'}: throttled")
        if not 0 <= delay <= MAX_SEND_DELAY_SECONDS:
            raise QueueError(f"DelaySeconds {delay} is not between 0 and {MAX_SEND_DELAY_SECONDS}")
        self.probes.append((probe, delay))


class MemoryStatusQueue:
    """`Redelivery` in memory: when each message handed back (by receipt handle) comes again, ten a call
    as `StatusQueue` changes them; a handle the queue does not know keeps the queue's timeout, logged."""

    def __init__(self, receipts: Sequence[str] = ()) -> None:
        self.known = set(receipts)
        self.hidden: dict[str, int] = {}
        self.calls = 0

    def deliver_again_after(self, delays: Sequence[tuple[str, int]]) -> None:
        for start in range(0, len(delays), 10):
            self.calls += 1
            for receipt, seconds in delays[start : start + 10]:
                if receipt not in self.known:
                    log.warning("a returned message keeps the queue's visibility timeout: ReceiptHandleIsInvalid")
                    continue
                self.hidden[receipt] = seconds
