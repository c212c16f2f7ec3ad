"""Work on every cluster a stack serves, side by side, and how each cluster answered.

The schedules (the sweep, the resource sync, the credential refresh) each do one cluster's work at a time
through `on_each_cluster`: every cluster runs on a thread of its own, and one still running at its deadline
counts as unreachable ("did not answer within N s") while the caller goes on without it, so a cluster whose
API hangs keeps none of the others waiting; a cluster whose API fails is named with why and keeps none of the
others from their work. `record_health` writes on each cluster's item how it answered (`prewarm cluster
list`, `prewarm doctor`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prewarm.domain.clusters import DEFAULT_CLUSTER, ClusterReach, shown
from prewarm.services.ports import (
    ClusterApi,
    ClusterConfigError,
    ClusterDirectory,
    ClusterError,
    ClusterItems,
    ClusterUnavailableError,
)

log = logging.getLogger(__name__)

# Clusters worked on at once (each may run a pool of its own, as the sweep's deletions do): as many as a stack
# serves, up to this; one more waits for a slot, and its deadline starts when it gets one.
CLUSTERS_AT_ONCE = 32
# How long one cluster's work may run before the caller goes on without it (the schedules run for 55 s).
CLUSTER_DEADLINE_SECONDS = 30.0

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
                    own_optional: bool = False, deadline: float = CLUSTER_DEADLINE_SECONDS) -> list[ClusterRun[T]]:
    """`work(name, api)` on every cluster served (`""` for the stack's own), side by side; a cluster
    whose API cannot be built or fails with a `ClusterError` has its `error` instead of an outcome, and so
    has one whose work is still running `deadline` seconds after it started ("did not answer within N s"):
    the caller goes on without it, its thread left to end on its own (a daemon: it holds up no exit).

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

    return _side_by_side(served, one, clock=clock, deadline=deadline)


def _side_by_side(served: Sequence[str], one: Callable[[str], ClusterRun[T] | None], *, clock: Callable[[], float],
                  deadline: float) -> list[ClusterRun[T]]:
    """`one(name)` for each cluster on a daemon thread of its own (`CLUSTERS_AT_ONCE` at most at once), waited
    for until it returns or has run `deadline` seconds; in the order of `served`."""
    done = threading.Condition()
    slots = threading.BoundedSemaphore(max(1, min(len(served), CLUSTERS_AT_ONCE)))
    began: dict[str, tuple[float, float]] = {}  # name -> (monotonic start, the caller's clock at start)
    ended: dict[str, ClusterRun[T] | None] = {}
    # Anything but a cluster's failure (the store's errors, a bug) is raised to the caller, as on its own thread.
    failures: list[Exception] = []

    def run(name: str) -> None:
        with slots:
            with done:
                began[name] = (time.monotonic(), clock())
                done.notify_all()
            outcome: ClusterRun[T] | None = None
            try:
                outcome = one(name)
            except Exception as e:  # noqa: BLE001 (raised again on the caller's thread, below)
                failures.append(e)
            finally:
                with done:
                    ended[name] = outcome
                    done.notify_all()

    for name in served:
        threading.Thread(target=run, args=(name,), name=f"cluster-{name or 'own'}", daemon=True).start()
    late: dict[str, ClusterRun[T]] = {}
    with done:
        while True:
            now = time.monotonic()
            for name, (at, started) in began.items():
                if name not in ended and name not in late and now - at >= deadline:
                    log.warning("cluster %s did not answer within %g s: going on without it",
                                name or "(the stack's own)", deadline)
                    late[name] = ClusterRun(name, started, error=f"did not answer within {deadline:g} s")
            waiting = [n for n in served if n not in ended and n not in late]
            if not waiting:
                break
            running = [began[n][0] + deadline - now for n in waiting if n in began]
            done.wait(timeout=max(0.001, min(running)) if running else None)
    if failures:
        raise failures[0]
    runs = [late.get(name) or ended.get(name) for name in served]
    return [r for r in runs if r is not None]


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


def batch_apis(clusters: ClusterDirectory) -> Callable[[str], ClusterApi | None]:
    """`api_or_none` for one batch: each cluster's API built once, however many of its messages ask (a
    registered cluster's is looked up in the table)."""
    apis: dict[str, ClusterApi | None] = {}

    def api(name: str) -> ClusterApi | None:
        if name not in apis:
            apis[name] = api_or_none(clusters, name)
        return apis[name]

    return api


def reach_cluster(clusters: ClusterDirectory, name: str) -> ClusterReach:
    """GET `/version` of cluster `name` (registered, or the stack's own by its `ClusterName`) through
    `clusters`, as the stack's functions reach it: the version it reported, or why it could not be reached,
    in one line (`prewarm cluster add` checks it before installing)."""
    cluster = DEFAULT_CLUSTER if name == clusters.own_name else name
    try:
        return ClusterReach.of_version(name, clusters.api(cluster).get_version())
    except ClusterError as e:
        return ClusterReach(name, error=" ".join(str(e).split()), unauthorized=e.status == 401)
