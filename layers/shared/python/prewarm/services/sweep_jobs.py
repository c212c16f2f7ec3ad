"""The sweep's job loop: each stored job's deletion, expiry, deadline, silent and agentless nodes, lost
sends and free slots (`services.schedules.sweep` runs it after fail-open and departures).

What it reads is what keeps it inside its minute with many large jobs: a settled job (finished, or no
node waiting or in flight: its counters say so) is not read beyond its job item; a running one has its
nodes in flight read once, through the sparse `flight` index (not every node item of the job), and
those read serve both the silence checks and the re-sends (`dispatch.resend_dispatched`). Its nodes
still waiting for a slot are listed (keys only, `waiting` index) only to find those no agent said hello
from. Jobs run a few at a time and are started only while the run has time (`budget`); each run
starts at another job, so the jobs left over are the first of a later run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prewarm.domain.intervals import STARTUP_TAINT_GRACE_SECONDS
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.liveness import AGENT_NOT_REPORTING, AGENT_SILENCE_SECONDS, NO_AGENT_ON_NODE, is_silent
from prewarm.domain.messages import NodePhase
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.status import DEADLINE_EXCEEDED_MESSAGE, NodeTaskRecord, NodeUpdate
from prewarm.services.budget import UNLIMITED, TimeBudget, run_within
from prewarm.services.dispatch import fill_slots, finish_if_done, resend_dispatched, retry_refused_write
from prewarm.services.jobs import complete_deletion
from prewarm.services.lifecycle import release_images
from prewarm.services.ports import JobItems, PlanItems, StoreConflictError, TaskQueues

log = logging.getLogger(__name__)

SILENT_NODE_MESSAGE = "node has not responded for a long time"

# A deletion the dispatch function has not finished this long after it was asked (its stream record
# lost or failed for good) is finished by the sweep.
DELETION_GRACE_SECONDS = 60

# Jobs swept at once: each is a few DynamoDB calls in a row, so a pool keeps 20 large jobs within seconds
# (the DynamoDB client keeps 32 connections, the SQS client's sends ride on their own).
JOB_WORKERS = 8


@dataclass(frozen=True)
class SweepSettings:
    """What the sweep is told by the stack's settings: the node queues' prefix, and how long each kind of
    silence is borne (`services.schedules.sweep` says what each means)."""

    prefix: str = "prewarm"
    silence_grace_seconds: int = 300
    resend_after_seconds: int = 300
    agent_silence_seconds: float = AGENT_SILENCE_SECONDS
    no_agent_grace_seconds: float | None = None
    taint_grace_seconds: float = STARTUP_TAINT_GRACE_SECONDS
    job_workers: int = JOB_WORKERS
    # How long an image no live job wants stays on its nodes (ImageRemovalGraceSeconds); None: for ever.
    image_removal_grace_seconds: int | None = None


DEFAULT_SWEEP_SETTINGS = SweepSettings()


@dataclass
class JobSweep:
    """What the job loop did; names of nodes are `<job key>:<node>`."""

    deadline_failed: list[str] = field(default_factory=list)
    silent_nodes: list[str] = field(default_factory=list)
    agentless_nodes: list[str] = field(default_factory=list)
    resent: int = 0
    slots_filled: int = 0
    expired: list[str] = field(default_factory=list)
    deletions_completed: list[str] = field(default_factory=list)
    # Jobs not looked at: the run was short of time (the next run starts with them).
    jobs_deferred: int = 0
    # Jobs whose node items were read (neither settled nor finished here).
    jobs_read: int = 0

    def add(self, other: JobSweep) -> None:
        self.deadline_failed += other.deadline_failed
        self.silent_nodes += other.silent_nodes
        self.agentless_nodes += other.agentless_nodes
        self.resent += other.resent
        self.slots_filled += other.slots_filled
        self.expired += other.expired
        self.deletions_completed += other.deletions_completed
        self.jobs_deferred += other.jobs_deferred
        self.jobs_read += other.jobs_read


def sweep_jobs(store: PlanItems, queues: TaskQueues, jobs: Sequence[StoredJob], *, now: float,
               config: SweepSettings, agents: Mapping[str, set[str]], budget: TimeBudget = UNLIMITED) -> JobSweep:
    """Sweeps `jobs`, `config.job_workers` at a time while `budget` has time. `agents`: per cluster, the nodes whose
    agent said hello (read by the caller for the clusters of jobs with nodes waiting)."""
    parts: list[JobSweep] = []
    start = int(now // 60) % len(jobs) if jobs else 0
    ordered = [*jobs[start:], *jobs[:start]]

    def one(record: StoredJob) -> None:
        parts.append(sweep_job(store, queues, record, now=now, config=config, agents=agents))

    result = JobSweep()
    result.jobs_deferred = run_within(budget, [functools.partial(one, r) for r in ordered], workers=config.job_workers)
    if result.jobs_deferred:
        log.info("%d jobs left to the next sweep: the run is short of time", result.jobs_deferred)
    for part in parts:
        result.add(part)
    return result


def sweep_job(store: PlanItems, queues: TaskQueues, record: StoredJob, *, now: float, config: SweepSettings,
              agents: Mapping[str, set[str]]) -> JobSweep:
    """One job's part of the sweep (see the module)."""
    part = JobSweep()
    if record.state == JobState.DELETING:
        if (record.deleting_since or 0) <= now - DELETION_GRACE_SECONDS:
            complete_deletion(store, queues, record.key, remove_after=config.image_removal_grace_seconds)
            part.deletions_completed.append(record.key)
        return part
    if record.ttl is not None and record.ttl <= now:
        # DynamoDB TTL deletes within days, not at the second: hide and delete it here, its pins released.
        release_images(store, queues, record, remove_after=config.image_removal_grace_seconds)
        store.delete_job(record.key)
        part.expired.append(record.key)
        return part
    if record.is_list_job:
        _finish_list_job(store, record, now=now)
        return part
    if record.is_dispatching and record.is_past_deadline(now):
        _fail_past_deadline(store, queues, record, now=now)
        part.deadline_failed.append(record.key)
        return part
    if record.is_settled:
        if record.completion(now) is not None:  # a completion its last report did not write
            finish_if_done(store, record.key, now=now)
        return part
    part.jobs_read = 1
    known = agents.get(record.cluster)
    if known is not None and record.counters.waiting and record.pull_job.spec.parallelism > 0:
        # A paused job (parallelism 0) holds its waiting nodes on purpose.
        _fail_agentless_waiting(store, record, known, part, now=now, grace=config.no_agent_grace_seconds)
    flight = store.in_flight_tasks(record.ref) if record.counters.active else []
    _judge_in_flight(store, queues, record, flight, known, part, now=now, config=config)
    sent, _failures = resend_dispatched(store, queues, record, older_than=now - config.resend_after_seconds,
                                        tasks=flight)
    part.resent += sent
    if record.counters.waiting:
        part.slots_filled += len(fill_slots(store, queues, record.key, now=now).claimed)
    finish_if_done(store, record.key, now=now)
    return part


