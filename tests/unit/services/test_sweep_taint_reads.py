"""The startup-taint release reads whole nodes sparingly: only nodes past their agents' deadline, newest
first and at most a bounded number per run, and a node once found without the taint is not read again by
the same process (a new node under its name is)."""

from __future__ import annotations

from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.warming import SettledNodes
from prewarm.services.budget import TimeBudget
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.cluster import make_node, recorded_reads
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
NOW = 1_800_000_000.0


def joined(name: str, ago: float, *taints: dict[str, str], uid: str = "") -> dict[str, Any]:
    node = make_node(name)
    node["metadata"]["creationTimestamp"] = format_time(NOW - ago)
    node["metadata"]["uid"] = uid or f"uid-{name}"
    node["spec"] = {"taints": [dict(t) for t in taints]}
    return node


def run(plane: ControlPlane, settled: set[str], **options: Any) -> Any:
    cluster: Any = plane.cluster  # the fake's JSON patch takes the ops as lists
    by_cluster = {"": settled}
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, cluster), now=NOW,
                   config=SweepSettings(prefix="pw", taint_grace_seconds=60), settled=SettledNodes(by_cluster),
                   **options)
    assert by_cluster[""] is settled  # the caller's set, kept
    return result


def test_only_nodes_past_the_deadline_are_read_and_each_once(plane: ControlPlane) -> None:
    # Given nodes past the deadline (900 s + 60 s), one of them tainted, and one still within it
    plane.cluster.nodes = [joined("old-clean", 5000), joined("old-stuck", 3000, TAINT), joined("young", 100, TAINT)]
    reads = recorded_reads(plane.cluster)
    settled: set[str] = set()

    # When the sweep runs twice
    first = run(plane, settled)
    second = run(plane, settled)

    # Then the first run reads the two old nodes whole (newest first) and releases the stuck one
    assert first.taints_released == ["old-stuck"] and second.taints_released == []
    assert reads == ["old-stuck", "old-clean"]
    assert settled == {"uid-old-stuck", "uid-old-clean"}
    # ... and a new node under an old name (a new uid) is read again, a node that left is forgotten
    plane.cluster.nodes = [joined("old-clean", 1000, TAINT, uid="uid-new")]
    assert run(plane, settled).taints_released == ["old-clean"]
    assert reads[-1] == "old-clean" and settled == {"uid-new"}


def test_at_most_a_run_s_share_of_nodes_is_read_and_only_while_it_has_time(plane: ControlPlane) -> None:
    from prewarm.services.schedules import release_overdue_taints

    plane.cluster.nodes = [joined(f"n{i}", 2000 + i, TAINT) for i in range(5)]
    reads = recorded_reads(plane.cluster)
    taints: Any = plane.cluster  # the fake's JSON patch takes the ops as lists
    settled: set[str] = set()
    released = release_overdue_taints(taints, taints.list_node_metadata(), now=NOW, grace=60, settled=settled,
                                      limit=2)
    assert released == ["n0", "n1"] == reads
    # A run short of time reads nothing more
    released = release_overdue_taints(taints, taints.list_node_metadata(), now=NOW, grace=60,
                                      settled=settled, budget=TimeBudget(lambda: 5.0))
    assert released == [] and reads == ["n0", "n1"]
    released = release_overdue_taints(taints, taints.list_node_metadata(), now=NOW, grace=60,
                                      settled=settled)
    assert released == ["n2", "n3", "n4"]
