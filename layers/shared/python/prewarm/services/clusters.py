"""Work on every cluster a stack serves, side by side, and how each cluster answered.

The schedules (the sweep, the resource sync, the credential refresh) each do one cluster's work at a time
through `on_each_cluster`: the clusters run side by side, so a cluster whose API hangs until its timeouts
keeps none of the others waiting, and a cluster whose API fails is named with why and keeps none of the
others from their work. `record_health` writes on each cluster's item how it answered (`prewarm cluster
list`, `prewarm doctor`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from prewarm.domain.clusters import DEFAULT_CLUSTER, shown
from prewarm.services.ports import (
    ClusterApi,
    ClusterConfigError,
    ClusterDirectory,
    ClusterError,
    ClusterItems,
    ClusterUnavailableError,
)

log = logging.getLogger(__name__)

# Clusters worked on at once (each may run a pool of its own, as the sweep's deletions do).
CLUSTERS_AT_ONCE = 4

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterRun(Generic[T]):
    """One cluster's part of a run: what the work returned, or why the cluster failed (`error`)."""

    name: str
    started: float
    outcome: T | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None


def on_each_cluster(clusters: ClusterDirectory, work: Callable[[str, ClusterApi], T], *, clock: Callable[[], float],
                    own_optional: bool = False) -> list[ClusterRun[T]]:
    """`work(name, api)` on every cluster served (`""` for the stack's own), side by side; a cluster
    whose API cannot be built or fails with a `ClusterError` has its `error` instead of an outcome.

    `own_optional`: a stack's own cluster without Kubernetes access configured is left out, not failed
    (its jobs are still served; only what needs its API is not done)."""
    served = [c.name for c in clusters.served()]

    def one(name: str) -> ClusterRun[T] | None:
        started = clock()
        try:
            api = clusters.api(name)
        except ClusterConfigError as e:
            if name == DEFAULT_CLUSTER and own_optional:
                return None
            return ClusterRun(name, started, error=str(e))
        except ClusterError as e:
            return ClusterRun(name, started, error=str(e))
        try:
            return ClusterRun(name, started, outcome=work(name, api))
        except ClusterError as e:
            log.warning("cluster %s: %s", name or "(the stack's own)", e)
            return ClusterRun(name, started, error=str(e))

    with ThreadPoolExecutor(max_workers=max(1, min(len(served), CLUSTERS_AT_ONCE))) as pool:
        return [run for run in pool.map(one, served) if run is not None]


def unreachable(runs: Sequence[ClusterRun[T]]) -> dict[str, str]:
    """Name → why, of the clusters that failed."""
    return {run.name: run.error for run in runs if run.error is not None}


def record_health(store: ClusterItems, clusters: ClusterDirectory, runs: Sequence[ClusterRun[T]], *,
                  agents: Mapping[str, int] | None = None, synced: bool = False) -> None:
    """How each cluster answered, on its item: the stack's own under its `ClusterName` (not at all when it
    has none). `agents`: per cluster, its nodes whose agents said hello; `synced`: a resource sync, whose
    time is the cluster's last sync when it answered."""
    for run in runs:
        if not (run.name or clusters.own_name):
            continue
        store.record_cluster_check(run.name or clusters.own_name, reachable=run.answered, reason=run.error or "",
                                   checked_at=run.started, agents=(agents or {}).get(run.name),
                                   synced=synced and run.answered, own=run.name == DEFAULT_CLUSTER)


def raise_if_own_unreachable(failed: Mapping[str, str], clusters: ClusterDirectory, what: str) -> None:
    """`ClusterUnavailableError` when the stack's own cluster is among the `failed`, so the schedule's run
    fails (its retry and `prewarm doctor` see it); the other clusters' work stands."""
    if (own := failed.get(DEFAULT_CLUSTER)) is not None:
        raise ClusterUnavailableError(
            f"the stack's own cluster {shown(DEFAULT_CLUSTER, clusters.own_name)!r} was not {what}: {own}")


def api_or_none(clusters: ClusterDirectory, name: str = DEFAULT_CLUSTER) -> ClusterApi | None:
    """The API of cluster `name`, or None when it cannot be built (no Kubernetes access configured, or
    not registered): a hello then speaks for its node."""
    try:
        return clusters.api(name)
    except ClusterConfigError:
        return None
