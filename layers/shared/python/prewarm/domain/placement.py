"""Which nodes a job pulls on: its node and pod selectors, node eligibility, where the agent
DaemonSet runs, and image platforms.

Everything here is pure: nodes, pods and the DaemonSet are the plain dicts the Kubernetes API returns
(`metadata.name`, `metadata.labels`, `status.conditions`, `spec.taints`, `spec.nodeName`, `status.phase`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prewarm.domain.kubernetes import (
    LabelSelector,
    NamesOrLabelSelector,
    dns1123_subdomain_problem,
    qualified_name_problem,
    requirement_holds,
)

ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
_BETA_ARCH_LABEL = "beta.kubernetes.io/arch"
_BETA_OS_LABEL = "beta.kubernetes.io/os"
VIRTUAL_KUBELET_LABEL = ("type", "virtual-kubelet")
FARGATE_LABEL = ("eks.amazonaws.com/compute-type", "fargate")

NODE_NOT_FOUND = "node not found"
NODE_NOT_READY = "node is not Ready"
VIRTUAL_KUBELET_NODE = "virtual-kubelet node"
# The agent DaemonSet runs on Linux nodes with a node containerd: not on Fargate, not on Windows.
FARGATE_NODE = "Fargate node: no node containerd for the agent"
WINDOWS_NODE = "Windows node: the agent runs on Linux nodes only"
# A node the agent DaemonSet's pod template does not fit: the DaemonSet controller puts no agent there.
NO_AGENT_HERE = "no agent runs here"
# A job's seed wave (docs/job-spec.md, "Waves"): an annotation, which Kruise's schema keeps verbatim.
SEED_WAVE_ANNOTATION = "prewarm.dev/seed-wave"
ZONE_LABEL = "topology.kubernetes.io/zone"
# The taint new nodes join with until their agent has warmed them (docs/agent.md, "Startup taint").
DEFAULT_TAINT_KEY = "prewarm.dev/warming"


class NodeSelector(NamesOrLabelSelector):
    """`spec.selector`: node `names`, or a label selector over nodes (not both)."""

    noun: ClassVar[str] = "node name"

    @classmethod
    def name_problem(cls, name: str) -> str | None:
        return dns1123_subdomain_problem(name)


@dataclass(frozen=True)
class Placement:
    """What decides a job's nodes: its `spec.selector`, `spec.podSelector` and namespace (for pods)."""

    selector: NodeSelector | None = None
    pod_selector: LabelSelector | None = None
    namespace: str = "default"


# --- Platforms -------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Platform:
    """An image platform, as in an OCI image index (`linux/arm64/v8`)."""

    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        """Parse `os/architecture[/variant]`."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f'platform "{text}" must be os/architecture[/variant], e.g. linux/arm64')
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)

    def matches(self, entry: Mapping[str, Any]) -> bool:
        """Whether an image index entry's `platform` can run here (arm64's `v8` variant may be left out)."""
        if entry.get("os") != self.os or entry.get("architecture") != self.architecture:
            return False
        variant = entry.get("variant") or ""
        return variant == (self.variant or "") or (self.architecture == "arm64" and variant in ("", "v8"))


# --- Node selection ------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ExcludedNode:
    """A node the job targets but will not pull on, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class NodeSelection:
    """The nodes a job pulls on (`selected`, sorted) and the targeted nodes left out (`excluded`);
    `unchecked` says why where the agents run was not known, when it was not."""

    selected: list[str]
    excluded: list[ExcludedNode]
    unchecked: str = ""
    seeds: list[str] = field(default_factory=list)


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def _node_name(node: Mapping[str, Any]) -> str:
    name = _get(node, "metadata", "name")
    if not isinstance(name, str) or not name:
        raise ValueError("every node must have metadata.name")
    return name


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = _get(obj, "metadata", "labels")
    return dict(labels) if isinstance(labels, Mapping) else {}


