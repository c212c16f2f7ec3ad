"""What Prewarm says of a node: whether its agent is there and talking, and what holds its startup taint
or removed it, and when (issue #25)."""

from __future__ import annotations

from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.node_state import (
    AgentState,
    TaintRelease,
    TaintState,
    node_state,
    node_states,
    taint_releases,
)
from prewarm.domain.nodes import NodeWarm, RegisteredNode
from prewarm.domain.warming import (
    FAIL_OPEN_EVENT_REASON,
    StartupTaint,
    WarmLimits,
    node_event,
    overdue_seconds,
    sweep_release_at,
)
from tests.support.cluster import make_node

NOW = 1_800_000_000.0
LIMITS = WarmLimits(max_warm_seconds=900)
GRACE = 60.0
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def node(name: str = "n1", *, joined: float = NOW - 100, taint: bool = True, **labels: str) -> dict[str, Any]:
    obj = make_node(name, **labels)
    obj["metadata"]["creationTimestamp"] = format_time(joined)
    if taint:
        obj.setdefault("spec", {})["taints"] = [dict(TAINT)]
    return obj


def registered(name: str = "n1", *, warm_until: float | None = None, warm: NodeWarm | None = None) -> RegisteredNode:
    return RegisteredNode(name=name, labels={"pool": "gpu"}, architecture="arm64", os="linux", queue_url="q",
                          last_hello=NOW - 90, warm_until=warm_until, warm=warm)


def state(obj: dict[str, Any] | None, reg: RegisteredNode | None, **kwargs: Any) -> Any:
    return node_state("n1", obj, reg, cluster_read=True, limits=LIMITS, grace=GRACE, now=NOW, **kwargs)


def test_a_tainted_node_whose_agent_holds_the_taint_is_warming_until_its_agents_deadline() -> None:
    found = state(node(), registered(warm_until=NOW + 800))
    assert (found.agent, found.taint, found.agent_deadline) == (AgentState.REGISTERED, TaintState.WARMING, NOW + 800)
    assert found.architecture == "arm64" and found.labels == {"pool": "gpu"}


def test_a_tainted_node_with_no_agent_says_when_the_sweep_removes_the_taint() -> None:
    # Given a node that joined 100 s ago with the taint, and no agent has said hello from it
    found = state(node(joined=NOW - 100), None)
    # Then it has no agent, and the sweep removes the taint NoAgentGraceSeconds after it became Ready (here
    # at its join: the condition has no transition time) ...
    assert (found.agent, found.taint, found.in_cluster) == (AgentState.ABSENT, TaintState.NO_AGENT, True)
    assert found.sweep_at == NOW - 100 + 120
    # ... and from a node that is not Ready, at join + maxWarmSeconds + grace
    not_ready = node(joined=NOW - 100)
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert state(not_ready, None).sweep_at == NOW - 100 + 900 + GRACE
    assert found.architecture == "amd64"  # from the Node's labels


def test_the_time_said_is_the_sweeps_own_rule() -> None:
    # The sweep removes the taint exactly when get nodes says it will
    obj = node(joined=NOW - 1000)
    at = sweep_release_at(obj, LIMITS, grace=GRACE)
    assert at is not None
    assert overdue_seconds(obj, LIMITS, grace=GRACE, now=at) is None
    assert overdue_seconds(obj, LIMITS, grace=GRACE, now=at + 1) == at + 1 - (NOW - 1000)
    assert sweep_release_at({"metadata": {"name": "x"}}, LIMITS, grace=GRACE) is None


def test_a_taint_held_past_its_agents_deadline_is_overdue() -> None:
    found = state(node(joined=NOW - 950), registered(warm_until=NOW - 50))
    assert (found.taint, found.agent_deadline, found.sweep_at) == (TaintState.OVERDUE, NOW - 50, NOW + 10)
    # ... and so is one whose agent's hello did not take it (another taint configured, an older agent)
    assert state(node(), registered(warm_until=None)).taint is TaintState.OVERDUE


def test_a_taint_the_sweep_removed_is_released_with_the_events_reason() -> None:
    # Given the sweep's Event on a node with no agent, the taint gone
    event = node_event("n1", reason=FAIL_OPEN_EVENT_REASON, message="no Prewarm agent removed it", component="s",
                       at=NOW - 30)
    releases = taint_releases([event, node_event("n2", reason="Other", message="x", component="s", at=NOW)])
    found = state(node(taint=False), None, release=releases["n1"])
    # Then the node says the sweep removed it, when and why
    assert set(releases) == {"n1"}
    assert found.taint is TaintState.RELEASED and found.release == TaintRelease("n1", NOW - 30,
                                                                                "no Prewarm agent removed it")
    assert found.agent is AgentState.ABSENT


def test_the_latest_sweep_event_of_a_node_counts() -> None:
    events = [node_event("n1", reason=FAIL_OPEN_EVENT_REASON, message=m, component="s", at=t)
              for m, t in (("late", NOW - 10), ("early", NOW - 500))]
    assert taint_releases(events)["n1"].message == "late"


def test_an_agent_that_warmed_after_the_sweeps_release_is_judged_by_its_own_report() -> None:
    warm = NodeWarm(joined_at=NOW - 100, hello_at=NOW - 20, warm_at=NOW - 5, outcome="warm")
    found = state(node(taint=False), registered(warm=warm), release=TaintRelease("n1", NOW - 50, "m"))
    assert found.taint is TaintState.WARM


def test_how_the_agent_removed_the_taint() -> None:
    timeout = NodeWarm(joined_at=NOW - 1000, hello_at=NOW - 990, warm_at=NOW - 100, outcome="timeout")
    assert state(node(taint=False), registered(warm=timeout)).taint is TaintState.TIMEOUT
    assert state(node(taint=False), registered()).taint is TaintState.NONE


def test_a_node_whose_pulls_went_silent_has_an_agent_not_reporting() -> None:
    found = state(node(taint=False), registered(), silent_pulls=2)
    assert (found.agent, found.silent_pulls) == (AgentState.NOT_REPORTING, 2)


def test_another_taint_key_is_the_agents_configmaps() -> None:
    limits = WarmLimits(taint=StartupTaint("example.com/cold", "NoSchedule"), max_warm_seconds=60)
    found = node_state("n1", node(), None, cluster_read=True, limits=limits, grace=0, now=NOW)
    assert found.taint is TaintState.NONE  # prewarm.dev/warming is not this cluster's startup taint


def test_without_the_cluster_the_agents_word_is_all_there_is() -> None:
    # Given the cluster was not read: only registered nodes, judged by their hello
    states = node_states(None, [registered("a", warm_until=NOW + 10), registered("b", warm_until=NOW - 10)],
                         limits=LIMITS, grace=GRACE, now=NOW)
    assert [(s.name, s.taint, s.in_cluster) for s in states] == [("a", TaintState.WARMING, None),
                                                                 ("b", TaintState.OVERDUE, None)]


def test_every_node_of_the_cluster_and_every_registered_one_is_listed_once() -> None:
    states = node_states([node("a"), node("b", taint=False)], [registered("b"), registered("gone")],
                         limits=LIMITS, grace=GRACE, now=NOW, silent_pulls={"b": 1})
    assert [(s.name, s.agent, s.in_cluster) for s in states] == [
        ("a", AgentState.ABSENT, True), ("b", AgentState.NOT_REPORTING, True), ("gone", AgentState.REGISTERED, False)]
