"""What Prewarm says of a node (`prewarm get nodes`): whether an agent is there and talking, and what
holds its startup taint, or what removed it, and when.

Judged at the time of viewing from what the cluster and the table hold: the Node object (its taints and
creation time), the registration its agent's hello made (`RegisteredNode`), the sweep's Event when the
sweep removed the taint (`FAIL_OPEN_EVENT_REASON`), and how many of the node's pulls have gone silent
(`liveness.is_silent`). Nothing is written to show it. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from prewarm.domain.boot import WarmCondition, node_condition
from prewarm.domain.intervals import NO_AGENT_GRACE_SECONDS
from prewarm.domain.kubernetes import parse_time
from prewarm.domain.nodes import NodeWarm, RegisteredNode
from prewarm.domain.placement import ARCH_LABEL, OS_LABEL
from prewarm.domain.warming import FAIL_OPEN_EVENT_REASON, WarmLimits, ready_since, sweep_release_at


class AgentState(StrEnum):
    """Whether the node has an agent, as far as the table tells."""

    # Its agent said hello, and no pull it holds has gone silent (an idle agent sends nothing).
    REGISTERED = "Registered"
    # A pull it holds has had no report for `SILENT_AFTER_SECONDS`: the agent is gone or cut off.
    NOT_REPORTING = "NotReporting"
    # No agent has said hello from this node: the DaemonSet has no pod here, or it never got going.
    ABSENT = "Absent"


class TaintState(StrEnum):
    """The node's startup taint: who holds it and until when, or how it came off."""

    NONE = "none"  # not held, and nothing says it was
    WARMING = "warming"  # held by its agent until the images are present, `agent_deadline` at the latest
    OVERDUE = "overdue"  # held, an agent registered, but its deadline passed or it does not hold it
    NO_AGENT = "no agent"  # held, and no agent has said hello: the sweep removes it at `sweep_at`
    WARM = "warm"  # its agent removed it, every image present
    TIMEOUT = "timeout"  # its agent removed it at maxWarmSeconds with images missing
    RELEASED = "released"  # the sweep removed it: no agent did in time (`release` is its Event)


@dataclass(frozen=True)
class TaintRelease:
    """The sweep's Event on a node whose startup taint it removed: when, and its message."""

    node: str
    at: float
    message: str


@dataclass(frozen=True)
class NodeState:
    """One node as `prewarm get nodes` shows it.

    `in_cluster` is None when the cluster was not read (then only registered nodes are known, and the
    taint is judged from what their agents said). `agent_deadline` is the agent's own (its hello's
    `warm_until`); `sweep_at` when the sweep removes a taint no agent removed (the node's join plus
    maxWarmSeconds and the grace; with no hello, NoAgentGraceSeconds after the node became Ready when
    that is sooner), None when the node carries no creation time.
    """

    name: str
    agent: AgentState
    taint: TaintState
    registered: RegisteredNode | None = None
    labels: Mapping[str, str] | None = None
    in_cluster: bool | None = None
    silent_pulls: int = 0
    agent_deadline: float | None = None
    sweep_at: float | None = None
    release: TaintRelease | None = None
    condition: WarmCondition | None = None  # the Node's PrewarmWarm condition (None: not set, or not read)

    @property
    def architecture(self) -> str:
        return self.registered.architecture if self.registered else (self.labels or {}).get(ARCH_LABEL, "")

    @property
    def os(self) -> str:
        return self.registered.os if self.registered else (self.labels or {}).get(OS_LABEL, "")


def taint_releases(events: Iterable[Mapping[str, Any]]) -> dict[str, TaintRelease]:
    """The sweep's latest Event per node among `events` (others are ignored)."""
    latest: dict[str, TaintRelease] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        if event.get("reason") != FAIL_OPEN_EVENT_REASON or involved.get("kind") != "Node":
            continue
        at = parse_time(event.get("lastTimestamp")) or parse_time(event.get("firstTimestamp"))
        node = str(involved.get("name") or "")
        if at is None or not node:
            continue
        if node not in latest or latest[node].at < at:
            latest[node] = TaintRelease(node=node, at=at, message=str(event.get("message") or ""))
    return latest


