"""What `prewarm get nodes` prints: one row per node with its agent and why its startup taint is as it is
(`prewarm.domain.node_state` decides; this module only words it), and its document for -o yaml|json."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prewarm.domain.liveness import SILENT_AFTER_SECONDS
from prewarm.domain.node_state import (
    AgentState,
    NodeState,
    TaintState,
    absent_agent_count,
    silent_agent_count,
)
from prewarm_cli.output import NONE, UNKNOWN, human_age, labels_text, rfc3339, table

# Well-known labels shown as columns of `get nodes` (kubectl's -L): a node's full labels run to hundreds
# of characters, so they are shown only with --show-labels or -o wide.
NODE_LABEL_COLUMNS = (
    ("INSTANCE-TYPE", "node.kubernetes.io/instance-type"),
    ("ZONE", "topology.kubernetes.io/zone"),
)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def warm_column(state: NodeState) -> str:
    """The startup taint in a word: `12s` (warm that long after the agent's hello), `timeout 15m` (came
    off at the deadline, images missing), `warming`, `overdue` (held past its agent's deadline),
    `tainted` (held, no agent), `released` (the sweep removed it), or `<none>`."""
    warm = state.registered.warm if state.registered else None
    if state.taint is TaintState.WARM and warm is not None:
        return human_age(warm.hello_to_warm)
    if state.taint is TaintState.TIMEOUT and warm is not None:
        return f"timeout {human_age(warm.join_to_warm)}"
    words = {TaintState.WARMING: "warming", TaintState.OVERDUE: "overdue", TaintState.NO_AGENT: "tainted",
             TaintState.RELEASED: "released"}
    return words.get(state.taint, NONE)


def boot_column(state: NodeState) -> str:
    """`1/2`: of the images required of the node at its first hello, how many were present at boot."""
    boot = state.registered.boot if state.registered else None
    return f"{len(boot.present)}/{len(boot.required)}" if boot is not None else NONE


def condition_column(state: NodeState) -> str:
    """The Node's `PrewarmWarm` condition's reason (`ImagesPresentAtBoot`, `Pulling`...), or `<none>`."""
    return state.condition.reason if state.condition is not None else NONE


def _sweep_note(state: NodeState, now: float) -> str:
    if state.in_cluster is None:
        return ""  # the Node was not read: when it joined is not known here
    if state.sweep_at is None:
        return "; the node has no creationTimestamp, so the sweep cannot time it"
    if state.sweep_at > now:
        return f"; the sweep removes it after {rfc3339(state.sweep_at)} (in {human_age(state.sweep_at - now)})"
    return f"; overdue for {human_age(now - state.sweep_at)}: the next sweep removes it"


def _taint_message(state: NodeState, now: float) -> str:
    deadline = state.agent_deadline
    match state.taint:
        case TaintState.WARMING:
            left = human_age((deadline or now) - now)
            return f"startup taint held by its agent until its images are present, {left} more at most"
        case TaintState.OVERDUE if deadline is not None:
            return f"startup taint held {human_age(now - deadline)} past its agent's deadline" + _sweep_note(state, now)
        case TaintState.OVERDUE:
            return "startup taint held, and its agent's hello did not take it" + _sweep_note(state, now)
        case TaintState.NO_AGENT:
            return "startup taint held and no agent has reported from this node" + _sweep_note(state, now)
        case TaintState.RELEASED if state.release is not None:
            ago = human_age(now - state.release.at)
            return f"startup taint removed by the sweep {ago} ago: {state.release.message}"
        case TaintState.TIMEOUT if state.registered is not None and state.registered.warm is not None:
            missing = state.registered.warm.missing_total
            return (f"startup taint removed at maxWarmSeconds with {_plural(missing, 'image')} missing "
                    f"(prewarm describe node {state.name})")
    return ""


def node_message(state: NodeState, *, now: float) -> str:
    """Why the node is as it is, in a sentence or two; empty when all is well."""
    parts = []
    if state.in_cluster is False:
        parts.append("not in the cluster any more (the sweep forgets it)")
    if state.agent is AgentState.NOT_REPORTING:
        parts.append(f"agent not reporting: {_plural(state.silent_pulls, 'pull')} without a report for over "
                     f"{SILENT_AFTER_SECONDS:g}s")
    elif state.agent is AgentState.ABSENT and state.taint is not TaintState.NO_AGENT:
        parts.append("no agent has reported from this node")
    if taint := _taint_message(state, now):
        parts.append(taint)
    return "; ".join(parts)


def nodes_table(states: Sequence[NodeState], *, now: float, wide: bool = False, show_labels: bool = False) -> str:
    """NAME AGENT ARCH INSTANCE-TYPE ZONE LAST-HELLO WARM MESSAGE; `wide` adds QUEUE, OS, QUEUE-URL and
    LABELS, `show_labels` adds LABELS."""
    headers = ["NAME", "AGENT", "ARCH", *(title for title, _ in NODE_LABEL_COLUMNS), "LAST-HELLO", "WARM", "BOOT",
               "CONDITION", "MESSAGE"]
    headers += ["QUEUE", "OS", "QUEUE-URL"] if wide else []
    headers += ["LABELS"] if wide or show_labels else []
    rows = []
    for s in states:
        labels, registered = s.labels or {}, s.registered
        hello = f"{human_age(now - registered.last_hello)} ago" if registered else NONE
        row = [s.name, s.agent.value, s.architecture or UNKNOWN,
               *(labels.get(key) or NONE for _, key in NODE_LABEL_COLUMNS), hello, warm_column(s), boot_column(s),
               condition_column(s), node_message(s, now=now)]
        queue_url = registered.queue_url if registered else ""
        row += [queue_url.rsplit("/", 1)[-1] or NONE, s.os or UNKNOWN, queue_url or NONE] if wide else []
        row += [labels_text(dict(labels))] if wide or show_labels else []
        rows.append(row)
    return table(headers, rows)


def nodes_summary(states: Sequence[NodeState]) -> str:
    """`1 of 3 nodes has an agent not reporting; 1 has no agent`, or nothing when every agent is there."""
    silent, absent = silent_agent_count(states), absent_agent_count(states)
    if not (silent or absent):
        return ""
    total = len(states)
    parts = []
    if silent:
        parts.append(f"{silent} of {total} nodes {'has' if silent == 1 else 'have'} an agent not reporting")
    if absent:
        verb = "has" if absent == 1 else "have"
        parts.append(f"{absent} {verb} no agent" if parts else f"{absent} of {total} nodes {verb} no agent")
    return "; ".join(parts)


def node_document(state: NodeState, *, now: float) -> dict[str, Any]:
    """A node as Prewarm sees it, Kubernetes-shaped: its agent's hello and its startup taint."""
    status: dict[str, Any] = {"agent": state.agent.value, "architecture": state.architecture, "os": state.os}
    if state.in_cluster is not None:
        status["inCluster"] = state.in_cluster
    if state.silent_pulls:
        status["silentPulls"] = state.silent_pulls
    if (r := state.registered) is not None:
        status |= {"queueUrl": r.queue_url, "lastHello": rfc3339(r.last_hello)}
    if taint := _taint_status(state):
        status["startupTaint"] = taint
    if (boot := state.registered.boot if state.registered else None) is not None:
        status["boot"] = {"required": list(boot.required), "present": list(boot.present), "at": rfc3339(boot.at)}
    if (condition := state.condition) is not None:
        status["warmCondition"] = {"status": condition.status, "reason": condition.reason, "message": condition.message}
    if message := node_message(state, now=now):
        status["message"] = message
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmNode",
            "metadata": {"name": state.name, "labels": dict(state.labels or {})}, "status": status}


