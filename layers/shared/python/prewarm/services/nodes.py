"""`prewarm get nodes`: every node of the cluster and every node whose agent said hello, each with whether
its agent talks and what holds its startup taint, or removed it (`prewarm.domain.node_state`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.intervals import NO_AGENT_GRACE_SECONDS
from prewarm.domain.node_state import NodeState, node_states, taint_releases
from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE, FAIL_OPEN_EVENT_REASON, WarmLimits
from prewarm.services.jobs import silent_pulls_by_node
from prewarm.services.ports import AgentItems, ClusterError, NodeStates

# Events about Nodes live in `default`; the sweep's are these.
FAIL_OPEN_EVENTS = f"involvedObject.kind=Node,reason={FAIL_OPEN_EVENT_REASON}"


@dataclass
class NodesView:
    """The nodes, and what could not be read (then the view is partial: each problem says how)."""

    nodes: list[NodeState]
    problems: list[str] = field(default_factory=list)


def view_nodes(
    store: AgentItems, cluster: NodeStates | None, *, now: float, grace: float, unreachable: str = "",
    cluster_name: str = DEFAULT_CLUSTER, no_agent_grace: float = NO_AGENT_GRACE_SECONDS,
) -> NodesView:
    """The registered nodes of `cluster_name` and, when `cluster` (its API) answers, every node of the
    cluster with its taint and the sweep's Events. `unreachable` says why there is no cluster to read
    (`cluster` is then None); `grace` and `no_agent_grace` are the stack's StartupTaintGraceSeconds and
    NoAgentGraceSeconds, which say when the sweep removes a startup taint."""
    problems: list[str] = []
    nodes: list[dict[str, Any]] | None = None
    limits, releases = WarmLimits(), {}
    if cluster is None:
        problems.append(f"{unreachable or 'no cluster to read'}: only nodes whose agent said hello are shown, "
                        "and their startup taint as their agents last told")
    else:
        try:
            nodes = cluster.list_nodes()
        except ClusterError as e:
            problems.append(f"cannot list the cluster's nodes ({e}): only nodes whose agent said hello are shown")
    if cluster is not None and nodes is not None:
        try:
            config = cluster.get_object("v1", "configmaps", AGENT_NAME, AGENT_NAMESPACE)
            limits = WarmLimits.of_agent_config((config or {}).get("data"))
        except ClusterError as e:
            problems.append(f"cannot read the agents' ConfigMap {AGENT_NAMESPACE}/{AGENT_NAME} ({e}): the startup "
                            f"taint is taken as {limits.taint} with maxWarmSeconds {limits.max_warm_seconds}")
        try:
            releases = taint_releases(cluster.list_objects("v1", "events", "default", field_selector=FAIL_OPEN_EVENTS))
        except ClusterError as e:
            problems.append(f"cannot read the nodes' Events ({e}): a startup taint the sweep removed is not shown")
    states = node_states(nodes, store.list_nodes(cluster_name), limits=limits, grace=grace, now=now, releases=releases,
                         silent_pulls=silent_pulls_by_node(store, now=now, cluster=cluster_name),
                         no_agent_grace=no_agent_grace)
    return NodesView(states, problems)
