"""Applying agent reports and hellos (the `record_status` function's use cases).

A batch of reports is applied job by job: the job item is read once, the reported nodes' items are
read together, the pure counting rules (`prewarm.domain.status`) decide what each report does, and:
- progress within Pulling writes only its node item, up to `WRITERS` nodes at once;
- phase changes are written in transactions of up to 99 node items plus one counter update of the
  job item, so the job item is written once per batch, not once per report;
- every freed slot of the job is refilled once, after the batch.
Each node item write is guarded by the version it was read at, so redeliveries, duplicates and
reordered reports end in exact counters; a conflict re-reads and decides again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import Hello, NodePhase, RequiredImages, StatusReport
from prewarm.domain.nodes import NodeBoot, RegisteredNode
from prewarm.domain.retry import Backoff
from prewarm.domain.status import NodeChange, NodeTaskRecord, NodeUpdate, applied, merged, precedence, report_change
from prewarm.services.boot import judge_boots, record_boots
from prewarm.services.dispatch import add_nodes_to_job, fill_slots, finish_if_done, resend_to_nodes
from prewarm.services.eta import keep_first_estimate
from prewarm.services.lifecycle import unpin_late_pulls
from prewarm.services.node_facts import sets_node_facts
from prewarm.services.node_queues import provide_queues
from prewarm.services.ports import (
    AgentItems,
    Cluster,
    ClusterError,
    NodeQueueError,
    NodeWarmWrites,
    StoreConflictError,
    StoreError,
    StoreRetryableError,
    TaskQueues,
    TaskSendError,
)
from prewarm.services.warming import agent_view, jobs_selecting

log = logging.getLogger(__name__)

# TransactWriteItems takes 100 actions (DynamoDB quotas): 99 node items and the job item.
NODES_PER_TRANSACTION = 99
_ATTEMPTS = 6
# Between attempts of a batch refused by throttling or another writer's transaction: full jitter (AWS Architecture
# Blog, "Exponential Backoff And Jitter"), so invocations that met on one job item do not come back together.
REFUSED_BATCH_BACKOFF = Backoff(0.05, 1.0, jitter=True)
# Writes of one batch that touch different items run this many at a time: one after another, 100
# progress writes of a few milliseconds each held a batch for half a second (benchmarks/capacity.py).
WRITERS = 16

_T = TypeVar("_T")
_R = TypeVar("_R")


def concurrently(call: Callable[[_T], _R], items: Sequence[_T]) -> list[_R | StoreError]:
    """`call` on each item, up to `WRITERS` at once: per item, in order, its result or the store's
    conflict or retryable error. Any other error is raised, as a crash of the invocation would be."""

    def one(item: _T) -> _R | StoreError:
        try:
            return call(item)
        except (StoreConflictError, StoreRetryableError) as e:
            return e

    if len(items) <= 1:
        return [one(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(WRITERS, len(items))) as pool:
        return list(pool.map(one, items))


@dataclass
class ReportOutcome:
    applied: bool
    reason: str
    finished_job: bool = False
    phase: NodePhase | None = None
    seconds: float | None = None
    # Not applied for a reason that may pass: the message goes back to the queue to be delivered again.
    retry: bool = False
    throttled: bool = False
    # It changed the node's phase, or is the first of its pull (not progress within Pulling), in a job the
    # node's warm-up facts are judged from: they are judged again (`services.node_facts`). Another job's
    # report changes none of them.
    moved: bool = False


@dataclass
class BatchOutcome:
    """One outcome per report, in the order given; `retry` lists the indexes to deliver again."""

    outcomes: list[ReportOutcome]
    job_writes: int = 0
    node_writes: int = 0

    @property
    def retry(self) -> list[int]:
        return [i for i, o in enumerate(self.outcomes) if o.retry]


def record_report(store: AgentItems, queues: TaskQueues, report: StatusReport, *, now: float) -> ReportOutcome:
    """Applies one report (a batch of one); a report that keeps conflicting raises `StoreConflictError`."""
    outcome = record_reports(store, queues, [report], now=now).outcomes[0]
    if outcome.retry:
        error = StoreRetryableError if outcome.throttled else StoreConflictError
        raise error(f"node {report.node} of job {report.job}: {outcome.reason}; retried later")
    return outcome


def record_reports(
    store: AgentItems,
    queues: TaskQueues,
    reports: Sequence[StatusReport],
    *,
    now: float,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> BatchOutcome:
    """Applies a batch of reports exactly once each. Duplicates, stale rounds and backwards moves change nothing.
    A job's reports refused for now are tried again after `sleep`ing a draw of `rng` (`REFUSED_BATCH_BACKOFF`)."""
    result = BatchOutcome([ReportOutcome(False, "not processed") for _ in reports])
    backoff = REFUSED_BATCH_BACKOFF if rng is None else replace(REFUSED_BATCH_BACKOFF, rng=rng)
    by_job: dict[str, list[int]] = {}
    for i, report in enumerate(reports):
        by_job.setdefault(report.job, []).append(i)
    for key, indexes in by_job.items():
        _JobBatch(store, queues, key, reports, indexes, result, now=now, sleep=sleep, backoff=backoff).run()
    return result


