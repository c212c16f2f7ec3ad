"""A missing agent never blocks a node: the sweep removes a startup taint no agent removed by its deadline
(the agents' ConfigMap: MAX_WARM_SECONDS from the node's join) plus StartupTaintGraceSeconds, with an
Event on the node; a node within its deadline, or holding other taints only, is left alone."""

from __future__ import annotations

from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.warming import FAIL_OPEN_EVENT_REASON
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "gpu", "value": "true", "effect": "NoSchedule"}


def joined(name: str, at: float, *taints: dict[str, str]) -> dict[str, Any]:
    node = make_node(name)
    node["metadata"]["creationTimestamp"] = format_time(at)
    node["spec"] = {"taints": [dict(t) for t in taints]}
    return node


def taints_of(plane: ControlPlane, name: str) -> list[dict[str, Any]]:
    node = plane.cluster.get_node(name)
    assert node is not None
    return list(node["spec"]["taints"])


def run(plane: ControlPlane, now: float, grace: float = 60) -> Any:
    return sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=now,
                 config=SweepSettings(prefix="pw", taint_grace_seconds=grace))


def test_overdue_taints_go_and_others_stay(plane: ControlPlane) -> None:
    now = 1_800_000_000.0
    # Given install's ConfigMap (a 300 s deadline) and nodes that joined at different times
    plane.cluster.config_maps[("prewarm-system", "prewarm-agent")] = {
        "data": {"MAX_WARM_SECONDS": "300", "STARTUP_TAINT_KEY": "prewarm.dev/warming",
                 "STARTUP_TAINT_EFFECT": "NoSchedule"}}
    plane.cluster.nodes = [
        joined("stuck", now - 361, OTHER, TAINT),  # past 300 s + 60 s: no agent removed it
        joined("within-grace", now - 359, TAINT),  # its agent may still remove it
        joined("untainted", now - 3600, OTHER),  # joined long ago, holds other taints only
    ]

    # When the sweep runs
    result = run(plane, now)

    # Then only the overdue node loses the startup taint, and keeps its other taint
    assert result.taints_released == ["stuck"]
    assert taints_of(plane, "stuck") == [OTHER]
    assert taints_of(plane, "within-grace") == [TAINT]
    assert taints_of(plane, "untainted") == [OTHER]
    # ... with a Warning Event on the node saying why
    (event,) = plane.cluster.events
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == (FAIL_OPEN_EVENT_REASON, "Warning",
                                                                                   "stuck")
    assert event["message"] == ("no Prewarm agent removed the startup taint prewarm.dev/warming:NoSchedule within "
                                "6m of the node's join (maxWarmSeconds 300); taint removed so pods can schedule")
    # And the next sweep has nothing more to do
    assert run(plane, now + 60).taints_released == ["within-grace"]
    assert run(plane, now + 120).taints_released == []


def test_without_the_agents_config_map_the_defaults_apply(plane: ControlPlane) -> None:
    now = 1_800_000_000.0
    plane.cluster.nodes = [joined("a", now - 900 - 61, TAINT), joined("b", now - 900 - 59, TAINT)]
    assert run(plane, now).taints_released == ["a"]  # 900 s (install's default) + 60 s


def test_a_node_that_changed_meanwhile_is_left_to_the_next_sweep(plane: ControlPlane) -> None:
    now = 1_800_000_000.0
    plane.cluster.nodes = [joined("a", now - 3600, TAINT)]

    def race(name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        # Another controller changed the taints between the list and the patch: the guarded patch fails
        plane.cluster.nodes[0]["spec"]["taints"].insert(0, dict(OTHER))
        plane.cluster.patch_node = original  # type: ignore[method-assign]
        return original(name, ops)

    original = plane.cluster.patch_node
    plane.cluster.patch_node = race  # type: ignore[method-assign]
    assert run(plane, now).taints_released == []
    assert run(plane, now).taints_released == ["a"]
    assert taints_of(plane, "a") == [OTHER]


def test_a_node_gone_since_the_list_or_an_api_that_is_busy_never_fails_the_sweep(plane: ControlPlane) -> None:
    from prewarm.services.ports import ClusterUnavailableError

    now = 1_800_000_000.0
    plane.cluster.nodes = [joined("a", now - 3600, TAINT), joined("b", now - 3600, TAINT)]
    listed = list(plane.cluster.nodes)
    plane.cluster.list_nodes = lambda *_, **__: listed  # type: ignore[method-assign]
    # Given node a scaled in between the list and the patch
    plane.cluster.nodes = plane.cluster.nodes[1:]
    assert run(plane, now).taints_released == ["b"]

    # Given the API overloaded (429): what was released stands, the rest waits for the next sweep
    plane.cluster.nodes = [joined("c", now - 3600, TAINT)]
    listed[:] = plane.cluster.nodes

    def busy(name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        raise ClusterUnavailableError("429 TooManyRequests", status=429, reason="TooManyRequests")

    plane.cluster.patch_node = busy  # type: ignore[method-assign]
    result = run(plane, now)
    assert result.taints_released == []
    assert taints_of(plane, "c") == [TAINT]


def ready_at(node: dict[str, Any], at: float | None) -> dict[str, Any]:
    node["status"] = {"conditions": [{"type": "Ready", "status": "True" if at is not None else "False",
                                      "lastTransitionTime": format_time(at if at is not None else 0)}]}
    return node


def test_a_ready_node_no_agent_said_hello_from_is_released_after_the_no_agent_grace(plane: ControlPlane) -> None:
    from prewarm.domain.nodes import RegisteredNode

    now = 1_800_000_000.0
    # Given nodes that joined with the startup taint 5 minutes ago (the agents' deadline is 900 s)
    plane.cluster.nodes = [
        ready_at(joined("no-agent", now - 300, TAINT), now - 121),  # Ready for 121 s, no hello
        ready_at(joined("agent-said-hello", now - 300, TAINT), now - 200),  # its agent is warming it
        ready_at(joined("not-ready", now - 300, TAINT), None),  # the kubelet is not Ready yet
        ready_at(joined("just-ready", now - 300, TAINT), now - 119),  # within the grace
        ready_at(joined("old-hello", now - 300, TAINT), now - 200),  # a hello from before its join: another node's
    ]
    for name, hello in (("agent-said-hello", now - 100), ("old-hello", now - 3600)):
        plane.store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux", queue_url="q",
                                            last_hello=hello))

    # When the sweep runs with NoAgentGraceSeconds 120
    def sweep_at(at: float) -> Any:
        return sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=at,
                     config=SweepSettings(prefix="pw", no_agent_grace_seconds=120))

    result = sweep_at(now)

    # Then the Ready nodes without a hello lose the taint at once, not 900 s + grace after their join
    assert sorted(result.taints_released) == ["no-agent", "old-hello"]
    assert taints_of(plane, "agent-said-hello") == taints_of(plane, "not-ready") == [TAINT]
    assert taints_of(plane, "just-ready") == [TAINT]
    assert "no Prewarm agent said hello within 120s of the node becoming Ready" in plane.cluster.events[0]["message"]
    # And a node still within the grace is released by the next run, one not Ready once it is
    assert sweep_at(now + 60).taints_released == ["just-ready"]
    ready_at(next(n for n in plane.cluster.nodes if n["metadata"]["name"] == "not-ready"), now + 60)
    assert sweep_at(now + 120).taints_released == []
    assert sweep_at(now + 240).taints_released == ["not-ready"]
    assert taints_of(plane, "agent-said-hello") == [TAINT]
