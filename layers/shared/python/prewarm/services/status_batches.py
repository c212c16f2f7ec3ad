"""A batch of the status queue as the `record_status` function receives it: reports, hellos, warm-ups and
gone images, each cluster's messages apart from the others', and what comes again told when."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.keys import JobKey
from prewarm.domain.messages import (
    ClusterProbe,
    Footprint,
    Hello,
    ImageGone,
    StatusMessage,
    StatusReport,
    Warmed,
)
from prewarm.domain.retry import Delivery, redelivery_seconds
from prewarm.services.boot import record_warm
from prewarm.services.clusters import ClusterRun, api_or_none, record_health
from prewarm.services.healing import GoneOutcome, record_gone
from prewarm.services.lifecycle import record_footprint
from prewarm.services.node_facts import judge_nodes
from prewarm.services.ports import (
    ClusterDirectory,
    ClusterError,
    NodeQueueError,
    Redelivery,
    StatusItems,
    StoreConflictError,
    StoreError,
    StoreRetryableError,
    TaskQueues,
    TaskSendError,
)
from prewarm.services.probes import ProbeOutcome, Probing, probe
from prewarm.services.reports import WRITERS, HelloOutcome, ReportOutcome, record_reports, register_nodes

log = logging.getLogger(__name__)


@dataclass
class StatusBatchOutcome:
    """What one batch of the status queue did: the message ids to deliver again, and what counted."""

    retry_ids: list[str] = field(default_factory=list)
    reports: list[tuple[StatusReport, ReportOutcome]] = field(default_factory=list)
    hellos: list[HelloOutcome] = field(default_factory=list)
    warmed: list[str] = field(default_factory=list)
    gone: list[GoneOutcome] = field(default_factory=list)
    # Nodes whose footprint this batch stored.
    footprints: list[str] = field(default_factory=list)
    job_writes: int = 0
    # Hellos and warm-ups naming a cluster the stack does not serve (removed, or an agent's typo): dropped.
    dropped: list[str] = field(default_factory=list)
    probes: list[ProbeOutcome] = field(default_factory=list)

    def add_to(self, other: StatusBatchOutcome) -> None:
        """Adds what one part of a batch did (one cluster's messages, a probe) to the batch's `other`."""
        other.retry_ids += self.retry_ids
        other.hellos += self.hellos
        other.warmed += self.warmed
        other.probes += self.probes


def record_status(
    store: StatusItems,
    queues: TaskQueues,
    clusters: ClusterDirectory,
    messages: Sequence[tuple[str, StatusMessage]],
    *,
    now: float,
    probing: Probing | None = None,
) -> StatusBatchOutcome:
    """A batch of the status queue, keyed by message id: hellos, warm-ups and gone images one by one,
    reports together; the control plane's probes of clusters parked jobs wait for (`services.probes`, given
    `probing`; without, they are handed back). Hellos and warm-ups name their cluster, of `clusters` (those
    the stack serves); a hello is registered without its cluster's API when that cannot be reached (it
    speaks for its node).

    A hello whose cluster cannot be read is registered unverified, and how the cluster failed recorded on its
    item (`prewarm cluster list`). A hello, warm-up or gone image that fails goes back to the queue on its own;
    reports that could not be applied yet (throttling, conflicts that kept coming) are delivered again, and the
    rest of the batch stands.
    """
    outcome = StatusBatchOutcome()
    reports: list[tuple[str, StatusReport]] = []
    by_cluster: dict[str, list[tuple[str, Hello | Warmed]]] = {}  # hellos and warm-ups: they read their cluster
    probes: list[tuple[str, ClusterProbe]] = []
    served: dict[str, bool] = {DEFAULT_CLUSTER: True}
    for message_id, message in messages:
        if isinstance(message, StatusReport):
            reports.append((message_id, message))
        elif isinstance(message, ClusterProbe):
            if probing is None:
                outcome.retry_ids.append(message_id)
            else:
                probes.append((message_id, message))
        elif isinstance(message, Footprint):
            try:
                if record_footprint(store, message):
                    outcome.footprints.append(message.node)
            except (StoreConflictError, StoreRetryableError) as e:
                log.warning("footprint of %s not applied yet: %s", message.node, e)
                outcome.retry_ids.append(message_id)
        elif isinstance(message, ImageGone):
            try:
                outcome.gone.append(record_gone(store, queues, message))
            except (StoreConflictError, StoreRetryableError, TaskSendError) as e:
                log.warning("%s of %s not applied yet: %s", message.kind, message.node, e)
                outcome.retry_ids.append(message_id)
        else:
            if message.cluster not in served:
                served[message.cluster] = clusters.serves(message.cluster)
            if served[message.cluster]:
                by_cluster.setdefault(message.cluster, []).append((message_id, message))
            else:  # its node would be registered, and its queue kept, in a cluster nothing sweeps
                log.warning(
                    "%s of node %s dropped: cluster %s is not registered with this stack",
                    message.kind,
                    message.node,
                    message.cluster,
                )
                outcome.dropped.append(f"{message.cluster}:{message.node}")
    # Each cluster's messages and each probe on a thread of their own and the reports (which read no cluster)
    # meanwhile: an API that hangs holds up its own cluster's hellos, warm-ups and probe only.
    workers = max(1, min(len(by_cluster) + len(probes), WRITERS))
    with ThreadPoolExecutor(workers, thread_name_prefix="cluster") as pool:
        parts = [
            pool.submit(_record_cluster, store, queues, clusters, name, group, now=now)
            for name, group in by_cluster.items()
        ]
        if probing is not None:
            parts += [pool.submit(_probe, store, probing, message_id, message, now=now)
                      for message_id, message in probes]
        batch = record_reports(store, queues, [r for _, r in reports], now=now) if reports else None
        for part in parts:
            part.result().add_to(outcome)
    if batch is not None:
        outcome.job_writes = batch.job_writes
        for (message_id, report), result in zip(reports, batch.outcomes, strict=True):
            outcome.reports.append((report, result))
            if result.retry:
                outcome.retry_ids.append(message_id)
        judge_reported(store, clusters, [r for r, o in outcome.reports if o.moved], now=now)
    return outcome


def judge_reported(store: StatusItems, clusters: ClusterDirectory, moved: Sequence[StatusReport], *,
                   now: float) -> None:
    """After a batch's reports: the nodes whose phases they changed in the jobs those facts are judged from
    (`ReportOutcome.moved`) have their `PrewarmWarm` condition and their rules' node labels judged again
    (`services.node_facts`), per cluster through its API."""
    by_cluster: dict[str, tuple[set[str], set[str]]] = {}
    for report in moved:
        key = JobKey.parse(report.job)
        nodes, jobs = by_cluster.setdefault(key.cluster, (set(), set()))
        nodes.add(report.node)
        jobs.add(key)
    for name, (nodes, jobs) in by_cluster.items():
        try:
            api = api_or_none(clusters, name)
        except ClusterError as e:
            log.info("cluster %s: nodes' warm-up facts not judged now: %s", name, e)
            continue
        if api is not None:
            judge_nodes(store, api, name, nodes, jobs=jobs, now=now)


def _record_cluster(
    store: StatusItems,
    queues: TaskQueues,
    clusters: ClusterDirectory,
    name: str,
    messages: Sequence[tuple[str, Hello | Warmed]],
    *,
    now: float,
) -> StatusBatchOutcome:
    """One cluster's warm-ups, one by one, then its hellos, registered together (`record_status`), through
    the cluster's API built once for them all."""
    outcome = StatusBatchOutcome()
    try:
        api = api_or_none(clusters, name)
    except ClusterError as e:  # its API not even built: this cluster's messages alone come again
        log.warning("cluster %s: %d messages not applied yet: %s", name, len(messages), e)
        outcome.retry_ids.extend(message_id for message_id, _ in messages)
        return outcome
    group = [(message_id, m) for message_id, m in messages if isinstance(m, Hello)]
    for message_id, message in messages:
        if isinstance(message, Warmed):
            try:
                record_warm(store, message, api, now=now)
                outcome.warmed.append(message.node)
            except (StoreConflictError, StoreRetryableError, TaskSendError) as e:
                log.warning("%s of %s not applied yet: %s", message.kind, message.node, e)
                outcome.retry_ids.append(message_id)
    if not group:
        return outcome
    registered = register_nodes(store, queues, api, [h for _, h in group], now=now, writes=api)
    if why := next((r.unverified for r in registered if isinstance(r, HelloOutcome) and r.unverified), ""):
        try:
            record_health(store, clusters, [ClusterRun(name, now, error=why)])
        except StoreError as e:  # the sweep records it within a minute all the same
            log.info("how cluster %s failed is not recorded now: %s", name, e)
    for (message_id, hello), registration in zip(group, registered, strict=True):
        if isinstance(registration, HelloOutcome):
            outcome.hellos.append(registration)
        else:
            log.warning("hello of %s not applied yet: %s", hello.node, registration)
            outcome.retry_ids.append(message_id)
    return outcome