class _JobBatch:
    """The reports of one job in one batch."""

    def __init__(
        self,
        store: AgentItems,
        queues: TaskQueues,
        key: str,
        reports: Sequence[StatusReport],
        indexes: list[int],
        result: BatchOutcome,
        *,
        now: float,
        sleep: Callable[[float], None],
        backoff: Backoff,
    ) -> None:
        self.store, self.queues, self.key, self.now, self.sleep, self.backoff = store, queues, key, now, sleep, backoff
        self.reports, self.result = reports, result
        self.indexes = list(indexes)
        self.pending = list(indexes)
        self.freed = False  # a node finished: refill slots and see whether the job is done
        self.redelivered_final = False
        self.record: StoredJob | None = None
        self.first: set[int] = set()  # reports that are their node's first of the round (a pull has begun)

    def run(self) -> None:
        refusals = 0
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                self._attempt()
            except StoreRetryableError as e:
                # Throttling or a transaction conflict with another writer: back off, try what is left.
                log.info("job %s: %s; retrying %d reports", self.key, e, len(self.pending))
                for i in self.pending:
                    self.result.outcomes[i] = ReportOutcome(False, str(e), retry=True, throttled=True)
                refusals += 1
                if attempt < _ATTEMPTS:
                    self.sleep(self.backoff.delay(refusals))
                continue
            if not self.pending:
                break
        else:
            for i in self.pending:
                if not self.result.outcomes[i].throttled:
                    self.result.outcomes[i] = ReportOutcome(
                        False, f"node {self.reports[i].node} kept changing", retry=True
                    )
        self._first_estimate()
        self._unpin_late_pulls()
        if self.freed or self.redelivered_final:
            # Once per job per batch, and also when a redelivery finds the work written by a run that
            # crashed before refilling: finish what that run started.
            try:
                fill_slots(self.store, self.queues, self.key, now=self.now)
                finished = finish_if_done(self.store, self.key, now=self.now)
            except StoreRetryableError as e:
                self._finish_later(e)
                return
            if finished:
                # Credited to one final report of this job (another job's reports share the batch).
                for i in self.indexes:
                    o = self.result.outcomes[i]
                    if o.applied and o.phase is not None and o.phase.is_terminal:
                        o.finished_job = True
                        break

    def _first_estimate(self) -> None:
        """At the round's first byte progress, its ETA is kept for `describe` to set against the outcome."""
        record = self.record
        if record is None or record.first_estimate or not any(
                self.result.outcomes[i].applied and self.reports[i].bytes_done for i in self.indexes):
            return
        try:
            keep_first_estimate(self.store, record, now=self.now)
        except StoreError as e:  # only `describe`'s estimate at start is missed
            log.warning("job %s: first estimate not kept: %s", self.key, e)

    def _unpin_late_pulls(self) -> None:
        """Nodes whose pull ended pinned after the job's pin was dropped are told to unpin (a failure is
        logged: the job's end unpins them again)."""
        record = self.record
        if record is None or record.pinned_until is None:
            return
        nodes = {self.reports[i].node for i in self.indexes
                 if self.result.outcomes[i].applied and self.result.outcomes[i].phase is NodePhase.SUCCEEDED}
        try:
            unpin_late_pulls(self.store, self.queues, record, nodes)
        except (StoreError, TaskSendError) as e:
            log.warning("job %s: nodes that pinned after the pin was dropped not told to unpin yet: %s", self.key, e)

    def _finish_later(self, refusal: StoreRetryableError) -> None:
        """The refill or the completion was refused for now: the job's final reports go back to the queue,
        and delivered again they find their nodes final and do what is left (`redelivered_final`); the
        rest of the batch stands."""
        log.info(
            "job %s: slots not refilled or job not finished yet: %s; its final reports come again", self.key, refusal
        )
        for i in self.indexes:
            if self.reports[i].phase.is_terminal:
                o = self.result.outcomes[i]
                o.retry, o.throttled, o.reason = True, True, f"{o.reason}; refill or completion refused: {refusal}"

    def _attempt(self) -> None:
        record = self.record = self.store.get_job(self.key)
        live = [i for i in self.pending if self._belongs(record, i)]
        self.pending = live
        if not live or record is None:
            return
        ref = record.ref
        tasks = self.store.get_tasks_of(ref, {self.reports[i].node for i in live})
        by_node: dict[str, list[int]] = {}
        for i in live:
            node = self.reports[i].node
            task = tasks.get(node)
            if task is None or task.round != self.reports[i].round:
                self.result.outcomes[i] = ReportOutcome(False, "node is not part of this round")
                continue
            by_node.setdefault(node, []).append(i)
        self.pending = [i for ids in by_node.values() for i in ids]
        counted: list[tuple[NodeUpdate, NodeChange, list[int]]] = []
        progress: list[tuple[NodeUpdate, NodeChange, list[int]]] = []
        for node, ids in by_node.items():
            update = self._decide(tasks[node], sorted(ids, key=lambda i: precedence(self.reports[i])))
            if update is None:
                continue
            change, accepted = update
            write = NodeUpdate(node, tasks[node].version, change.fields)
            (counted if change.counts else progress).append((write, change, accepted))
        refused: StoreRetryableError | None = None
        writes = concurrently(lambda w: self.store.update_task(ref, w), [w for w, _, _ in progress])
        for (_, change, accepted), error in zip(progress, writes, strict=True):
            if isinstance(error, StoreRetryableError):
                refused = refused or error
                continue
            if isinstance(error, StoreError):
                continue  # another writer changed this node: decided again on the next attempt
            self.result.node_writes += 1
            self._done(change, accepted)
        if refused is not None:
            raise refused
        for start in range(0, len(counted), NODES_PER_TRANSACTION):
            chunk = counted[start : start + NODES_PER_TRANSACTION]
            deltas: dict[str, int] = {}
            for _, change, _ in chunk:
                for name, delta in change.deltas.items():
                    deltas[name] = deltas.get(name, 0) + delta
            try:
                self.store.apply_updates(ref, [w for w, _, _ in chunk], deltas)
            except StoreConflictError:
                continue  # one of these nodes, or the job's round, changed: the chunk is decided again
            self.result.node_writes += len(chunk)
            self.result.job_writes += 1
            for _, change, accepted in chunk:
                self._done(change, accepted)

    def _belongs(self, record: StoredJob | None, i: int) -> bool:
        report = self.reports[i]
        if record is None or record.uid != report.job_uid:
            self.result.outcomes[i] = ReportOutcome(False, "job no longer exists")
        elif record.round != report.round:
            self.result.outcomes[i] = ReportOutcome(
                False, f"report of round {report.round}, job is in round {record.round}"
            )
        elif record.state != JobState.RUNNING:
            self.result.outcomes[i] = ReportOutcome(False, f"job is {record.state}")
        else:
            return True
        return False

    def _decide(self, task: NodeTaskRecord, ids: list[int]) -> tuple[NodeChange, list[int]] | None:
        """Folds one node's reports (in precedence order) into one change, or None when none counts."""
        changes: list[NodeChange] = []
        accepted: list[int] = []
        current = task
        for i in ids:
            report = self.reports[i]
            change = report_change(current, report, now=self.now)
            if change is None:
                self.result.outcomes[i] = ReportOutcome(
                    False, f"{current.phase.value} -> {report.phase.value} is stale or a duplicate"
                )
                if current.phase.is_terminal and current is task:
                    self.redelivered_final = True
                continue
            changes.append(change)
            accepted.append(i)
            current = applied(current, change)
        self.pending = [i for i in self.pending if i not in ids or i in accepted]
        if not changes:
            return None
        if task.seq == 0:
            self.first.update(accepted)
        return merged(changes), accepted

    def _done(self, change: NodeChange, accepted: list[int]) -> None:
        facts = self.record is not None and sets_node_facts(self.record)
        for i in accepted:
            report = self.reports[i]
            self.result.outcomes[i] = ReportOutcome(True, "applied", phase=report.phase,
                                                    moved=facts and (change.counts or i in self.first))
        if change.finished:
            self.freed = True
            # The metric of the pull's duration goes with the report that finished it.
            last = next(i for i in reversed(accepted) if self.reports[i].phase.is_terminal)
            self.result.outcomes[last].seconds = change.seconds
        done = set(accepted)
        self.pending = [i for i in self.pending if i not in done]