def _taint_status(state: NodeState) -> dict[str, Any]:
    warm = state.registered.warm if state.registered else None
    if state.taint in (TaintState.WARM, TaintState.TIMEOUT) and warm is not None:
        return {
            "outcome": warm.outcome, "joinedAt": rfc3339(warm.joined_at), "helloAt": rfc3339(warm.hello_at),
            "removedAt": rfc3339(warm.warm_at), "helloToWarmSeconds": round(warm.hello_to_warm, 3),
            "joinToWarmSeconds": round(warm.join_to_warm, 3), "missing": list(warm.missing),
            "missingTotal": warm.missing_total,
        }
    if state.taint is TaintState.RELEASED and state.release is not None:
        return {"outcome": "released", "removedBy": "sweep", "removedAt": rfc3339(state.release.at),
                "reason": state.release.message}
    if state.taint is TaintState.NONE:
        return {}
    found: dict[str, Any] = {"outcome": state.taint.value.replace(" ", "-")}
    if state.agent_deadline is not None:
        found["deadline"] = rfc3339(state.agent_deadline)
    if state.sweep_at is not None:
        found["sweepRemovesAfter"] = rfc3339(state.sweep_at)
    return found


def names_found(states: Iterable[NodeState], names: Sequence[str]) -> tuple[list[NodeState], list[str]]:
    """The named nodes, in the order named, and a problem for each one neither the cluster nor an agent knows."""
    by_name = {s.name: s for s in states}
    return [by_name[n] for n in names if n in by_name], [f'node "{n}" not found' for n in names if n not in by_name]