def _is_ready(node: Mapping[str, Any]) -> bool:
    conditions = _get(node, "status", "conditions") or []
    return any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _is_active_scheduled(pod: Mapping[str, Any]) -> bool:
    # Kruise's IsPodActive: not Succeeded/Failed and not being deleted; plus bound to a node.
    return (
        bool(_get(pod, "spec", "nodeName"))
        and _get(pod, "status", "phase") not in ("Succeeded", "Failed")
        and not _get(pod, "metadata", "deletionTimestamp")
    )


def _platform_problem(labels: Mapping[str, str], platforms: Iterable[Platform]) -> str | None:
    os_name = labels.get(OS_LABEL) or labels.get(_BETA_OS_LABEL)
    arch = labels.get(ARCH_LABEL) or labels.get(_BETA_ARCH_LABEL)
    if not os_name or not arch:
        return f"node has no {OS_LABEL} and {ARCH_LABEL} labels, so its platform is unknown"
    if not any(p.os == os_name and p.architecture == arch for p in platforms):
        return f"image has no {os_name}/{arch} variant"
    return None


def _ineligibility(
    node: Mapping[str, Any], platforms: list[Platform] | None, agents: AgentPlacement | None
) -> str | None:
    labels = _labels(node)
    key, value = VIRTUAL_KUBELET_LABEL
    if labels.get(key) == value:
        return VIRTUAL_KUBELET_NODE
    if labels.get(FARGATE_LABEL[0]) == FARGATE_LABEL[1]:
        return FARGATE_NODE
    # Whatever the image: the agent DaemonSet runs on Linux nodes only, so nothing would pull there.
    if (labels.get(OS_LABEL) or labels.get(_BETA_OS_LABEL)) == "windows":
        return WINDOWS_NODE
    # Before the DaemonSet's rules: a node that is not Ready carries taints for it (not-ready, unreachable).
    if not _is_ready(node):
        return NODE_NOT_READY
    if agents is not None and (misfit := agents.misfit(node)) is not None:
        return misfit
    if platforms is not None:
        return _platform_problem(labels, platforms)
    return None


