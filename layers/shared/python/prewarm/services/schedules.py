"""The scheduled use cases: the daily re-pull of `Never` jobs, and the every-minute sweep; and the record
of each one's last completed run."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.clusters import scoped
from prewarm.domain.intervals import STARTUP_TAINT_GRACE_SECONDS
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.liveness import AGENT_NOT_REPORTING, AGENT_SILENCE_SECONDS, NO_AGENT_ON_NODE, is_silent
from prewarm.domain.messages import NodePhase
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.schedules import DAILY_ROUND, RECORDED_SCHEDULES, SWEEP, ScheduleRun
from prewarm.domain.status import DEADLINE_EXCEEDED_MESSAGE, NodeUpdate
from prewarm.domain.warming import (
    AGENT_NAME,
    AGENT_NAMESPACE,
    FAIL_OPEN_EVENT_REASON,
    SettledNodes,
    WarmLimits,
    agentless_seconds,
    fail_open_message,
    no_hello_message,
    node_event,
    overdue_seconds,
    past_deadline,
    without_hello,
)
from prewarm.services.budget import UNLIMITED, TimeBudget
from prewarm.services.clusters import on_each_cluster, raise_if_own_unreachable, record_health, unreachable
from prewarm.services.departures import forget_departed_nodes, list_in_order
from prewarm.services.dispatch import fill_slots, finish_if_done, resend_dispatched, retry_refused_write
from prewarm.services.jobs import complete_deletion
from prewarm.services.ports import (
    ClusterApi,
    ClusterAuthError,
    ClusterDirectory,
    ClusterError,
    ClusterInvalidError,
    ClusterNotFoundError,
    ClusterUnavailableError,
    JobItems,
    NodeItems,
    NodeTaints,
    PlanItems,
    PullSecretCleanup,
    ScheduledItems,
    ScheduleRuns,
    StoreConflictError,
    StoreRetryableError,
    SweepItems,
    TaskQueues,
)

log = logging.getLogger(__name__)


SILENT_NODE_MESSAGE = "node has not responded for a long time"


def record_run(runs: ScheduleRuns, schedule: str, *, started_at: float, finished_at: float) -> ScheduleRun:
    """Records that a run of `schedule` completed; called only after it did, so a run that fails (or a
    schedule that stops firing) leaves the last good run standing for `prewarm doctor` to see."""
    if schedule not in RECORDED_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: one of {', '.join(RECORDED_SCHEDULES)}")
    if finished_at < started_at:
        raise ValueError(f"a run cannot finish ({finished_at}) before it started ({started_at})")
    run = ScheduleRun(schedule, started_at=started_at, finished_at=finished_at)
    runs.record_run(run)
    return run


def run_daily_round(store: ScheduledItems, *, scheduled_time: float | None, clock: Callable[[], float]) -> list[str]:
    """The daily schedule's run: `repull_daily`, then the run recorded."""
    started = clock()
    jobs = repull_daily(store, scheduled_time=scheduled_time)
    record_run(store, DAILY_ROUND, started_at=started, finished_at=clock())
    return jobs


def repull_daily(store: JobItems, *, scheduled_time: float | None = None) -> list[str]:
    """Starts a new round of every active `Never` job; the table stream plans it. Returns the jobs.

    `scheduled_time` (the schedule's, the same on every retry of one invocation) makes a retry start no
    second round: a job whose round started at or after it, or is not planned yet, already has its round.
    """
    started: list[str] = []
    refused: list[str] = []
    for record in store.list_jobs():
        if not record.is_never or record.state != JobState.RUNNING:
            continue
        if scheduled_time is not None and (not record.is_planned or (record.start_time or 0) >= scheduled_time):
            continue
        try:
            retry_refused_write(functools.partial(store.set_job_fields, record.key, {"round": record.round + 1},
                                                  condition_state=JobState.RUNNING))
        except StoreConflictError:
            continue  # deleted or finished meanwhile
        except StoreRetryableError as e:
            # The other jobs still get their round; the schedule's retry (same scheduled time) starts this one.
            log.warning("daily round of %s not started yet: %s", record.key, e)
            refused.append(record.key)
            continue
        started.append(record.key)
    if refused:
        raise StoreRetryableError(f"daily round not started yet for {', '.join(refused)} (started for "
                                  f"{', '.join(started) or 'no other job'}); the schedule's retry starts it")
    return started