def node_states(
    nodes: Sequence[Mapping[str, Any]] | None,
    registered: Iterable[RegisteredNode],
    *,
    limits: WarmLimits,
    grace: float,
    now: float,
    releases: Mapping[str, TaintRelease] | None = None,
    silent_pulls: Mapping[str, int] | None = None,
    no_agent_grace: float | None = NO_AGENT_GRACE_SECONDS,
) -> list[NodeState]:
    """Every node of the cluster (`nodes`, None when it was not read) and every registered one, by name."""
    by_name = {r.name: r for r in registered}
    objects = {str((n.get("metadata") or {}).get("name") or ""): n for n in nodes or ()}
    names = sorted(set(by_name) | (set(objects) - {""}))
    return [
        node_state(name, objects.get(name), by_name.get(name), cluster_read=nodes is not None, limits=limits,
                   grace=grace, now=now, release=(releases or {}).get(name),
                   silent_pulls=(silent_pulls or {}).get(name, 0), no_agent_grace=no_agent_grace)
        for name in names
    ]


def node_state(
    name: str,
    node: Mapping[str, Any] | None,
    registered: RegisteredNode | None,
    *,
    cluster_read: bool,
    limits: WarmLimits,
    grace: float,
    now: float,
    release: TaintRelease | None = None,
    silent_pulls: int = 0,
    no_agent_grace: float | None = NO_AGENT_GRACE_SECONDS,
) -> NodeState:
    """What holds or held `name`'s startup taint and whether its agent talks (see the module)."""
    if registered is None:
        agent = AgentState.ABSENT
    else:
        agent = AgentState.NOT_REPORTING if silent_pulls else AgentState.REGISTERED
    labels = registered.labels if registered else (node or {}).get("metadata", {}).get("labels") or {}
    state = NodeState(name=name, agent=agent, taint=TaintState.NONE, registered=registered, labels=dict(labels),
                      in_cluster=(node is not None) if cluster_read else None, silent_pulls=silent_pulls,
                      agent_deadline=registered.warm_until if registered else None,
                      condition=node_condition(node) if node is not None else None)
    warm = registered.warm if registered else None
    if node is None:
        # The cluster was not read, or the node left it: what its agent said is all there is.
        if warm is not None:
            return replace(state, taint=_outcome(warm))
        if state.agent_deadline is None:
            return state
        return replace(state, taint=TaintState.WARMING if now < state.agent_deadline else TaintState.OVERDUE)
    if limits.taint.held_by(node):
        if registered is None:
            taint = TaintState.NO_AGENT
        elif state.agent_deadline is not None and now < state.agent_deadline:
            taint = TaintState.WARMING
        else:
            taint = TaintState.OVERDUE
        sweep_at = sweep_release_at(node, limits, grace=grace)
        ready = ready_since(node)
        if registered is None and no_agent_grace is not None and ready is not None and sweep_at is not None:
            sweep_at = min(sweep_at, ready + no_agent_grace)
        return replace(state, taint=taint, sweep_at=sweep_at)
    if release is not None and (warm is None or warm.warm_at < release.at):
        return replace(state, taint=TaintState.RELEASED, release=release)
    return replace(state, taint=_outcome(warm)) if warm is not None else state


def _outcome(warm: NodeWarm) -> TaintState:
    return TaintState.WARM if warm.outcome == "warm" else TaintState.TIMEOUT


def silent_agent_count(states: Iterable[NodeState]) -> int:
    """Nodes whose agent has gone quiet mid-pull (as `get jobs` counts them per job)."""
    return sum(1 for s in states if s.agent is AgentState.NOT_REPORTING)


def absent_agent_count(states: Iterable[NodeState]) -> int:
    """Nodes of the cluster no agent has said hello from."""
    return sum(1 for s in states if s.agent is AgentState.ABSENT)
