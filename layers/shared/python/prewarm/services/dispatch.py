"""Planning a job onto nodes and handing out parallelism slots.

`plan_job` runs when a job item changes (the table stream): it selects the nodes, writes one node item
each and sends the first `parallelism` tasks. `fill_slots` hands a freed slot to the next waiting node.
Both are safe to run again after a crash at any point: writes are conditional on the job's `version`
or on the node item's state, and a task sent twice is harmless (the agent and `record_status` dedupe).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import ImagePullJob, JobState
from prewarm.domain.messages import NodePhase
from prewarm.domain.placement import AgentPlacement, NodeSelection, evaluate_nodes, named_exclusions
from prewarm.domain.registry_budget import RegistryBudgets, assumed_layers_note, budget_key, ecr_image_id
from prewarm.domain.retry import Backoff, doubling, retry_on_conflict
from prewarm.domain.status import Counters, NodeTaskRecord, WaveProgress
from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE
from prewarm.services.lifecycle import release_dropped_nodes, release_earlier_round
from prewarm.services.ports import (
    Cluster,
    ClusterAuthError,
    ImageMetadata,
    PlanItems,
    PullSecretError,
    PullSecretMirror,
    StoreConflictError,
    StoreRetryableError,
    TaskQueues,
    TaskSendError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# A write refused for now (a transaction in flight on one of its items: TransactionConflict; throttling
# past botocore's retries) wrote nothing: it is tried again after a jittered backoff, 50 ms doubling to
# 1 s, five tries in all, before the caller's input goes back to its event source.
WRITE_ATTEMPTS = 5
WRITE_BACKOFF = Backoff(0.05, 1.0, jitter=True)


def retry_refused_write(write: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep) -> T:
    """Runs `write`, again after a backoff while the store refuses it for now (`StoreRetryableError`);
    the last refusal is raised."""
    return retry_on_conflict(write, conflict=StoreRetryableError, attempts=WRITE_ATTEMPTS, backoff=WRITE_BACKOFF,
                             sleep=sleep)


# TransactWriteItems takes 100 actions: 99 claimed node items and the job item.
MAX_CLAIMS_PER_TRANSACTION = 99
# A claim that meets another filler's transaction (TransactionConflict on the job item or a node) or
# throttling is tried again after a jittered backoff, so record_status invocations refilling one job
# at once take turns instead of failing their whole batch; after this many refusals in a row it raises.
CLAIM_ATTEMPTS = 8
_CLAIM_BACKOFF_S = 0.05
_CLAIM_BACKOFF_MAX_S = 2.0

# Selecting by names: below this many names, one GET per node beats listing the cluster.
_NAMES_BY_GET = 20
# The start of a job's message when where the agents run could not be read at its plan.
UNCHECKED = "nodes without an agent not excluded"


@dataclass
class PlanResult:
    job: str
    action: str
    selected: int = 0
    excluded: int = 0
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    sent: int = 0
    send_failures: list[tuple[str, str]] = field(default_factory=list)
    # A `Never` job's plan changes what warming nodes must have: the caller sends them their lists again
    # (`prewarm.services.warming.send_required_images`), also when this is a retry of such a plan.
    changes_warming: bool = False

    def raise_for_send_failures(self) -> None:
        """Raise `TaskSendError` when any send failed."""
        if self.send_failures:
            raise TaskSendError(self.send_failures)


def select(cluster: Cluster, record: StoredJob) -> NodeSelection:
    """Lists what the job's selector needs from the API (label selectors evaluated server-side)."""
    job = record.pull_job
    spec = job.spec
    pods: list[dict[str, Any]] = []
    if spec.pod_selector is not None:
        pods = cluster.list_pods(
            job.metadata.namespace, label_selector=spec.pod_selector.to_query() or None,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        wanted = sorted({p.get("spec", {}).get("nodeName") or "" for p in pods} - {""})
        nodes = _nodes_by_name(cluster, wanted)
    elif spec.selector is not None and spec.selector.names:
        nodes = _nodes_by_name(cluster, list(spec.selector.names))
    elif spec.selector is not None:
        nodes = cluster.list_nodes(label_selector=spec.selector.to_query() or None)
    else:
        nodes = cluster.list_nodes()
    agents, unchecked = agent_placement(cluster)
    selection = evaluate_nodes(job.placement, nodes, pods, platforms=record.image_platforms(), agents=agents)
    wave = job.seed_wave
    seeds = wave.seeds(nodes, selection.selected) if wave is not None else []
    return replace(selection, unchecked=unchecked, seeds=seeds)


def _nodes_by_name(cluster: Cluster, names: list[str]) -> list[dict[str, Any]]:
    if len(names) <= _NAMES_BY_GET:
        return [n for name in names if (n := cluster.get_node(name)) is not None]
    wanted = set(names)
    return [n for n in cluster.list_nodes() if n.get("metadata", {}).get("name") in wanted]


def placement_note(record: StoredJob, selection: NodeSelection, note: str = "") -> str | None:
    """What the job's message adds about its plan: named nodes left out, where the agents run unread, and
    `note` (its image's layer count unknown)."""
    notes = [named_exclusions(record.pull_job.placement, selection.excluded), selection.unchecked, note]
    return "; ".join(note for note in notes if note) or None


def agent_placement(cluster: Cluster) -> tuple[AgentPlacement | None, str]:
    """Where the agent DaemonSet runs; or None, and why, when it cannot be read.

    Without it a job selects as before this check existed (only Fargate, Windows and virtual-kubelet
    nodes are known to have no agent) and its message says so: a node with no agent then fails
    `no agent on node`, which blocks nothing. Throttling and outages are raised, for a retry.
    """
    where = f"DaemonSet {AGENT_NAMESPACE}/{AGENT_NAME}"
    try:
        daemon_set = cluster.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    except ClusterAuthError as e:
        # RBAC from an install older than this stack: 50-control-plane-rbac.yaml grants this one get.
        log.warning("cannot read the agent %s, so nodes it does not run on are not excluded: %s", where, e)
        return None, f"{UNCHECKED}: cannot read {where} ({e.reason or e.status}; run prewarm install)"
    if daemon_set is None:
        return None, f"{UNCHECKED}: no {where} (run prewarm install)"
    return AgentPlacement.of_daemon_set(daemon_set), ""


def plan_job(
    store: PlanItems,
    cluster: Cluster,
    queues: TaskQueues,
    key: str,
    *,
    now: float,
    secrets: PullSecretMirror | None = None,
    images: ImageMetadata | None = None,
    budgets: RegistryBudgets | None = None,
    remove_after: int | None = None,
) -> PlanResult:
    """Brings the job's node items in line with its spec and round, then fills the free slots.

    `secrets` mirrors the job's `pullSecrets` where agents can read them; without it a job that
    names pull secrets fails to plan rather than pulling without its credentials. `images` reads the
    layer count of a job that has none (applied by hand, not from a push) from ECR, in the image's
    Region, kept on the job: a pull's share of its registry's budget. When it stays unknown (another
    registry, or ECR cannot say), the job's message says what `budgets` (the stack's; None: the
    defaults) costs its pulls at. A new round whose image changed releases the earlier image on the
    earlier round's nodes (`services.lifecycle.release_earlier_round`; `remove_after`: the stack's grace
    period before those no job wants are removed, None: never).
    """
    return retry_on_conflict(
        lambda: _plan_once(store, cluster, queues, key, now=now, secrets=secrets, images=images,
                           budgets=budgets or RegistryBudgets(), remove_after=remove_after),
        conflict=_RoundChanged, attempts=5,
        exhausted=lambda: StoreConflictError(f"job {key} kept changing while being planned"),
    )


def _plan_once(
    store: PlanItems, cluster: Cluster, queues: TaskQueues, key: str, *, now: float,
    secrets: PullSecretMirror | None, images: ImageMetadata | None = None,
    budgets: RegistryBudgets, remove_after: int | None = None,
) -> PlanResult:
    record = store.get_job(key)
    if record is None or not record.is_pull_job:
        return PlanResult(key, "skipped: no such ImagePullJob")
    if record.state != JobState.RUNNING:
        return PlanResult(key, f"skipped: job is {record.state}")
    if record.is_planned:
        # A retry of a plan whose sends (or lists to warming nodes) did not all go out.
        result = PlanResult(key, "already planned", changes_warming=record.is_never)
        result.sent, result.send_failures = resend_dispatched(store, queues, record)
        _add_fill(result, fill_slots(store, queues, key, now=now))
        return result
    job = record.pull_job
    if job.spec.pull_secrets:
        try:
            if secrets is None:
                raise PullSecretError("pullSecrets are named but no secret mirror is configured")
            record = replace(record, pull_secret_arns=secrets.mirror(record.namespace, list(job.spec.pull_secrets),
                                                                     record.cluster))
        except PullSecretError as e:
            store.finish_job(key, record.finish_fields(JobState.FAILED, at=now, message=str(e)), require_done=False)
            return PlanResult(key, f"failed: {e}")
    record, note = _with_layers(record, images, budgets)
    # A cluster that cannot be read raises its ClusterError: the caller parks the job (`services.stream.plan`).
    selection = select(cluster, record)
    # Fixed at the first plan, from the nodes considered: where this job's node items live.
    if not record.shards:
        record = replace(record, shards=store.reserve_shards(key, len(selection.selected) + len(selection.excluded)))
    tasks = store.get_tasks(key, shards=record.shards)
    same_round = [t for t in tasks if t.round == record.round]
    try:
        if record.round_is_planned and same_round:
            result = _replan_round(store, queues, record, selection, same_round, now=now, note=note,
                                   remove_after=remove_after)
        else:
            result = _plan_round(store, queues, record, job, selection, tasks, now=now, note=note,
                                 remove_after=remove_after)
    except StoreConflictError as e:
        log.info("job %s changed while planning; planning again", key)
        raise _RoundChanged from e
    _add_fill(result, fill_slots(store, queues, key, now=now))
    finish_if_done(store, key, now=now)
    result.changes_warming = record.is_never
    return result


class _RoundChanged(Exception):
    """The job changed under a plan's writes: the plan starts again from a fresh read."""


def _add_fill(result: PlanResult, fill: FillResult) -> None:
    result.sent += fill.sent
    result.send_failures += fill.send_failures


def _plan_round(
    store: PlanItems,
    queues: TaskQueues,
    record: StoredJob,
    job: ImagePullJob,
    selection: NodeSelection,
    existing: list[NodeTaskRecord],
    *,
    now: float,
    note: str = "",
    remove_after: int | None = None,
) -> PlanResult:
    """A new round: node items written in batches, the first `parallelism` already dispatched.

    Dispatching in the same batch write keeps a 5,000-node fan-out at a few hundred DynamoDB calls;
    the tasks are sent only after the counters are committed, and re-sent by a retry if that fails.
    """
    key = record.key
    # With a seed wave only seeds start now; `fill_slots` starts the rest once every seed has finished.
    first = selection.seeds or selection.selected
    starting = set(first[: job.spec.parallelism])
    tasks = [
        NodeTaskRecord(node=n, round=record.round, updated_at=now, dispatched_at=now if n in starting else None)
        for n in selection.selected
    ]
    chosen = set(selection.selected)
    stale = [t.node for t in existing if t.node not in chosen]
    cancels = [
        record.cancel_task(t.node, round=t.round, reason="superseded by a new round")
        for t in existing
        if t.round < record.round and t.dispatched_at is not None and not t.phase.is_terminal
    ]
    # Cancels first: once the new round's items replace the old ones, a retry cannot tell whom to cancel.
    if cancels:
        queues.send_many(cancels)
    # Likewise the earlier image's releases: a failed send raises, the earlier items kept for the retry.
    if record.earlier is not None:
        release_earlier_round(store, queues, record, existing, selection.selected, remove_after=remove_after)
    else:  # the same image: only the nodes no longer selected let it go
        release_dropped_nodes(store, queues, record, [t for t in existing if t.node not in chosen],
                              remove_after=remove_after)
    store.put_tasks(key, tasks, shards=record.shards)
    if stale:
        store.delete_tasks(key, stale, shards=record.shards)
    store.put_excluded(key, selection.excluded, shards=record.shards)
    store.commit_plan(
        key, plan_id=record.plan_id, expected_version=record.version, counters=Counters.of(tasks),
        extra={"start_time": now if record.round else record.start_time, "pull_secret_arns": record.pull_secret_arns,
               "placement_note": placement_note(record, selection, note), "seeds": selection.seeds or None,
               "first_estimate": None, "earlier": None, **_layers_field(record)},
    )
    dispatched = record.pull_tasks(t.node for t in tasks if t.dispatched_at)
    failures = queues.send_many(dispatched)
    log.info("planned %s round %d: %d nodes, %d excluded", key, record.round, len(tasks), len(selection.excluded))
    return PlanResult(
        key, f"planned round {record.round}", selected=len(tasks), excluded=len(selection.excluded),
        added=[t.node for t in tasks], sent=len(dispatched) - len(failures), send_failures=failures,
    )


def _replan_round(
    store: PlanItems,
    queues: TaskQueues,
    record: StoredJob,
    selection: NodeSelection,
    tasks: list[NodeTaskRecord],
    *,
    now: float,
    note: str = "",
    remove_after: int | None = None,
) -> PlanResult:
    """A changed spec in the same round: add newly selected nodes, cancel and drop deselected ones (their
    image released as at a deletion, `remove_after` the stack's grace period)."""
    key = record.key
    have = {t.node: t for t in tasks}
    wanted = set(selection.selected)
    added = sorted(wanted - set(have))
    removed = sorted(set(have) - wanted)
    # Before the items go: a failed send raises, the items kept for the retry to know the nodes again.
    release_dropped_nodes(store, queues, record, [have[n] for n in removed], remove_after=remove_after)
    # Commit the plan id first: adds are conditional on it, and a crash after this point re-runs
    # the diff from the stored node items (the "already planned" path would skip it), so keep the
    # diff idempotent instead: the plan id is written last.
    result = PlanResult(key, "re-planned", selected=len(wanted), excluded=len(selection.excluded))
    for node in removed:
        task = have[node]
        # Cancel before removing: a retry after a crash in between no longer sees the node's item.
        if task.dispatched_at is not None and not task.phase.is_terminal:
            queues.send(record.cancel_task(node, round=task.round, reason="node no longer selected"))
        retry_refused_write(functools.partial(store.remove_task, record.ref, task))
        result.removed.append(node)
    for node in added:
        retry_refused_write(functools.partial(store.add_task, record.ref,
                                              NodeTaskRecord(node=node, round=record.round, updated_at=now),
                                              plan_id=record.planned))
        result.added.append(node)
    store.put_excluded(key, selection.excluded, shards=record.shards)
    fresh = store.get_job(key)
    if fresh is None:
        return result
    store.commit_plan(
        key, plan_id=record.plan_id, expected_version=fresh.version, counters=fresh.counters,
        extra={"pull_secret_arns": record.pull_secret_arns, "placement_note": placement_note(record, selection, note),
               **_layers_field(record)},
    )
    return result


def _with_layers(record: StoredJob, images: ImageMetadata | None,
                 budgets: RegistryBudgets) -> tuple[StoredJob, str]:
    """The job with its image's layer count read from ECR (in the image's Region) when it has none, and its
    compressed bytes when its registry's budget counts bytes and it has none; and the note its message
    carries while the count stays unknown: what its registry's budget costs each pull at
    (`layersIfUnknown`). Other registries are not asked (docs/architecture.md, "Layer counts"). Without
    `images` (no registry to ask) the job is left as it is."""
    if images is None:
        return record, ""
    try:
        host = parse_image(record.image).registry
    except InvalidImageReference:
        return record, ""
    budget = budgets.of(budget_key(host))
    found = ecr_image_id(record.image)
    if found is not None and record.layers is None:
        layers = images.layer_count(found.registry_id, found.repository, found.reference, region=found.region)
        record = record if layers is None else replace(record, layers=layers)
    if found is not None and record.image_bytes is None and budget.bytes_per_second is not None:
        size = images.image_bytes(found.registry_id, found.repository, found.reference, region=found.region)
        record = record if size is None else replace(record, image_bytes=size)
    if record.layers is not None or not budget.enabled:
        return record, ""
    return record, assumed_layers_note(host, budget.layers_if_unknown)


def _layers_field(record: StoredJob) -> dict[str, int]:
    return {name: value for name, value in (("layers", record.layers), ("image_bytes", record.image_bytes))
            if value is not None}


def add_nodes_to_job(store: PlanItems, record: StoredJob, nodes: list[str], *, now: float,
                     present: Mapping[str, NodeTaskRecord] | None = None) -> list[str]:
    """Adds new nodes (a batch's hellos) to a planned round, up to 99 a transaction; the nodes added
    (a node already in the round is not). `present`: the nodes' items as the caller read them (a node
    without one has none), else they are read here."""
    if present is None:
        present = store.get_tasks_of(record.ref, nodes)
    new = [n for n in nodes if (t := present.get(n)) is None or t.round != record.round]
    if not new:
        return []
    tasks = [NodeTaskRecord(node=n, round=record.round, updated_at=now) for n in new]
    # A claim or a batch of reports holds the job item for a moment: many hellos at once meet them.
    return retry_refused_write(lambda: store.add_tasks(record.ref, tasks, plan_id=record.plan_id))


def resend_dispatched(
    store: PlanItems, queues: TaskQueues, record: StoredJob, *, older_than: float | None = None,
    tasks: Sequence[NodeTaskRecord] | None = None,
) -> tuple[int, list[tuple[str, str]]]:
    """Sends again the tasks dispatched but never reported (a crash between claim and send), those due
    (`NodeTaskRecord.due_at`: a paced task is not late before its start) by `older_than`. `tasks`:
    the job's node items in flight as the caller read them (the sweep); else its node items are read."""
    read = store.get_tasks(record.key, shards=record.ref.shards) if tasks is None else tasks
    pending = [
        t for t in read
        if t.round == record.round and t.phase is NodePhase.WAITING and (due := t.due_at) is not None
        and (older_than is None or due <= older_than)
    ]
    if not pending:
        return 0, []
    failures = queues.send_many(record.resend_tasks(pending))
    return len(pending) - len(failures), failures


def resend_to_nodes(queues: TaskQueues, running: Sequence[StoredJob],
                    tasks: Mapping[str, Mapping[str, NodeTaskRecord]]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Sends new nodes the tasks dispatched to them but not yet taken up: their agents have just said
    hello, and a task sent before the hello made the node's queue had nowhere to go (a send creates no
    queue). `running`: the running jobs (the store's index of them); `tasks`: per dispatching job's
    key, the new nodes' items read in one batch. Answers the tasks sent per node and the sends that failed."""
    pending = []
    for record in running:
        if not record.is_dispatching:
            continue
        pending += record.resend_tasks(
            t for t in tasks[record.key].values()
            if t.round == record.round and t.phase is NodePhase.WAITING and t.dispatched_at is not None)
    if not pending:
        return {}, []
    failures = queues.send_many(pending)
    failed = {node for node, _ in failures}
    sent: dict[str, int] = {}
    for message in pending:
        if message.node not in failed:
            sent[message.node] = sent.get(message.node, 0) + 1
    return sent, failures


@dataclass
class FillResult:
    claimed: list[str] = field(default_factory=list)
    sent: int = 0
    send_failures: list[tuple[str, str]] = field(default_factory=list)


def fill_slots(
    store: PlanItems,
    queues: TaskQueues,
    key: str,
    *,
    now: float,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> FillResult:
    """Dispatches waiting nodes while `active < parallelism`: each batch of claims is one transaction,
    and its tasks are sent before the next is tried, so a claim refused later never strands nodes
    claimed before it with no task sent.

    Fillers running at once (one per status batch that freed a slot) read the waiting nodes from a
    random shard first, so they mostly claim different nodes; a claim refused by another's transaction
    or by throttling is tried again after a jittered backoff, and after `CLAIM_ATTEMPTS` refusals in a
    row `StoreRetryableError` is raised for the batch to be delivered again.
    """
    rng = rng or random.Random()
    result = FillResult()
    record = store.get_job(key)
    if record is None or record.state != JobState.RUNNING or not record.is_planned:
        return result
    parallelism = record.pull_job.spec.parallelism
    free = parallelism - record.counters.active
    fruitless = refused = 0
    while free > 0 and record.counters.waiting > 0 and fruitless < 3:
        seeds = waiting_seeds(store, record)
        if seeds is not None:
            candidates = seeds[: min(free, MAX_CLAIMS_PER_TRANSACTION)]
        else:
            # The index is eventually consistent: a listed node may be claimed already; the claim re-checks.
            candidates = store.waiting_nodes(key, limit=min(free, MAX_CLAIMS_PER_TRANSACTION),
                                             shards=record.ref.shards, start=rng.randrange(max(1, record.ref.shards)))
        if not candidates:
            break
        claimed: list[str] | None
        try:
            claimed = store.claim_tasks(record.ref, candidates, parallelism=parallelism, now=now)
        except StoreRetryableError as e:
            refused += 1
            if refused >= CLAIM_ATTEMPTS:
                raise
            log.info("job %s: %s; claiming again", key, e)
            sleep(rng.uniform(0, doubling(_CLAIM_BACKOFF_S, _CLAIM_BACKOFF_MAX_S, refused)))
            claimed = None
        if claimed:
            refused = 0
            failures = queues.send_many(record.pull_tasks(claimed))
            result.claimed += claimed
            result.send_failures += failures
            result.sent += len(claimed) - len(failures)
        fresh = store.get_job(key)
        if fresh is None or fresh.state != JobState.RUNNING or fresh.round != record.round:
            break
        if claimed is not None:
            fruitless = 0 if claimed else fruitless + 1
        record = fresh
        free = parallelism - record.counters.active
    return result


def _seed_tasks(store: PlanItems, record: StoredJob) -> dict[str, NodeTaskRecord]:
    return {n: t for n, t in store.get_tasks_of(record.ref, record.seeds).items() if t.round == record.round}


def wave_progress(store: PlanItems, record: StoredJob) -> WaveProgress | None:
    """Where the job's seed wave stands, from its seeds' node items; None for a job without one."""
    return WaveProgress.of(record.seeds, _seed_tasks(store, record)) if record.seeds else None


def waiting_seeds(store: PlanItems, record: StoredJob) -> list[str] | None:
    """While the job's seed wave runs, its seeds still waiting for a slot (the only nodes that may start);
    None once every seed has finished, or for a job without a seed wave."""
    if not record.seeds:
        return None
    tasks = _seed_tasks(store, record)
    if WaveProgress.of(record.seeds, tasks).seeded:
        return None
    return [n for n, t in sorted(tasks.items()) if t.phase is NodePhase.WAITING and t.dispatched_at is None]


def finish_if_done(store: PlanItems, key: str, *, now: float) -> bool:
    """Completes an `Always` job whose nodes have all finished (Kruise: succeeded + failed = desired)."""
    record = store.get_job(key)
    fields = record.completion(now) if record is not None else None
    return fields is not None and store.finish_job(key, fields)
