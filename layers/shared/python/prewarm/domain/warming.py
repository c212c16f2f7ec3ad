"""The startup taint: which images a new node must have before pods may land on it, and how its agent
lifts the taint (docs/agent.md, "Startup taint").

A node joins with the taint (Karpenter `startupTaints`, a node group's taints). The control plane
tells its agent the images of every `Never` job that selects the node (`required_images`); the agent
removes the taint once each is present, or when `maxWarmSeconds` have passed since the node joined,
whatever is missing then. Everything here is pure.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.kubernetes import format_time, parse_time
from prewarm.domain.messages import RequiredImage
from prewarm.domain.placement import DEFAULT_TAINT_KEY as DEFAULT_TAINT_KEY  # placement's: it never excludes a node
from prewarm.domain.placement import Placement, Platform, evaluate_nodes

# Where `prewarm install` puts the agents: their namespace, and the name of their DaemonSet, service
# account and ConfigMap (which holds the startup taint and its deadline).
AGENT_NAMESPACE = "prewarm-system"
AGENT_NAME = "prewarm-agent"
DEFAULT_TAINT_EFFECT = "NoSchedule"
DEFAULT_MAX_WARM_SECONDS = 900
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class NeverJob:
    """What decides whether a running `Never` job wants its image on a node."""

    key: str
    image: str  # the pull reference its tasks carry
    placement: Placement
    platforms: tuple[Platform, ...] | None = None


def required_images(
    jobs: Iterable[NeverJob],
    node: Mapping[str, Any],
    pods: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[RequiredImage]:
    """The images `node` must have: one entry per job whose placement selects it, sorted.

    `pods` holds, per job key, the pods of that job's `podSelector` (only such jobs need them). The
    rule is the hello's own (`evaluate_nodes`): a node excluded from a job (wrong platform, not
    Ready, virtual-kubelet) needs nothing from it, since nothing will be pulled there.
    """
    name = node.get("metadata", {}).get("name")
    wanted = []
    for job in jobs:
        job_pods = (pods or {}).get(job.key, ())
        if job.placement.pod_selector is not None and not job_pods:
            continue
        selection = evaluate_nodes(job.placement, [node], job_pods, platforms=job.platforms)
        if name in selection.selected:
            wanted.append(RequiredImage(image=job.image, job=job.key))
    return sorted(set(wanted), key=lambda r: (r.image, r.job))


@dataclass(frozen=True)
class StartupTaint:
    """The taint a node joins with and its agent removes: `key` with `effect`, whatever its value."""

    key: str = DEFAULT_TAINT_KEY
    effect: str = DEFAULT_TAINT_EFFECT

    def __str__(self) -> str:
        return f"{self.key}:{self.effect}"

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return taint.get("key") == self.key and taint.get("effect") == self.effect

    def held_by(self, node: Mapping[str, Any]) -> bool:
        """Whether the Node object carries this taint."""
        return any(isinstance(t, Mapping) and self.matches(t) for t in _taints(node))

    def removal_patch(self, node: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """A JSON patch that removes the taint from `node` and nothing else, or None when it has none.

        Each removal is guarded by a `test` of the taint it removes, so a patch computed from a Node
        that changed meanwhile fails (422) instead of removing another taint at that index.
        """
        ops: list[dict[str, Any]] = []
        for index, taint in reversed(list(enumerate(_taints(node)))):
            if isinstance(taint, Mapping) and self.matches(taint):
                path = f"/spec/taints/{index}"
                ops += [{"op": "test", "path": path, "value": dict(taint)}, {"op": "remove", "path": path}]
        return ops or None


def _taints(node: Mapping[str, Any]) -> list[Any]:
    taints = (node.get("spec") or {}).get("taints")
    return list(taints) if isinstance(taints, list) else []


def parse_taint(text: str) -> StartupTaint:
    """`key:Effect` or `key=value:Effect` (as kubectl and Karpenter write taints), the value ignored."""
    key_value, sep, effect = text.strip().rpartition(":")
    key = key_value.partition("=")[0]
    if not sep or not key or effect not in TAINT_EFFECTS:
        raise ValueError(f"taint {text!r} must be key[=value]:Effect with Effect one of {', '.join(TAINT_EFFECTS)}")
    return StartupTaint(key, effect)


def missing_summary(missing: Mapping[str, str], limit: int = 900) -> str:
    """`image (why); image (why)` for a log line and an Event message, cut at `limit` characters
    (an Event's message holds 1024): how many were left out is said at the end."""
    parts = [f"{image} ({why})" for image, why in sorted(missing.items())]
    text = ""
    for shown, part in enumerate(parts):
        candidate = f"{text}; {part}" if text else part
        if len(candidate) > limit:
            return f"{text}; and {len(parts) - shown} more"
        text = candidate
    return text


# --- Failing open without an agent ---------------------------------------------------------------

FAIL_OPEN_EVENT_REASON = "PrewarmNoAgent"


@dataclass(frozen=True)
class WarmLimits:
    """The startup taint and its deadline as `prewarm install` gave them to the agents (their ConfigMap)."""

    taint: StartupTaint = StartupTaint()
    max_warm_seconds: int = DEFAULT_MAX_WARM_SECONDS

    @classmethod
    def of_agent_config(cls, data: Mapping[str, str] | None) -> WarmLimits:
        """From the agents' ConfigMap data; what it does not say is the default."""
        data = data or {}
        try:
            max_warm = int(data.get("MAX_WARM_SECONDS", DEFAULT_MAX_WARM_SECONDS))
        except ValueError:
            max_warm = DEFAULT_MAX_WARM_SECONDS
        return cls(StartupTaint(data.get("STARTUP_TAINT_KEY") or DEFAULT_TAINT_KEY,
                                data.get("STARTUP_TAINT_EFFECT") or DEFAULT_TAINT_EFFECT), max_warm)


def overdue_seconds(node: Mapping[str, Any], limits: WarmLimits, *, grace: float, now: float) -> float | None:
    """How long `node` has held the startup taint since it joined, when that is past its agent's deadline
    plus `grace` (no agent released it: the control plane does), else None."""
    if not limits.taint.held_by(node):
        return None
    created, release_at = _created_at(node), sweep_release_at(node, limits, grace=grace)
    if created is None or release_at is None:
        return None
    return now - created if now > release_at else None


def sweep_release_at(node: Mapping[str, Any], limits: WarmLimits, *, grace: float) -> float | None:
    """When the sweep removes a startup taint no agent removed: the node's join plus its agent's deadline
    and `grace` (None: the node has no creation time, so the sweep never judges it)."""
    created = _created_at(node)
    return None if created is None else created + limits.max_warm_seconds + grace


def past_deadline(nodes: Iterable[Mapping[str, Any]], limits: WarmLimits, *, grace: float,
                  now: float) -> list[Mapping[str, Any]]:
    """The nodes (their metadata is enough) that joined more than the agents' deadline plus `grace` ago,
    newest first: any of them still holding the startup taint had no agent to remove it."""
    due = [(created, node) for node in nodes
           if (created := _created_at(node)) is not None and now - created > limits.max_warm_seconds + grace]
    return [node for _, node in sorted(due, key=lambda d: -d[0])]


def without_hello(nodes: Iterable[Mapping[str, Any]], hellos: Mapping[str, float], *, grace: float,
                  now: float) -> list[Mapping[str, Any]]:
    """The nodes (their metadata is enough) that joined more than `grace` ago and whose agent has said no
    hello since (`hellos`: node name → its last hello; one from before the node's join was another node's
    under the same name), newest first: any of them Ready and still holding the startup taint has no
    agent to remove it."""
    due = []
    for node in nodes:
        created = _created_at(node)
        hello = hellos.get(str((node.get("metadata") or {}).get("name")))
        if created is not None and now - created > grace and (hello is None or hello < created):
            due.append((created, node))
    return [node for _, node in sorted(due, key=lambda d: -d[0])]


def newest_first(nodes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`nodes` by their join, newest first (the likeliest to hold the startup taint); those without a
    creation time last."""
    return sorted(nodes, key=lambda n: -(_created_at(n) or 0.0))


def agentless_seconds(node: Mapping[str, Any], limits: WarmLimits, *, grace: float, now: float) -> float | None:
    """How long `node` (read whole) has held the startup taint since it joined, when it has been Ready for
    more than `grace` (`NoAgentGraceSeconds`): called for a node whose agent said no hello, which the
    control plane releases then rather than at the agents' deadline. None otherwise."""
    if not limits.taint.held_by(node):
        return None
    created, ready = _created_at(node), ready_since(node)
    if created is None or ready is None or now - ready <= grace:
        return None
    return now - created


def ready_since(node: Mapping[str, Any]) -> float | None:
    """When the node's Ready condition last became True (its `lastTransitionTime`, else its join); None when
    it is not Ready."""
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            if condition.get("status") != "True":
                return None
            return parse_time(condition.get("lastTransitionTime")) or _created_at(node)
    return None


def no_hello_message(limits: WarmLimits, held_seconds: float, grace: float) -> str:
    """What the Event on the node says when the control plane removes the taint of a node no agent said
    hello from."""
    return (f"no Prewarm agent said hello within {grace:.0f}s of the node becoming Ready (NoAgentGraceSeconds); "
            f"startup taint {limits.taint} removed {held_seconds / 60:.0f}m after the node's join so pods can "
            f"schedule")


def fail_open_message(limits: WarmLimits, held_seconds: float) -> str:
    """What the Event on the node says when the control plane removes the taint."""
    return (f"no Prewarm agent removed the startup taint {limits.taint} within {held_seconds / 60:.0f}m of the "
            f"node's join (maxWarmSeconds {limits.max_warm_seconds}); taint removed so pods can schedule")


def node_event(node: str, *, reason: str, message: str, component: str, at: float) -> dict[str, Any]:
    """A Warning Event about `node`, in `default` where Events about Nodes live (Event messages hold 1024
    characters)."""
    stamp = format_time(at)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node}.{uuid.uuid4().hex[:16]}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason, "message": message[:1024], "type": "Warning",
        "source": {"component": component, "host": node},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def _created_at(node: Mapping[str, Any]) -> float | None:
    return parse_time((node.get("metadata") or {}).get("creationTimestamp"))


@dataclass
class SettledNodes:
    """The sweep's memory, per cluster (`""` for the stack's own): the nodes (uids) found past their
    startup taint's deadline without the taint, so they are not read whole again. Kept for a process's
    life; a new process reads them once more. A cluster's sweep keeps only its own nodes in its set."""

    by_cluster: dict[str, set[str]] = field(default_factory=dict)

    def of(self, cluster: str) -> set[str]:
        return self.by_cluster.setdefault(cluster, set())