@dataclass
class SweepResult:
    deadline_failed: list[str] = field(default_factory=list)
    silent_nodes: list[str] = field(default_factory=list)
    agentless_nodes: list[str] = field(default_factory=list)
    resent: int = 0
    slots_filled: int = 0
    expired: list[str] = field(default_factory=list)
    queues_deleted: list[str] = field(default_factory=list)
    nodes_forgotten: list[str] = field(default_factory=list)
    # Listed as gone but found by the read before deletion: kept. Departed nodes left to the next run.
    nodes_returned: list[str] = field(default_factory=list)
    departures_deferred: int = 0
    pull_secrets_deleted: list[str] = field(default_factory=list)
    deletions_completed: list[str] = field(default_factory=list)
    # Nodes whose startup taint no agent removed by its deadline: the sweep removed it.
    taints_released: list[str] = field(default_factory=list)
    # Registered clusters whose API failed this run (name → why): the others were swept all the same.
    unreachable: dict[str, str] = field(default_factory=dict)
    # Per cluster swept: its nodes whose agents said hello ("" for the stack's own).
    agents: dict[str, int] = field(default_factory=dict)
    # Jobs never planned (their cluster could not be read, or their stream record was lost) whose cluster
    # answered this run: asked to plan again.
    replanned: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep is told by the stack's settings: the node queues' prefix, and how long each kind of
    silence is borne (`sweep` says what each means)."""

    prefix: str = "prewarm"
    silence_grace_seconds: int = 300
    resend_after_seconds: int = 300
    agent_silence_seconds: float = AGENT_SILENCE_SECONDS
    no_agent_grace_seconds: float | None = None
    taint_grace_seconds: float = STARTUP_TAINT_GRACE_SECONDS


# Nodes read whole per run for their startup taint (the rest of the sweep reads metadata only). Once read
# without the taint a node is not read again by this process; after a cold start the nodes past their
# deadline are read over a few runs, newest first (the likeliest to hold the taint).
TAINT_READS_PER_RUN = 500

# A deletion the dispatch function has not finished this long after it was asked (its stream record
# lost or failed for good) is finished by the sweep.
DELETION_GRACE_SECONDS = 60


def sweep(
    store: SweepItems,
    queues: TaskQueues,
    clusters: ClusterDirectory,
    *,
    now: float,
    config: SweepSettings = SweepSettings(),
    secrets: PullSecretCleanup | None = None,
    budget: TimeBudget = UNLIMITED,
    settled: SettledNodes | None = None,
) -> SweepResult:
    """Deadlines, silent nodes, lost sends, expired items, queues of departed nodes and, given
    `secrets`, the mirrors of pull secrets no job names any more; and how each cluster answered.

    Silence (`prewarm.domain.liveness`): a `Pulling` node whose agent has not reported for three report
    intervals gets its task sent again (a restarted agent picks it up, a living one ignores the
    duplicate); silent for `config.agent_silence_seconds`, it is failed with `agent not reporting`,
    whatever the job's pull timeout. Given `config.no_agent_grace_seconds`, a node still `Waiting` whose
    agent never said hello is failed with `no agent on node` that long after it was planned or sent its
    task. A node sent its task but never reporting, though its agent said hello (the task may wait for
    one of the agent's pull slots), is failed after the pull timeout plus `config.silence_grace_seconds`.

    A node still holding the startup taint `config.taint_grace_seconds` after its agent's deadline (the
    agents' ConfigMap: `maxWarmSeconds` from the node's join) had no agent to remove it: the sweep
    removes it, with an Event on the node, so a missing agent never keeps pods off a node.

    Departed nodes (`services.departures`) and startup taints are the work the next run can finish:
    it is started only while `budget` has time. `settled` holds, per cluster, the nodes seen without the
    taint past their deadline, kept by the caller across runs so that they are not read again.

    Every cluster of `clusters` is swept side by side (`services.clusters`); the stack's own only when
    its API is configured. A cluster whose API fails is left for the next run (`result.unreachable`, the
    stack's own under "") and does not keep the others from being swept; how each answered is recorded
    on its cluster item.
    """
    result = SweepResult()
    agents: dict[str, set[str]] = {}
    unplanned: list[StoredJob] = []
    for record in store.list_jobs():
        if record.state == JobState.DELETING:
            if (record.deleting_since or 0) <= now - DELETION_GRACE_SECONDS:
                complete_deletion(store, queues, record.key)
                result.deletions_completed.append(record.key)
            continue
        if record.ttl is not None and record.ttl <= now:
            # DynamoDB TTL deletes within days, not at the second: hide and delete it here.
            store.delete_job(record.key)
            result.expired.append(record.key)
            continue
        if record.is_list_job:
            _finish_list_job(store, record, now=now)
            continue
        if record.is_pull_job and record.is_unplanned_for_long(now):
            unplanned.append(record)
        if not record.is_dispatching:
            continue
        job = record.pull_job
        if record.is_past_deadline(now):
            _fail_past_deadline(store, queues, record, now=now)
            result.deadline_failed.append(record.key)
            continue
        unclaimed_limit = job.spec.pull_policy.timeout_seconds + config.silence_grace_seconds
        resend: list[str] = []
        for task in store.get_tasks(record.key, shards=record.ref.shards):
            if task.round != record.round or task.phase.is_terminal:
                continue
            name = f"{record.key}:{task.node}"
            if task.phase is NodePhase.WAITING and config.no_agent_grace_seconds is not None:
                if record.cluster not in agents:
                    agents[record.cluster] = {n.name for n in store.list_nodes(record.cluster)}
                # A paused job (parallelism 0) holds its waiting nodes on purpose.
                held = task.dispatched_at is None and job.spec.parallelism == 0
                if task.node not in agents[record.cluster] and not held:
                    since = task.dispatched_at or task.updated_at or record.start_time or now
                    if now - since > config.no_agent_grace_seconds and _finish_task(
                        store, record, task.node, NodePhase.FAILED, NO_AGENT_ON_NODE, now=now
                    ):
                        result.agentless_nodes.append(name)
                    continue
            if task.dispatched_at is None:
                continue
            if task.phase is NodePhase.PULLING:
                quiet = now - (task.updated_at or task.dispatched_at)
                if quiet > config.agent_silence_seconds:
                    if _finish_task(store, record, task.node, NodePhase.FAILED, AGENT_NOT_REPORTING, now=now):
                        result.silent_nodes.append(name)
                elif is_silent(task, now=now):
                    resend.append(task.node)
            elif now - task.dispatched_at > unclaimed_limit and _finish_task(
                store, record, task.node, NodePhase.FAILED, SILENT_NODE_MESSAGE, now=now
            ):
                result.silent_nodes.append(name)
        if resend:
            failures = queues.send_many(record.pull_tasks(resend))
            result.resent += len(resend) - len(failures)
        sent, _failures = resend_dispatched(store, queues, record, older_than=now - config.resend_after_seconds)
        result.resent += sent
        result.slots_filled += len(fill_slots(store, queues, record.key, now=now).claimed)
        finish_if_done(store, record.key, now=now)
    settled = SettledNodes() if settled is None else settled

    def one(name: str, api: ClusterApi) -> SweepResult:
        part = SweepResult()
        _sweep_cluster(store, queues, name, api, part, now=now, config=config, budget=budget,
                       settled=settled.of(name))
        return part

    runs = on_each_cluster(clusters, one, clock=lambda: now, own_optional=True)
    for run in runs:
        if run.outcome is None:
            continue
        result.queues_deleted += run.outcome.queues_deleted
        result.nodes_forgotten += run.outcome.nodes_forgotten
        result.nodes_returned += run.outcome.nodes_returned
        result.departures_deferred += run.outcome.departures_deferred
        result.taints_released += run.outcome.taints_released
        result.agents.update(run.outcome.agents)
    result.unreachable = unreachable(runs)
    record_health(store, clusters, runs, agents=result.agents)
    for record in unplanned:
        # Only once its cluster answers: a plan against a cluster still down would fail again.
        if record.cluster in result.agents:
            with contextlib.suppress(StoreConflictError):
                store.replace_job_spec(record.replanned(), expected_hash=record.spec_hash)
                result.replanned.append(record.key)
    if secrets is not None:
        # Listed afresh: jobs expired above are gone, and jobs applied meanwhile count.
        result.pull_secrets_deleted = secrets.cleanup(referenced_pull_secrets(store.list_jobs()))
    return result


def run_sweep(store: ScheduledItems, queues: TaskQueues, clusters: ClusterDirectory, *, clock: Callable[[], float],
              config: SweepSettings = SweepSettings(), secrets: PullSecretCleanup | None = None,
              budget: TimeBudget = UNLIMITED, settled: SettledNodes | None = None) -> SweepResult:
    """The sweep's scheduled run: `sweep`, then the run recorded; not recorded when the stack's own cluster
    failed (`ClusterUnavailableError`, after every other cluster was swept), so the schedule's retry and
    `prewarm doctor` see it."""
    started = clock()
    result = sweep(store, queues, clusters, now=started, config=config, secrets=secrets, budget=budget,
                   settled=settled)
    raise_if_own_unreachable(result.unreachable, clusters, "swept")
    record_run(store, SWEEP, started_at=started, finished_at=clock())
    return result


def _sweep_cluster(store: NodeItems, queues: TaskQueues, name: str, api: ClusterApi, result: SweepResult, *,
                   now: float, config: SweepSettings, budget: TimeBudget, settled: set[str]) -> None:
    """One cluster's departed nodes and overdue startup taints; names in `result` are scoped by cluster."""
    listing = list_in_order(store, queues, api, name)
    result.agents[name] = len(list(listing.registered))
    departures = forget_departed_nodes(store, queues, api, listing, prefix=config.prefix, budget=budget,
                                       cluster=name)

    def named(nodes: Iterable[str]) -> list[str]:
        return [scoped(name, n) for n in nodes]

    result.queues_deleted += departures.queues_deleted
    result.nodes_forgotten += named(departures.nodes_forgotten)
    result.nodes_returned += named(departures.nodes_returned)
    result.departures_deferred += departures.deferred
    result.taints_released += named(release_overdue_taints(
        api, listing.nodes, now=now, grace=config.taint_grace_seconds, budget=budget, settled=settled,
        hellos=listing.registered, no_agent_grace=config.no_agent_grace_seconds))


def referenced_pull_secrets(jobs: Iterable[StoredJob]) -> set[tuple[str, str]]:
    """(namespace, name) of every pull secret a stored job names, whatever the job's state; the namespace
    scoped by a registered cluster (`<cluster>:<namespace>`): each cluster's secrets are its own."""
    return {(scoped(record.cluster, record.namespace), name) for record in jobs for name in record.pull_secret_names}


def _finish_list_job(store: JobItems, record: StoredJob, *, now: float) -> None:
    if record.state is not JobState.RUNNING:
        return  # finished: its children need not be read
    children = [store.get_job(record.sibling(name)) for name in record.children]
    fields = record.list_completion(children, now)
    if fields is not None:
        store.set_job_fields(record.key, fields, condition_state=JobState.RUNNING)


def _finish_task(
    store: PlanItems, record: StoredJob, node: str, phase: NodePhase, message: str, *, now: float
) -> bool:
    """Moves one node to a final phase on the control plane's own authority (silence, deadline)."""
    try:
        return retry_on_conflict(lambda: _finish_task_once(store, record, node, phase, message, now=now),
                                 conflict=StoreConflictError, attempts=5)
    except StoreConflictError:
        return False


def _finish_task_once(
    store: PlanItems, record: StoredJob, node: str, phase: NodePhase, message: str, *, now: float
) -> bool:
    task = store.get_task(record.key, node, shards=record.ref.shards)
    if task is None or task.round != record.round or task.phase.is_terminal:
        return False
    deltas = {"failed": 1, "done": 1}
    deltas["waiting" if task.dispatched_at is None else "active"] = -1
    fields = {"phase": phase.value, "message": message, "finished_at": now, "updated_at": now, "seq": task.seq + 1}
    # The job item is in every claim's and report batch's transaction: meeting one is tried again.
    retry_refused_write(lambda: store.apply_updates(record.ref, [NodeUpdate(node, task.version, fields)], deltas))
    return True


def _fail_past_deadline(store: PlanItems, queues: TaskQueues, record: StoredJob, *, now: float) -> None:
    """Kruise fails a job past activeDeadlineSeconds; every unfinished node is cancelled and counted failed."""
    tasks = [t for t in store.get_tasks(record.key, shards=record.ref.shards) if t.round == record.round]
    for task in tasks:
        if not task.phase.is_terminal:
            _finish_task(store, record, task.node, NodePhase.CANCELLED, DEADLINE_EXCEEDED_MESSAGE, now=now)
    # A sweep retried after a crash here finds nodes it already cancelled: cancel them again, not never.
    cancels = [
        record.cancel_task(t.node, round=record.round, reason=DEADLINE_EXCEEDED_MESSAGE)
        for t in tasks
        if t.dispatched_at is not None
        and (not t.phase.is_terminal or (t.phase is NodePhase.CANCELLED and t.message == DEADLINE_EXCEEDED_MESSAGE))
    ]
    queues.send_many(cancels)
    store.finish_job(record.key, record.finish_fields(JobState.FAILED, at=now, message=DEADLINE_EXCEEDED_MESSAGE),
                     require_done=False)


def release_overdue_taints(taints: NodeTaints, nodes: Iterable[Mapping[str, Any]], *, now: float, grace: float,
                           budget: TimeBudget = UNLIMITED, settled: set[str] | None = None,
                           limit: int = TAINT_READS_PER_RUN, hellos: Mapping[str, float] | None = None,
                           no_agent_grace: float | None = None) -> list[str]:
    """Removes the startup taint from each node that still holds it `grace` after its agent's deadline,
    and, given `hellos` (node → its agent's last hello) and `no_agent_grace`, from each Ready node that
    holds it with no hello from its agent `no_agent_grace` after it became Ready (no agent runs there to
    remove it); returns their names. A node changed meanwhile (the guarded patch fails) is left to the
    next sweep.

    `nodes` may be metadata only: of those past either limit and not in `settled`, up to `limit` (those
    past the deadline, then those without a hello, each newest first) are read whole for their taints;
    each found without the taint, or released, joins `settled` (by uid: a new node under an old name is
    read again)."""
    try:
        config = taints.get_object("v1", "configmaps", AGENT_NAME, AGENT_NAMESPACE)
    except (ClusterAuthError, ClusterUnavailableError) as e:
        # RBAC from an install older than this stack, or the API busy: the rest of the sweep goes on.
        log.warning("cannot read the agents' ConfigMap, so no startup taint is checked now: %s", e)
        return []
    limits = WarmLimits.of_agent_config((config or {}).get("data"))
    nodes = list(nodes)
    settled = set() if settled is None else settled
    settled.intersection_update(_node_id(n) for n in nodes)  # forget nodes that left
    released: list[str] = []
    early = [] if hellos is None or no_agent_grace is None else without_hello(nodes, hellos, grace=no_agent_grace,
                                                                               now=now)
    agentless = {_node_id(n) for n in early}
    due = list({_node_id(n): n for n in [*past_deadline(nodes, limits, grace=grace, now=now), *early]
                if _node_id(n) not in settled}.values())
    for index, listed in enumerate(due[:limit]):
        if not budget.has_time():
            log.info("startup taints of %d nodes left to the next sweep: the run is short of time",
                     len(due) - index)
            break
        name, uid = str(listed["metadata"]["name"]), _node_id(listed)
        try:
            node = taints.get_node(name)
        except (ClusterAuthError, ClusterUnavailableError) as e:
            log.warning("cannot read node %s for its startup taint now (the next sweep tries again): %s", name, e)
            return released
        if node is None or _node_id(node) != uid:
            continue  # gone since the list, or another node under its name: the next sweep sees it
        held = overdue_seconds(node, limits, grace=grace, now=now)
        message = fail_open_message(limits, held) if held is not None else ""
        if held is None and uid in agentless and no_agent_grace is not None:
            held = agentless_seconds(node, limits, grace=no_agent_grace, now=now)
            message = no_hello_message(limits, held, no_agent_grace) if held is not None else ""
        ops = limits.taint.removal_patch(node) if held is not None else None
        if held is None or ops is None:
            if not limits.taint.held_by(node):
                settled.add(uid)  # a node still tainted (not Ready yet, or within the grace) is read again
            continue
        try:
            taints.patch_node(name, ops)
        except ClusterInvalidError as e:
            log.info("node %s changed while its startup taint was being removed; next sweep: %s", name, e)
            continue
        except ClusterNotFoundError:
            continue  # gone since the list (scaled in): nothing to release
        except (ClusterAuthError, ClusterUnavailableError) as e:
            log.warning("cannot remove node %s's overdue startup taint now (the next sweep tries again): %s", name, e)
            return released
        log.warning("node %s: %s", name, message)
        released.append(name)
        settled.add(uid)
        try:
            taints.create_event("default", node_event(name, reason=FAIL_OPEN_EVENT_REASON, message=message,
                                                      component="prewarm-sweep", at=now))
        except ClusterError as e:
            # The taint is off and the log says why: an Event refused is no reason to fail the sweep.
            log.warning("the Event about node %s's startup taint was not recorded: %s", name, e)
    return released


def _node_id(node: Mapping[str, Any]) -> str:
    metadata = node.get("metadata") or {}
    return str(metadata.get("uid") or metadata.get("name") or "")