def _targeted(
    placement: Placement,
    nodes_by_name: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> list[str]:
    pod_selector, selector = placement.pod_selector, placement.selector
    if pod_selector is not None:
        return sorted(
            {
                str(_get(pod, "spec", "nodeName"))
                for pod in pods
                if _get(pod, "metadata", "namespace") in (None, placement.namespace)
                and _is_active_scheduled(pod)
                and pod_selector.matches(_labels(pod))
            }
        )
    if selector is None:
        return sorted(nodes_by_name)
    if selector.names is not None:
        return sorted(set(selector.names))
    return sorted(name for name, node in nodes_by_name.items() if selector.matches(_labels(node)))


def evaluate_nodes(
    placement: Placement,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    platforms: Iterable[Platform] | None = None,
    agents: AgentPlacement | None = None,
) -> NodeSelection:
    """Decide the nodes a job with `placement` pulls on, and why each targeted node is left out.

    Targeted nodes are those named by `spec.selector.names`, matched by the selector's labels, or
    running an active, scheduled pod of the job's namespace that matches `spec.podSelector`; with
    no selector, every node. Nodes that do not match a label selector are simply not targeted and
    are not listed as excluded. A targeted node is excluded when it is missing from `nodes`
    (`node not found`), is a virtual-kubelet, Fargate or Windows node, is not Ready, is outside where
    the agent DaemonSet runs (`agents`, when given), or, when `platforms` (the image's platforms) is
    given, has an OS/architecture the image lacks. A node named in `selector.names` is excluded
    the same way, with its reason. Cordoned (unschedulable) nodes are kept, as Kruise does (and the
    DaemonSet tolerates them): pre-pulling onto a node that will be uncordoned is still useful.
    """
    nodes_by_name: dict[str, Mapping[str, Any]] = {}
    for item in nodes:
        nodes_by_name.setdefault(_node_name(item), item)
    platform_list = list(platforms) if platforms is not None else None
    selected: list[str] = []
    excluded: list[ExcludedNode] = []
    for name in _targeted(placement, nodes_by_name, pods):
        node = nodes_by_name.get(name)
        reason = NODE_NOT_FOUND if node is None else _ineligibility(node, platform_list, agents)
        if reason is None:
            selected.append(name)
        else:
            excluded.append(ExcludedNode(name, reason))
    return NodeSelection(selected=selected, excluded=excluded)



# --- Waves -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedWave:
    """`prewarm.dev/seed-wave: "<k>[ per <label key>]"`: the job pulls first on `per_domain` nodes of each
    value of `topology_key` (the zone by default), and on the rest once every seed has finished, so that a
    node-local mirror (Spegel, Dragonfly) serves the rest from peers."""

    per_domain: int
    topology_key: str = ZONE_LABEL

    @classmethod
    def parse(cls, text: str) -> SeedWave:
        """Parse the annotation's value; a `ValueError` names the annotation and what is wrong."""
        where = f"annotations.{SEED_WAVE_ANNOTATION}"
        count, per, key = text.partition(" per ")
        if not (count.isascii() and count.isdigit()) or int(count) < 1:
            raise ValueError(f'{where}: {text!r} must be "<k>" or "<k> per <label key>" with k a whole number '
                             f'of at least 1, e.g. "1 per {ZONE_LABEL}"')
        key = key.strip() if per else ZONE_LABEL
        if (problem := qualified_name_problem(key)) is not None:
            raise ValueError(f"{where}: label {problem}")
        return cls(int(count), key)

    def __str__(self) -> str:
        return f"{self.per_domain} per {self.topology_key}"

    def seeds(self, nodes: Iterable[Mapping[str, Any]], selected: Iterable[str]) -> list[str]:
        """The seed nodes among `selected`: the first `per_domain` by name of each value of `topology_key`;
        selected nodes without the label (or missing from `nodes`) make one domain of their own."""
        labels = {_node_name(node): _labels(node) for node in nodes}
        # None: no such label (a label's empty value is a value like any other).
        domains: dict[str | None, list[str]] = {}
        for name in sorted(selected):
            domains.setdefault(labels.get(name, {}).get(self.topology_key), []).append(name)
        return sorted(name for names in domains.values() for name in names[: self.per_domain])


def named_exclusions(placement: Placement, excluded: Sequence[ExcludedNode]) -> str:
    """For a job that names its nodes (`selector.names`): which of them it leaves out and why, for its
    message, since the user asked for each by name. Empty otherwise."""
    if placement.selector is None or placement.selector.names is None or not excluded:
        return ""
    first = min(excluded)
    if len(excluded) == 1:
        return f"named node {first.name} excluded: {first.reason}"
    return f"{len(excluded)} named nodes excluded: {first.name} ({first.reason}) and {len(excluded) - 1} more"


# --- Where the agent DaemonSet runs --------------------------------------------------------------

# What the DaemonSet controller adds to every daemon pod's tolerations, whatever its template says;
# `network-unavailable` only to pods with `hostNetwork: true`
# (https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/#taints-and-tolerations).
DAEMON_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION: Mapping[str, str] = {
    "key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"}
# PreferNoSchedule only steers the scheduler; the DaemonSet controller ignores it.
_REPELLING_EFFECTS = ("NoSchedule", "NoExecute")
_NODE_NAME_FIELD = "metadata.name"


def daemon_tolerations(pod_spec: Mapping[str, Any]) -> tuple[Mapping[str, str], ...]:
    """The tolerations the DaemonSet controller adds to a daemon pod of `pod_spec`."""
    return (*DAEMON_TOLERATIONS, *((HOST_NETWORK_TOLERATION,) if pod_spec.get("hostNetwork") else ()))


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether a pod's toleration tolerates a node's taint (`v1.Toleration.ToleratesTaint`): an empty
    effect tolerates every effect, `Exists` with no key every taint, `Equal` (the default) the same value."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _requirement_text(requirement: Mapping[str, Any]) -> str:
    values = requirement.get("values")
    return f"{requirement.get('key')} {requirement.get('operator')}" + (f" [{', '.join(values)}]" if values else "")


def _failed_requirement(term: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first requirement of a node selector term `node` fails, None when it meets them all."""
    labels = _labels(node)
    for requirement in term.get("matchExpressions") or ():
        if not requirement_holds(str(requirement.get("operator")), [str(v) for v in requirement.get("values") or ()],
                                 labels.get(str(requirement.get("key")))):
            return dict(requirement)
    for requirement in term.get("matchFields") or ():
        # Node affinity supports one field, the node's name; any other never matches.
        value = _node_name(node) if requirement.get("key") == _NODE_NAME_FIELD else None
        if value is None or not requirement_holds(str(requirement.get("operator")),
                                                  [str(v) for v in requirement.get("values") or ()], value):
            return dict(requirement)
    return None


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    # An empty term matches no node (NodeSelectorTerm's API docs).
    return bool(term.get("matchExpressions") or term.get("matchFields")) and _failed_requirement(term, node) is None


@dataclass(frozen=True)
class AgentPlacement:
    """Where the agent DaemonSet's controller puts a pod: the nodes its pod template's `nodeSelector`,
    required node affinity (`nodeSelectorTerms`, ORed; each term's `matchExpressions` and `matchFields`,
    ANDed) and tolerations (its own and the controller's, `DAEMON_TOLERATIONS`) all admit.

    `transient_taints` are taint keys that never keep a node out: the startup taint goes when the node
    is warm, or the sweep removes it when no agent did (docs/agent.md), so that node gets its agent.
    """

    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_selector_terms: Sequence[Mapping[str, Any]] | None = None
    tolerations: Sequence[Mapping[str, Any]] = DAEMON_TOLERATIONS
    transient_taints: frozenset[str] = frozenset({DEFAULT_TAINT_KEY})

    @classmethod
    def of_pod_spec(
        cls, spec: Mapping[str, Any], *, transient_taints: frozenset[str] = frozenset({DEFAULT_TAINT_KEY})
    ) -> AgentPlacement:
        """From a DaemonSet's `spec.template.spec`."""
        affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        return cls(
            node_selector=dict(spec.get("nodeSelector") or {}),
            node_selector_terms=None if required is None else list(required.get("nodeSelectorTerms") or ()),
            tolerations=(*(spec.get("tolerations") or ()), *daemon_tolerations(spec)),
            transient_taints=transient_taints,
        )

    @classmethod
    def of_daemon_set(cls, daemon_set: Mapping[str, Any]) -> AgentPlacement:
        """From a DaemonSet object as the API returns it."""
        return cls.of_pod_spec(_get(daemon_set, "spec", "template", "spec") or {})

    def misfit(self, node: Mapping[str, Any]) -> str | None:
        """Why the DaemonSet controller puts no agent on `node` (as an excluded node's reason), or None."""
        labels = _labels(node)
        for key, value in sorted(self.node_selector.items()):
            if labels.get(key) != value:
                return f"outside the agent DaemonSet's nodeSelector ({key}={value}): {NO_AGENT_HERE}"
        terms = self.node_selector_terms
        if terms is not None and not any(_term_matches(term, node) for term in terms):
            failed = _failed_requirement(terms[0], node) if len(terms) == 1 else None
            which = f" ({_requirement_text(failed)})" if failed is not None else (
                f" (none of its {len(terms)} terms)" if len(terms) > 1 else "")
            return f"outside the agent DaemonSet's node affinity{which}: {NO_AGENT_HERE}"
        for taint in _get(node, "spec", "taints") or ():
            if (isinstance(taint, Mapping) and taint.get("effect") in _REPELLING_EFFECTS
                    and taint.get("key") not in self.transient_taints
                    and not any(tolerates(t, taint) for t in self.tolerations)):
                return f"taint {_taint_text(taint)} not tolerated by the agent DaemonSet: {NO_AGENT_HERE}"
        return None