@dataclass
class HelloOutcome:
    node: str
    added_to: list[str] = field(default_factory=list)
    # Tasks dispatched to the node before its agent's queue existed, sent now.
    resent: int = 0
    # What a warming node was told it must have (None: the node does not hold the startup taint).
    required: list[str] | None = None
    # Why the node was registered unverified: its cluster could not be read (empty: it was read).
    unverified: str = ""
    boot: NodeBoot | None = None  # its first hello's images at boot (None: not its first)


def register_node(
    store: AgentItems,
    queues: TaskQueues,
    cluster: Cluster | None,
    hello: Hello,
    *,
    now: float,
    clock: Callable[[], float] = time.time,
) -> HelloOutcome:
    """One hello (`register_nodes` of one): raises what made it fail. `cluster` is the API of the hello's
    cluster."""
    outcome = register_nodes(store, queues, cluster, [hello], now=now, clock=clock)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


# What sends a hello back to the queue: the store's conflicts and retryable errors, a failed send.
HelloError = StoreError | TaskSendError | NodeQueueError


def register_nodes(
    store: AgentItems,
    queues: TaskQueues,
    cluster: Cluster | None,
    hellos: Sequence[Hello],
    *,
    now: float,
    clock: Callable[[], float] = time.time,
    writes: NodeWarmWrites | None = None,
) -> list[HelloOutcome | HelloError]:
    """Registers agents' nodes and adds each at once to every running `Never` job that selects it; per
    hello, in order, its outcome or the error that sends it back to the queue.

    A batch's hellos share their reads and writes: the running `Never` jobs are read once (through the
    store's index of them, not every job stored), each job gets its new nodes in one transaction and its
    free slots filled once, and independent calls run up to `WRITERS` at once. A node that holds the
    startup taint (`warm_until`) is then sent the images of those jobs. Given `writes` (the cluster's API),
    a node's first hello is judged on its Node before the joins, while its queue is made
    (`services.boot.judge_boots`).

    The hellos are of one cluster, whose API `cluster` is: its nodes are registered, and joined to its
    running jobs, under its name (node names repeat across clusters). A node whose cluster cannot be read
    is registered from its hello all the same, `unverified`, and joined to the jobs its labels select.
    """
    in_cluster = {h.cluster for h in hellos}
    if len(in_cluster) > 1:
        raise ValueError(f"hellos of several clusters in one registration: {sorted(in_cluster)}")
    name = in_cluster.pop() if in_cluster else DEFAULT_CLUSTER
    by_node: dict[str, list[int]] = {}
    for i, hello in enumerate(hellos):
        by_node.setdefault(hello.node, []).append(i)
    failed: dict[str, HelloError] = {}

    first: set[str] = set()
    prior: dict[str, RegisteredNode | None] = {}  # each node's registration before its hello
    # Nodes whose cluster could not be read (their Node, or the pods a job selects by): registered from the
    # agent's own facts, without the jobs that select by pods; the sweep checks them again
    # (`services.verifying`).
    unverified: dict[str, str] = {}
    verified: set[str] = set()  # shown by the cluster's API: only these get a queue

    def put(node: str) -> None:
        for i in by_node[node]:  # one node's hellos in the order given: the last one stands
            h = hellos[i]
            store.put_node(
                RegisteredNode(
                    name=h.node,
                    labels=dict(h.labels),
                    architecture=h.architecture,
                    os=h.os,
                    queue_url=h.queue_url,
                    last_hello=now,
                    warm_until=h.warm_until,
                    agent_version=h.agent_version,
                    cluster=name,
                    unverified=node in unverified,
                    mirror_config=h.mirror_config,
                )
            )

    def register(node: str) -> dict[str, Any]:
        # A node's first hello (or its first since the sweep forgot it) may find tasks dispatched before
        # its queue was made; a known node's queue has held its messages all along (unless just made).
        prior[node] = store.get_node(node, name)
        if prior[node] is None:
            first.add(node)
        try:
            seen = cluster.get_node(node) if cluster is not None else None
        except ClusterError as e:
            log.warning("hello of %s registered unverified: %s", scoped(name, node), e)
            seen = None
            unverified[node] = str(e)
        put(node)
        if seen is not None:
            verified.add(node)
        # No cluster access (or not visible yet): the agent's own view of its node stands in.
        return seen or agent_view(hellos[by_node[node][-1]])

    objects: dict[str, dict[str, Any]] = {}
    for node, seen in zip(by_node, concurrently(register, list(by_node)), strict=True):
        if isinstance(seen, StoreError):
            failed[node] = seen
        else:
            objects[node] = seen
    # Only the control plane makes a node's queue, for a node its cluster shows; a queue just made or set
    # back may have missed messages, as on a first hello (services/node_queues.py). Made meanwhile: the
    # release of a warm node's taint below waits on no queue.
    with ThreadPoolExecutor(1, thread_name_prefix="queues") as making:
        made = making.submit(provide_queues, queues, sorted(verified & objects.keys()), name)
        # Read after the nodes are registered (a plan that missed them saw these jobs) and before the jobs
        # are read: a list computed from older jobs never replaces a newer one.
        as_of = clock()
        try:
            running = store.list_running_jobs(name) if objects else []
        except (StoreConflictError, StoreRetryableError) as e:
            running, failed = [], {**failed, **dict.fromkeys(objects, e)}
            objects = {}
        records = [r for r in running if r.is_running_never]
        pods_unread: dict[str, str] = {}
        selected = {
            node: jobs_selecting(records, None if node in unverified else cluster, obj, pods_unread=pods_unread)
            for node, obj in objects.items()
        }
        for node, why in sorted(pods_unread.items()):
            unverified[node] = why
            try:
                put(node)
            except StoreError as e:
                failed[node] = e
        # Before the joins: a node with every required image at boot loses its taint without waiting for them.
        boots, refused = record_boots(
            store,
            {n: (prior[n], hellos[by_node[n][-1]], selected[n][1]) for n in selected if n not in failed},
            cluster=name,
            now=now,
        )
        failed.update(refused)
        judge_boots(
            writes,
            {
                n: (hellos[by_node[n][-1]], boots[n], objects[n] if n in verified else None)
                for n in boots
                if n not in unverified
            },
            now=now,
            each=concurrently,
        )
        changed, queue_failures = made.result()
    first |= changed
    failed.update(queue_failures)
    resent: dict[str, int] = {}
    # First hellos' node items, per dispatching job: read once, for the resends and for the joins.
    first_tasks: dict[str, dict[str, NodeTaskRecord]] = {}
    new: list[str] = []
    try:
        if new := sorted(first & objects.keys()):
            first_tasks = {r.key: store.get_tasks_of(r.ref, new) for r in running if r.is_dispatching}
            resent, send_failures = resend_to_nodes(queues, running, first_tasks)
            for node, error in send_failures:
                failed[node] = TaskSendError([(node, error)])
    except (StoreConflictError, StoreRetryableError) as e:
        failed.update(dict.fromkeys(objects, e))
        objects, selected = {}, {}
    joining: dict[str, list[str]] = {}
    for node, (jobs, _) in selected.items():
        for record in jobs:
            joining.setdefault(record.key, []).append(node)
    by_key: dict[str, StoredJob] = {r.key: r for r in records}
    read_first = set(new)
    added: dict[str, list[str]] = {}

    def join(key: str) -> list[str]:
        # Every running `Never` job is dispatching: its first hellos' items were read above.
        unread = [n for n in joining[key] if n not in read_first]
        present = {**first_tasks.get(key, {}), **(store.get_tasks_of(by_key[key].ref, unread) if unread else {})}
        nodes = add_nodes_to_job(store, by_key[key], joining[key], now=now, present=present)
        if nodes:
            fill_slots(store, queues, key, now=now)
        return nodes

    for key, result in zip(joining, concurrently(join, list(joining)), strict=True):
        if isinstance(result, StoreError):
            failed.update(dict.fromkeys(joining[key], result))
            continue
        for node in result:
            added.setdefault(node, []).append(key)
    warming = [n for n in selected if n not in failed and (w := hellos[by_node[n][-1]].warm_until) and w > now]
    sends = [RequiredImages(node=n, as_of=as_of, images=selected[n][1], cluster=name) for n in warming]
    for node, error in queues.send_many(sends) if sends else []:
        failed[node] = TaskSendError([(node, error)])
    outcomes: list[HelloOutcome | HelloError] = []
    for hello in hellos:
        if hello.node in failed:
            outcomes.append(failed[hello.node])
            continue
        required = [i.image for i in selected[hello.node][1]] if hello.node in warming else None
        outcomes.append(
            HelloOutcome(
                hello.node,
                sorted(added.get(hello.node, [])),
                resent.get(hello.node, 0),
                required,
                unverified.get(hello.node, ""),
                boots.get(hello.node),
            )
        )
    return outcomes
