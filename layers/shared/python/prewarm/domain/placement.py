"""Which nodes a job pulls on: Kubernetes label selectors, node eligibility and image platforms.

Everything here is pure: nodes and pods are the plain dicts the Kubernetes API returns
(`metadata.name`, `metadata.labels`, `status.conditions`, `spec.nodeName`, `status.phase`).
The Kubernetes naming rules (qualified names, label values, DNS-1123 names) live here too, since
selectors are where they bite first; `prewarm.domain.jobs` reuses them for metadata.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    from prewarm.domain.jobs import ImageListPullJob, ImagePullJob

ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
_BETA_ARCH_LABEL = "beta.kubernetes.io/arch"
_BETA_OS_LABEL = "beta.kubernetes.io/os"
VIRTUAL_KUBELET_LABEL = ("type", "virtual-kubelet")

NODE_NOT_FOUND = "node not found"
NODE_NOT_READY = "node is not Ready"
VIRTUAL_KUBELET_NODE = "virtual-kubelet node"

# --- Kubernetes naming rules -------------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

_SUBDOMAIN_HINT = (
    "must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com')"
)
_LABEL_HINT = (
    "must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name')"
)
_NAME_PART_HINT = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyName' or 'my.name')"
)


def _dns_name_problem(value: str, limit: int, pattern: re.Pattern[str], hint: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"must be no more than {limit} characters (got {len(value)})"
    if not pattern.fullmatch(value):
        return f'"{value}" {hint}'
    return None


def dns1123_subdomain_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 subdomain (object names such as an ImagePullJob's), or None."""
    return _dns_name_problem(value, 253, _DNS1123_SUBDOMAIN, _SUBDOMAIN_HINT)


def dns1123_label_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 label (namespace names), or None."""
    return _dns_name_problem(value, 63, _DNS1123_LABEL, _LABEL_HINT)


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (`[prefix/]name`, label and annotation keys), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return f'key "{key}": prefix part must not be empty'
    if prefix and (problem := dns1123_subdomain_problem(prefix)):
        return f'key "{key}": prefix part {problem}'
    if not name:
        return f'key "{key}": name part must not be empty'
    if len(name) > 63:
        return f'key "{key}": name part must be no more than 63 characters'
    if not _QUALIFIED_NAME_PART.fullmatch(name):
        return f'key "{key}": name part {_NAME_PART_HINT}'
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value (empty is valid), or None."""
    if len(value) > 63:
        return f'value "{value}" must be no more than 63 characters'
    if value and not _QUALIFIED_NAME_PART.fullmatch(value):
        return f'value "{value}" {_NAME_PART_HINT}'
    return None


class FieldProblems(ValueError):
    """Problems found by a validator, each at a path relative to the value it validated.

    Raised inside pydantic validators; `prewarm.domain.jobs` turns them into `JobValidationError`
    entries whose paths join the validated value's path with each relative one (`[2]`, `.values`).
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {message}" if path else message for path, message in problems))


def raise_problems(problems: list[tuple[str, str]]) -> None:
    """Raise `FieldProblems` when there is anything in `problems`."""
    if problems:
        raise FieldProblems(problems)


def label_map_problems(labels: Mapping[str, str], *, check_values: bool = True) -> list[tuple[str, str]]:
    """Problems of a labels (or, with `check_values=False`, annotations) map, at `[key]` paths."""
    problems: list[tuple[str, str]] = []
    for key, value in labels.items():
        problem = qualified_name_problem(key) or (label_value_problem(value) if check_values else None)
        if problem:
            problems.append((f"[{key}]", problem))
    return problems


# --- Label selectors ---------------------------------------------------------------------------

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class _SelectorModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class LabelSelectorRequirement(_SelectorModel):
    """One `matchExpressions` entry: `key`, `operator` and (for In/NotIn) `values`."""

    key: str
    operator: Operator
    values: list[str] | None = None

    @field_validator("key")
    @classmethod
    def _key_is_qualified_name(cls, key: str) -> str:
        if problem := qualified_name_problem(key):
            raise ValueError(problem)
        return key

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        problems: list[tuple[str, str]] = []
        if self.operator in ("In", "NotIn"):
            if not self.values:
                problems.append((".values", f"must be non-empty when operator is {self.operator}"))
            for index, value in enumerate(self.values or ()):
                if problem := label_value_problem(value):
                    problems.append((f".values[{index}]", problem))
        elif self.values:
            problems.append((".values", f"must be empty when operator is {self.operator}"))
        raise_problems(problems)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy this requirement, with Kubernetes semantics."""
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        inside = present and labels[self.key] in (self.values or ())
        # NotIn matches a node without the key, as in Kubernetes.
        return inside if self.operator == "In" else not inside

    def to_query(self) -> str:
        """This requirement in `labelSelector` query syntax."""
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        word = "in" if self.operator == "In" else "notin"
        return f"{self.key} {word} ({','.join(sorted(set(self.values or ())))})"


class LabelSelector(_SelectorModel):
    """A Kubernetes label selector: `matchLabels` and `matchExpressions`, all of which must hold."""

    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = None

    @field_validator("match_labels")
    @classmethod
    def _labels_are_valid(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        raise_problems(label_map_problems(labels or {}))
        return labels

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with `labels` is selected (an empty selector matches everything)."""
        labels = labels or {}
        if any(labels.get(key) != value for key, value in (self.match_labels or {}).items()):
            return False
        return all(requirement.matches(labels) for requirement in self.match_expressions or ())

    def to_query(self) -> str:
        """The `labelSelector` query string, e.g. `a=b,c in (x,y),!d,e`, sorted so it is deterministic."""
        terms = [(key, f"{key}={value}") for key, value in (self.match_labels or {}).items()]
        terms += [(requirement.key, requirement.to_query()) for requirement in self.match_expressions or ()]
        return ",".join(dict.fromkeys(term for _, term in sorted(terms)))


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
    if not _is_ready(node):
        return NODE_NOT_READY
    if platforms is not None:
        return _platform_problem(labels, platforms)
    return None


def _targeted(
    job: ImagePullJob | ImageListPullJob,
    nodes_by_name: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> list[str]:
    spec = job.spec
    if spec.pod_selector is not None:
        namespace = job.metadata.namespace
        return sorted(
            {
                str(_get(pod, "spec", "nodeName"))
                for pod in pods
                if _get(pod, "metadata", "namespace") in (None, namespace)
                and _is_active_scheduled(pod)
                and spec.pod_selector.matches(_labels(pod))
            }
        )
    if spec.selector is None:
        return sorted(nodes_by_name)
    if spec.selector.names is not None:
        return sorted(set(spec.selector.names))
    return sorted(name for name, node in nodes_by_name.items() if spec.selector.matches(_labels(node)))


def evaluate_nodes(
    job: ImagePullJob | ImageListPullJob,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    platforms: Iterable[Platform] | None = None,
) -> NodeSelection:
    """Decide the nodes `job` pulls on, and why each targeted node is left out.

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
    for name in _targeted(job, nodes_by_name, pods):
        node = nodes_by_name.get(name)
        reason = NODE_NOT_FOUND if node is None else _ineligibility(node, platform_list)
        if reason is None:
            selected.append(name)
        else:
            excluded.append(ExcludedNode(name, reason))
    return NodeSelection(selected=selected, excluded=excluded)


def select_nodes(
    job: ImagePullJob | ImageListPullJob,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    platforms: Iterable[Platform] | None = None,
) -> list[str]:
    """The sorted names of the nodes `job` pulls on (see `evaluate_nodes`)."""
    return evaluate_nodes(job, nodes, pods, platforms).selected