def _probe(store: StatusItems, probing: Probing, message_id: str, message: ClusterProbe, *,
           now: float) -> StatusBatchOutcome:
    """One probe; handed back when the table or the queue refused it (its chain waits for it)."""
    outcome = StatusBatchOutcome()
    try:
        outcome.probes.append(probe(store, probing, message, now=now))
    except (StoreError, NodeQueueError) as e:
        log.warning("probe of cluster %s not applied yet: %s", message.cluster or "(own)", e)
        outcome.retry_ids.append(message_id)
    return outcome


def record_status_batch(
    store: StatusItems,
    queues: TaskQueues,
    clusters: ClusterDirectory,
    redelivery: Callable[[], Redelivery],
    messages: Sequence[tuple[str, StatusMessage]],
    *,
    now: float,
    deliveries: Sequence[Delivery] = (),
    poison_ids: Sequence[str] = (),
    probing: Probing | None = None,
) -> StatusBatchOutcome:
    """A batch as the status function receives it: `record_status`, then the messages handed back (those
    to retry, the `poison_ids` that did not parse) told when they come again, through the queue
    `redelivery()` gives (asked for only then)."""
    outcome = record_status(store, queues, clusters, messages, now=now, probing=probing)
    if outcome.retry_ids or poison_ids:
        deliver_again(redelivery(), deliveries, retry_ids=outcome.retry_ids, poison_ids=poison_ids)
    return outcome


def deliver_again(
    queue: Redelivery, deliveries: Sequence[Delivery], *, retry_ids: Sequence[str], poison_ids: Sequence[str] = ()
) -> list[tuple[str, int]]:
    """Tells the status queue when the messages the batch hands back come again (`redelivery_seconds`, by
    each one's receive count); returns (message id, seconds) for each."""
    poison, retry = set(poison_ids), set(retry_ids)
    delays = [
        (d, redelivery_seconds(d.receive_count, poison=d.message_id in poison))
        for d in deliveries
        if d.message_id in poison or d.message_id in retry
    ]
    if delays:
        queue.deliver_again_after([(d.receipt_handle, seconds) for d, seconds in delays])
    return [(d.message_id, seconds) for d, seconds in delays]
