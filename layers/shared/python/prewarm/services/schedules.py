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
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.schedules import DAILY_ROUND, RECORDED_SCHEDULES, SWEEP, ScheduleRun
from prewarm.domain.warming import (
    AGENT_NAME,
    AGENT_NAMESPACE,
    FAIL_OPEN_EVENT_REASON,
    SettledNodes,
    WarmLimits,
    agentless_seconds,
    fail_open_message,
    newest_first,
    no_hello_message,
    node_event,
    overdue_seconds,
    past_deadline,
    without_hello,
)
from prewarm.services.budget import UNLIMITED, TimeBudget
from prewarm.services.clusters import on_each_cluster, raise_if_own_unreachable, record_health, unreachable
from prewarm.services.departures import forget_departed_nodes, list_in_order
from prewarm.services.dispatch import retry_refused_write
from prewarm.services.node_facts import repair_nodes
from prewarm.services.node_queues import repair_queues
from prewarm.services.ports import (
    ClusterApi,
    ClusterAuthError,
    ClusterDirectory,
    ClusterError,
    ClusterInvalidError,
    ClusterNotFoundError,
    ClusterUnavailableError,
    JobItems,
    NodeTaints,
    PullSecretCleanup,
    ScheduledItems,
    ScheduleRuns,
    StoreConflictError,
    StoreRetryableError,
    SweepItems,
    TaskQueues,
)
from prewarm.services.sweep_jobs import DEFAULT_SWEEP_SETTINGS, JobSweep, sweep_jobs
from prewarm.services.sweep_jobs import SILENT_NODE_MESSAGE as SILENT_NODE_MESSAGE
from prewarm.services.sweep_jobs import SweepSettings as SweepSettings
from prewarm.services.verifying import verify_nodes

log = logging.getLogger(__name__)


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
class SweepResult(JobSweep):
    """What a sweep did: the job loop's (`JobSweep`), then each cluster's."""

    queues_deleted: list[str] = field(default_factory=list)
    nodes_forgotten: list[str] = field(default_factory=list)
    # Listed as gone but found by the read before deletion: kept. Departed nodes left to the next run.
    nodes_returned: list[str] = field(default_factory=list)
    departures_deferred: int = 0
    # Node queues whose policy, attributes or tags were not the stack's: set back (name → what).
    queues_repaired: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pull_secrets_deleted: list[str] = field(default_factory=list)
    # Nodes whose startup taint no agent removed (by its deadline, or with no hello): the sweep removed it.
    taints_released: list[str] = field(default_factory=list)
    # Registered clusters whose API failed this run (name → why): the others were swept all the same.
    unreachable: dict[str, str] = field(default_factory=dict)
    # Per cluster swept: its nodes whose agents said hello ("" for the stack's own).
    agents: dict[str, int] = field(default_factory=dict)
    # Nodes registered unverified (their cluster could not be read at their hello), checked this run.
    nodes_verified: list[str] = field(default_factory=list)
    # Jobs never planned (their cluster could not be read, or their stream record was lost) whose cluster
    # answered this run: asked to plan again.
    replanned: list[str] = field(default_factory=list)


# Nodes read whole per run for their startup taint (the rest of the sweep reads metadata only). Once read
# without the taint a node is not read again by this process; after a cold start the nodes past their
# deadline are read over a few runs, newest first (the likeliest to hold the taint).
TAINT_READS_PER_RUN = 500


