"""The sweep fits its minute however many jobs there are: fail-open and departures run before the jobs,
the job loop stops starting jobs when the run is short of time, a settled job is not read beyond its
item, and a running job's nodes in flight are read once, through the sparse index, for silence and
re-sends alike (issue 35, "a sweep that fits at full scale")."""

from __future__ import annotations

import collections
from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.messages import Hello
from prewarm.services.budget import TimeBudget
from prewarm.services.jobs import apply_manifest
from prewarm.services.reports import register_node
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


class CountingStore:
    """The plane's store, counting the node item reads by method and job."""

    def __init__(self, store: Any, on_read: Any = None) -> None:
        self._store = store
        self.reads: collections.Counter[tuple[str, str]] = collections.Counter()
        self._on_read = on_read

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name not in ("get_tasks", "in_flight_tasks", "get_tasks_of", "waiting_nodes"):
            return attribute

        def counted(first: Any, *args: Any, **kwargs: Any) -> Any:
            self.reads[(name, getattr(first, "key", first))] += 1
            if self._on_read is not None:
                self._on_read()
            return attribute(first, *args, **kwargs)

        return counted


def nodes(plane: ControlPlane, count: int) -> list[str]:
    names = [f"n{i:02d}" for i in range(count)]
    for name in names:
        plane.cluster.nodes.append(make_node(name))
        plane.queues.ensure_queue(name)
        register_node(plane.store, plane.queues, None, Hello(node=name), now=plane.now())
    return names


def running_jobs(plane: ControlPlane, names: list[str]) -> None:
    """`done` (Always, every node succeeded: completed), `quiet` (Never, every node succeeded: running,
    settled) and `busy` (Never, two nodes pulling, the rest succeeded)."""
    for job, policy in (("done", "Always"), ("quiet", "Never"), ("busy", "Never")):
        apply_manifest(plane.store, job_doc(job, completionPolicy={"type": policy}, parallelism=len(names)),
                       now=plane.now())
        plane.plan(job)
        for node in names:
            plane.report(job, node, "Pulling")
            if job != "busy" or node not in ("n03", "n07"):
                plane.report(job, node, "Succeeded")


def test_settled_jobs_are_not_read_and_a_running_jobs_nodes_in_flight_are_read_once(plane: ControlPlane) -> None:
    names = nodes(plane, 20)
    running_jobs(plane, names)
    counting = CountingStore(plane.store)

    # When the sweep runs
    result = sweep(counting, plane.queues, clusters_of(plane.store, plane.cluster), now=plane.now(),
                   config=SweepSettings(prefix="pw", no_agent_grace_seconds=120))

    # Then the completed job and the settled Never job are not read beyond their job items, and the busy
    # job's two nodes in flight are read once, not all its node items twice
    assert dict(counting.reads) == {("in_flight_tasks", "default/busy"): 1}
    assert result.jobs_read == 1 and result.jobs_deferred == 0


def test_fail_open_happens_first_and_the_job_loop_stops_when_the_run_is_short_of_time(plane: ControlPlane) -> None:
    names = nodes(plane, 20)
    running_jobs(plane, names)
    for job in ("more-1", "more-2", "more-3"):
        apply_manifest(plane.store, job_doc(job, completionPolicy={"type": "Never"}), now=plane.now())
        plane.plan(job)
    now = plane.now()
    # A node that joined with the startup taint 20 minutes ago and whose agent never removed it
    stuck = make_node("stuck")
    stuck["metadata"]["creationTimestamp"] = format_time(now - 1200)
    stuck["spec"] = {"taints": [dict(TAINT)]}
    plane.cluster.nodes.append(stuck)
    # A run whose time goes with each job's read of its nodes: 20 s each, of a 55 s budget
    left = [55.0]
    counting = CountingStore(plane.store, on_read=lambda: left.__setitem__(0, left[0] - 20))

    result = sweep(counting, plane.queues, clusters_of(plane.store, plane.cluster), now=now,
                   config=SweepSettings(prefix="pw", job_workers=1), budget=TimeBudget(lambda: left[0]))

    # Then the taint is released though the jobs take more than the run has ...
    assert result.taints_released == ["stuck"]
    # ... and the job loop started no job once less than the reserve was left: the rest wait for the next run
    assert result.jobs_read == 3 and result.jobs_deferred >= 1
