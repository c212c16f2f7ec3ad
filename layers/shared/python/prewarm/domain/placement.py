"""Which nodes a job pulls on: its node and pod selectors, node eligibility and image platforms.

Everything here is pure: nodes and pods are the plain dicts the Kubernetes API returns
(`metadata.name`, `metadata.labels`, `status.conditions`, `spec.nodeName`, `status.phase`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import field_validator, model_validator

from prewarm.domain.kubernetes import LabelSelector, dns1123_subdomain_problem, raise_problems

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


class NodeSelector(LabelSelector):
    """`spec.selector`: node `names`, or a label selector over nodes (not both)."""

    names: list[str] | None = None

    @field_validator("names")
    @classmethod
    def _names_are_distinct_node_names(cls, names: list[str] | None) -> list[str] | None:
        problems: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, name in enumerate(names or ()):
            if problem := dns1123_subdomain_problem(name):
                problems.append((f"[{index}]", f"invalid node name: {problem}"))
            elif name in seen:
                problems.append((f"[{index}]", f'duplicate node name "{name}" (also at [{seen[name]}])'))
            seen.setdefault(name, index)
        raise_problems(problems)
        return names

    @model_validator(mode="after")
    def _names_or_labels(self) -> NodeSelector:
        if self.names is not None and (self.match_labels is not None or self.match_expressions is not None):
            raise_problems([("", "names cannot be combined with matchLabels or matchExpressions; use one")])
        return self


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
    """The nodes a job pulls on (`selected`, sorted) and the targeted nodes left out (`excluded`)."""

    selected: list[str]
    excluded: list[ExcludedNode]


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


def _ineligibility(node: Mapping[str, Any], platforms: list[Platform] | None) -> str | None:
    labels = _labels(node)
    key, value = VIRTUAL_KUBELET_LABEL
    if labels.get(key) == value:
        return VIRTUAL_KUBELET_NODE
    if labels.get(FARGATE_LABEL[0]) == FARGATE_LABEL[1]:
        return FARGATE_NODE
    # Whatever the image: the agent DaemonSet runs on Linux nodes only, so nothing would pull there.
    if (labels.get(OS_LABEL) or labels.get(_BETA_OS_LABEL)) == "windows":
        return WINDOWS_NODE
    if not _is_ready(node):
        return NODE_NOT_READY
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
) -> NodeSelection:
    """Decide the nodes a job with `placement` pulls on, and why each targeted node is left out.

    Targeted nodes are those named by `spec.selector.names`, matched by the selector's labels, or
    running an active, scheduled pod of the job's namespace that matches `spec.podSelector`; with
    no selector, every node. Nodes that do not match a label selector are simply not targeted and
    are not listed as excluded. A targeted node is excluded when it is missing from `nodes`
    (`node not found`), is a virtual-kubelet node, is not Ready, or, when `platforms` (the image's
    platforms) is given, has an OS/architecture the image lacks. Cordoned (unschedulable) nodes are
    kept, as Kruise does: pre-pulling onto a node that will be uncordoned is still useful.
    """
    nodes_by_name: dict[str, Mapping[str, Any]] = {}
    for item in nodes:
        nodes_by_name.setdefault(_node_name(item), item)
    platform_list = list(platforms) if platforms is not None else None
    selected: list[str] = []
    excluded: list[ExcludedNode] = []
    for name in _targeted(placement, nodes_by_name, pods):
        node = nodes_by_name.get(name)
        reason = NODE_NOT_FOUND if node is None else _ineligibility(node, platform_list)
        if reason is None:
            selected.append(name)
        else:
            excluded.append(ExcludedNode(name, reason))
    return NodeSelection(selected=selected, excluded=excluded)