def sweep(
    store: SweepItems,
    queues: TaskQueues,
    clusters: ClusterDirectory,
    *,
    now: float,
    config: SweepSettings = DEFAULT_SWEEP_SETTINGS,
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

    A Ready node holding the startup taint with no hello from its agent `config.no_agent_grace_seconds`
    after it became Ready has no agent running there: the sweep removes it then.

    Fail-open and departed nodes (`services.departures`) run first, then the jobs (`services.sweep_jobs`:
    a settled job is not read beyond its item, a running one's nodes in flight once); all of it is the
    work the next run can finish, started only while `budget` has time. `settled` holds, per cluster,
    the nodes seen without the taint past their deadline, kept by the caller across runs so that they
    are not read again.

    Every cluster of `clusters` is swept side by side (`services.clusters`); the stack's own only when
    its API is configured. A cluster whose API fails is left for the next run (`result.unreachable`, the
    stack's own under "") and does not keep the others from being swept; how each answered is recorded
    on its cluster item.
    """
    result = SweepResult()
    # 1. Fail-open and departures first, every cluster side by side: no number of jobs delays them.
    agents: dict[str, set[str]] = {}  # per cluster swept, its nodes whose agent said hello
    _sweep_clusters(store, queues, clusters, result, agents, now=now, config=config, budget=budget, settled=settled)
    # 2. The jobs, a few at a time, while the run has time.
    jobs = store.list_jobs()
    if config.no_agent_grace_seconds is not None:
        for cluster in sorted({r.cluster for r in jobs if not r.is_settled} - set(agents)):
            agents[cluster] = {n.name for n in store.list_nodes(cluster)}  # a cluster whose API failed
    else:
        agents.clear()
    result.add(sweep_jobs(store, queues, jobs, now=now, config=config, agents=agents, budget=budget))
    # 3. Jobs never planned (parked: their cluster could not be read), as soon as their cluster answers,
    # whatever their age: a plan against a cluster still down would fail again.
    for record in (r for r in jobs if r.awaits_plan(now)):
        if record.cluster in result.agents:
            with contextlib.suppress(StoreConflictError):
                store.replace_job_spec(record.replanned(), expected_hash=record.spec_hash)
                result.replanned.append(record.key)
    # 4. Pull secret mirrors no job names, listed afresh: jobs expired above are gone, jobs applied meanwhile count.
    if secrets is not None:
        result.pull_secrets_deleted = secrets.cleanup(referenced_pull_secrets(store.list_jobs()))
    return result


def _sweep_clusters(store: SweepItems, queues: TaskQueues, clusters: ClusterDirectory, result: SweepResult,
                    agents: dict[str, set[str]], *, now: float, config: SweepSettings, budget: TimeBudget,
                    settled: SettledNodes | None) -> None:
    """Each cluster's departed nodes and overdue startup taints, side by side; how each answered is
    recorded on its cluster item. `agents` gets, per cluster swept, its nodes whose agent said hello."""
    settled = SettledNodes() if settled is None else settled

    def one(name: str, api: ClusterApi) -> SweepResult:
        part = SweepResult()
        agents[name] = _sweep_cluster(store, queues, name, api, part, now=now, config=config, budget=budget,
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
        result.nodes_verified += run.outcome.nodes_verified
        result.queues_repaired.update(run.outcome.queues_repaired)
        result.agents.update(run.outcome.agents)
    result.unreachable = unreachable(runs)
    record_health(store, clusters, runs, agents=result.agents)


def run_sweep(store: ScheduledItems, queues: TaskQueues, clusters: ClusterDirectory, *, clock: Callable[[], float],
              config: SweepSettings = DEFAULT_SWEEP_SETTINGS, secrets: PullSecretCleanup | None = None,
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


def _sweep_cluster(store: SweepItems, queues: TaskQueues, name: str, api: ClusterApi, result: SweepResult, *,
                   now: float, config: SweepSettings, budget: TimeBudget, settled: set[str]) -> set[str]:
    """One cluster's departed nodes and overdue startup taints; names in `result` are scoped by cluster.
    Returns its nodes whose agent said hello."""
    listing = list_in_order(store, queues, api, name)
    result.agents[name] = len(list(listing.registered))
    result.nodes_verified += [scoped(name, n) for n in verify_nodes(store, queues, api, name, now=now, budget=budget,
                                                                    unverified=listing.unverified)]
    departures = forget_departed_nodes(store, queues, api, listing, prefix=config.prefix, budget=budget,
                                       cluster=name)

    def named(nodes: Iterable[str]) -> list[str]:
        return [scoped(name, n) for n in nodes]

    result.queues_deleted += departures.queues_deleted
    result.nodes_forgotten += named(departures.nodes_forgotten)
    result.nodes_returned += named(departures.nodes_returned)
    result.departures_deferred += departures.deferred
    # Each queue once in ten runs (services/node_queues.py); departed nodes' queues just went.
    gone = set(departures.queues_deleted)
    left = {n: u for n, u in listing.queues.items() if n not in gone}
    result.queues_repaired.update(repair_queues(queues, left, run=int(now // 60), budget=budget).repaired)
    result.taints_released += named(release_overdue_taints(
        api, listing.nodes, now=now, grace=config.taint_grace_seconds, budget=budget, settled=settled,
        hellos=listing.registered, no_agent_grace=config.no_agent_grace_seconds))
    if budget.has_time():  # last: nodes' conditions and rules' labels, a few nodes in turn, once in ten runs
        repair_nodes(store, api, name, listing.registered, now=now)
    return set(listing.registered)


def referenced_pull_secrets(jobs: Iterable[StoredJob]) -> set[tuple[str, str]]:
    """(namespace, name) of every pull secret a stored job names, whatever the job's state; the namespace
    scoped by a registered cluster (`<cluster>:<namespace>`): each cluster's secrets are its own."""
    return {(scoped(record.cluster, record.namespace), name) for record in jobs for name in record.pull_secret_names}


def release_overdue_taints(taints: NodeTaints, nodes: Iterable[Mapping[str, Any]], *, now: float, grace: float,
                           budget: TimeBudget = UNLIMITED, settled: set[str] | None = None,
                           limit: int = TAINT_READS_PER_RUN, hellos: Mapping[str, float] | None = None,
                           no_agent_grace: float | None = None) -> list[str]:
    """Removes the startup taint from each node that still holds it `grace` after its agent's deadline,
    and, given `hellos` (node → its agent's last hello) and `no_agent_grace`, from each Ready node that
    holds it with no hello from its agent `no_agent_grace` after it became Ready (no agent runs there to
    remove it); returns their names. A node changed meanwhile (the guarded patch fails) is left to the
    next sweep.

    `nodes` may be metadata only: of those past either limit and not in `settled`, up to `limit` (newest
    first: a node that just joined without an agent comes before old ones) are read whole for their taints;
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
    due = newest_first({_node_id(n): n for n in [*past_deadline(nodes, limits, grace=grace, now=now), *early]
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