def _fail_agentless_waiting(store: PlanItems, record: StoredJob, known: set[str], part: JobSweep, *, now: float,
                            grace: float | None) -> None:
    """Fails the nodes waiting for a slot whose agent never said hello, `grace` after they were planned."""
    if grace is None:
        return
    listed = store.waiting_nodes(record.key, record.counters.waiting, shards=record.ref.shards)
    missing = [n for n in listed if n not in known]
    if not missing:
        return
    for node, task in sorted(store.get_tasks_of(record.ref, missing).items()):
        if task.round != record.round or task.phase is not NodePhase.WAITING or task.dispatched_at is not None:
            continue
        since = task.updated_at or record.start_time or now
        if now - since > grace and _finish_task(store, record, node, NodePhase.FAILED, NO_AGENT_ON_NODE, now=now):
            part.agentless_nodes.append(f"{record.key}:{node}")


def _judge_in_flight(store: PlanItems, queues: TaskQueues, record: StoredJob, flight: Sequence[NodeTaskRecord],
                     known: set[str] | None, part: JobSweep, *, now: float, config: SweepSettings) -> None:
    """Silence (`prewarm.domain.liveness`) and absent agents among the nodes in flight."""
    unclaimed_limit = record.pull_job.spec.pull_policy.timeout_seconds + config.silence_grace_seconds
    resend: list[NodeTaskRecord] = []
    for task in flight:
        name = f"{record.key}:{task.node}"
        dispatched = task.dispatched_at if task.dispatched_at is not None else now
        # A paced task's node sees it at its start; a task the budget holds back was not sent at all.
        unclaimed = task.unclaimed_since if task.unclaimed_since is not None else now
        if task.phase is NodePhase.WAITING and known is not None and config.no_agent_grace_seconds is not None \
                and task.node not in known:
            if now - dispatched > config.no_agent_grace_seconds and _finish_task(
                store, record, task.node, NodePhase.FAILED, NO_AGENT_ON_NODE, now=now
            ):
                part.agentless_nodes.append(name)
            continue
        if task.phase is NodePhase.PULLING:
            quiet = now - (task.updated_at or dispatched)
            if quiet > config.agent_silence_seconds:
                if _finish_task(store, record, task.node, NodePhase.FAILED, AGENT_NOT_REPORTING, now=now):
                    part.silent_nodes.append(name)
            elif is_silent(task, now=now):
                resend.append(task)
        elif now - unclaimed > unclaimed_limit and _finish_task(
            store, record, task.node, NodePhase.FAILED, SILENT_NODE_MESSAGE, now=now
        ):
            part.silent_nodes.append(name)
    if resend:
        failures = queues.send_many(record.resend_tasks(resend))
        part.resent += len(resend) - len(failures)


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
