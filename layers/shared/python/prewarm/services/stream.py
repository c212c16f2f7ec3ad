"""The table stream's use cases, one per event: a job to plan, a job whose deletion was asked.

Each tells the warming nodes of its job's cluster what they must have now (a `Never` job's plan or
deletion changes it), so the dispatch function calls one use case per record and nothing more.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from prewarm.domain.clusters import PROBE_SECONDS, probe_chain_runs, shown
from prewarm.domain.keys import JobKey
from prewarm.domain.registry_budget import RegistryBudgets
from prewarm.services.clusters import api_or_none
from prewarm.services.dispatch import PlanResult, plan_job
from prewarm.services.jobs import complete_deletion
from prewarm.services.ports import (
    AgentItems,
    Cluster,
    ClusterDirectory,
    ClusterError,
    ClusterProbes,
    ClusterUnavailableError,
    ImageMetadata,
    ProbeChains,
    PullSecretMirror,
    StoreError,
    StreamItems,
    TaskQueues,
    TaskSendError,
)
from prewarm.services.probes import start_probing
from prewarm.services.warming import send_required_images

log = logging.getLogger(__name__)

R = TypeVar("R")


def plan(store: StreamItems, queues: TaskQueues, clusters: ClusterDirectory, key: JobKey, *, now: float,
         secrets: PullSecretMirror | None = None, images: ImageMetadata | None = None,
         probes: ClusterProbes | None = None, budgets: RegistryBudgets | None = None,
         remove_after: int | None = None, asked_again: bool = False) -> PlanResult:
    """Selects the nodes of job `key` in its cluster and sends the first tasks; after a `Never` job's
    plan, sends the warming nodes of its cluster their lists again. `TaskSendError` when a send failed.
    `remove_after`: as `delete`'s, for the earlier image of a new round whose image changed.

    A cluster that cannot be read (its API down, throttling, denying, or not configured) does not fail the
    plan: the job is parked at once, its message says why in one line, and, given `probes`, the cluster is
    probed until it answers (`services.probes`), when its parked jobs are planned again (the sweep does too,
    in its first run in which the cluster answers). A retry would hold up every later record of the stream's
    shard, other clusters' jobs among them.

    Nor does a plan call a cluster whose probe chain runs (it failed within the last probe's spell): the
    job parks at once, so a hung cluster costs the stream one call's timeout per outage, not one per job
    and function environment (each keeps its own circuit breaker). `asked_again`: the plan a probe or the
    sweep asked for because the cluster answered, which calls it.
    """
    try:
        if not asked_again:
            _refuse_while_probed(store, key.cluster, clusters.own_name, now)
        api = clusters.api(key.cluster)
        result = plan_job(store, api, queues, key, now=now, secrets=secrets, images=images, budgets=budgets,
                          remove_after=remove_after)
    except ClusterError as e:
        parked = park(store, key, cluster_fault(shown(key.cluster, clusters.own_name), e))
        if probes is not None:
            try:
                start_probing(store, probes, key.cluster, own_name=clusters.own_name, now=now)
            except StoreError as refused:  # parked all the same: the sweep starts the probes
                log.warning("cluster %s's probes not started: %s", key.cluster or "(own)", refused)
        return parked
    if result.changes_warming:
        result.send_failures += _warming_lists(store, queues, api, key, now=now)
    result.raise_for_send_failures()
    return result


def _refuse_while_probed(store: ProbeChains, cluster: str, own_name: str, now: float) -> None:
    name = shown(cluster, own_name)
    if probe_chain_runs(store.probe_due(name), now):
        raise ClusterUnavailableError(f"it did not answer its last probe (probed every {PROBE_SECONDS} s)")


def cluster_fault(cluster: str, error: ClusterError) -> str:
    """How a cluster's failure reads on its job: one line that names the cluster (`cluster` as people know
    it, "" for a stack's own without a name)."""
    text = str(error)
    named = f"cluster {cluster}" if cluster else "the stack's own cluster"
    return text if cluster and cluster in text else f"{named} cannot be read: {text}"


def park(store: AgentItems, key: JobKey, why: str) -> PlanResult:
    """Job `key`'s current plan waits for its cluster: the job says why and that it is planned as soon as
    the cluster answers (`StoredJob.is_parked`; a probe of the cluster, or the sweep, asks for the plan)."""
    note = f"{why}; planned as soon as it answers"
    with contextlib.suppress(StoreError):  # not parked: the sweep re-plans it later all the same (its age)
        record = store.get_job(key)
        if record is not None and not record.is_planned:
            store.set_job_fields(key, {"placement_note": note, "parked": record.plan_id})
    log.warning("job %s parked: %s", key, why)
    return PlanResult(key, f"parked: {why}")


def _warming_lists(store: AgentItems, queues: TaskQueues, api: Cluster, key: JobKey, *, now: float
                   ) -> list[tuple[str, str]]:
    """The warming nodes of the job's cluster told their lists again; a cluster that fails meanwhile leaves
    them their last list (logged), rather than holding up the stream's shard."""
    try:
        return send_required_images(store, queues, api, now=now, cluster_name=key.cluster)
    except ClusterError as e:
        log.warning("warming nodes of cluster %s not told their lists after %s: %s", key.cluster or "(own)", key, e)
        return []


def delete(store: AgentItems, queues: TaskQueues, clusters: ClusterDirectory, key: JobKey, *, now: float,
           remove_after: int | None = None) -> int:
    """Cancels a deleted job's in-flight pulls, releases its images (`remove_after`: seconds until those no
    job wants are removed; None: never) and removes its items, then sends the warming nodes of its
    cluster their lists again (they no longer wait for its image). Returns the cancels sent;
    `TaskSendError` when a send failed (the stream retries the record, the items still there)."""
    cancels = complete_deletion(store, queues, key, remove_after=remove_after)
    try:
        failures = send_required_images(store, queues, api_or_none(clusters, key.cluster), now=now,
                                        cluster_name=key.cluster)
    except ClusterError as e:  # deleted all the same: the warming nodes keep their last list
        log.warning("warming nodes of cluster %s not told that %s is deleted: %s", key.cluster or "(own)", key, e)
        failures = []
    if failures:
        raise TaskSendError(failures)
    return cancels


def each_item_in_order(records: Sequence[R], item: Callable[[R], str], handle: Callable[[R], None]) -> R | None:
    """Handles a stream batch: each item's records in order, the items side by side (one thread each), so a
    plan waiting on a slow or hung cluster holds up no other job of the batch; the stream orders records
    only within an item. An item's records stop at its first failure. Returns the batch's earliest failed
    record, where the stream retries from (the records after it, of other items too, come again: every
    handling of a record is idempotent, as at-least-once delivery asks); None when all were handled."""
    groups: dict[str, list[tuple[int, R]]] = {}
    for index, record in enumerate(records):
        groups.setdefault(item(record), []).append((index, record))
    failed: list[int] = []

    def run(group: list[tuple[int, R]]) -> None:
        for index, record in group:
            try:
                handle(record)
            except Exception:  # noqa: BLE001 - the stream retries from it (`handle` logs why)
                failed.append(index)
                return

    if len(groups) == 1:
        run(next(iter(groups.values())))
    else:
        threads = [threading.Thread(target=run, args=(group,), name="stream-item", daemon=True)
                   for group in groups.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return records[min(failed)] if failed else None
