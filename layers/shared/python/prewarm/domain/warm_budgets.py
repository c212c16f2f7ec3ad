"""A namespace's budget of bytes per node that its jobs may keep warm: the rule, pure.

- **Declared** on the Namespace: `prewarm.dev/warm-bytes-per-node` (bytes, or a Kubernetes quantity such as
  `20Gi`) and `prewarm.dev/warm-budget-policy` (`Refuse`, the default, or `Trim`); a job's own
  `prewarm.dev/warm-budget-policy` annotation overrides the namespace's policy.
- **A job's cost** is its images' sizes, each counted once by digest (the reference when no digest is known):
  a digest two jobs want is kept once on a node. A size is the registry's compressed bytes (what a pull
  downloads; unpacked on disk it is larger). An image whose size is unknown is not counted, and the verdict
  names it: it is never silently taken as zero.
- **What is kept already**: every live pull job of the namespace in that cluster but the one being applied
  (`keeps_images_warm`), on the nodes it may reach. A job that names its nodes (`selector.names`) reaches
  those alone; any other job's nodes are chosen at its plan, after apply, and a `Never` job follows nodes
  that join, so it may reach any node its label selector matches. Two label selectors that no node can
  meet both (`LabelReach`: `pool=a` and `pool=b`, `pool In (a)` and `pool NotIn (a)`, `pool=a` and `pool
  DoesNotExist`) keep their images on different nodes; any other two may share one (a job whose selector
  may reach several pools is held to all their images together). The budget must hold on every node the
  job may reach.
- **Refuse** or **Trim**: a job beyond the budget is refused whole; with `Trim` a list job keeps its images
  in list order while they fit, and the rest are trimmed (an image already kept costs nothing and is never
  trimmed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.kubernetes import LabelSelector, NamesOrLabelSelector

BYTES_ANNOTATION = "prewarm.dev/warm-bytes-per-node"
POLICY_ANNOTATION = "prewarm.dev/warm-budget-policy"

_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


class BudgetPolicy(StrEnum):
    REFUSE = "Refuse"
    TRIM = "Trim"


class WarmBudgetExceededError(Exception):
    """A job that does not fit its namespace's budget (or whose namespace's budget does not read)."""


def parse_bytes(value: str) -> int:
    """Bytes from a whole number or a Kubernetes quantity with a binary or decimal suffix.

    >>> parse_bytes("20Gi"), parse_bytes("500M"), parse_bytes("1024")
    (21474836480, 500000000, 1024)
    """
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f'not a number of bytes: "{value}" (give bytes, or a quantity such as 20Gi or 500M)')
    return int(match[1]) * _UNITS[match[2]]


def show_bytes(value: int) -> str:
    """`value` bytes for a person: the bytes, and GiB or MiB beside them when that is more than a KiB.

    >>> show_bytes(21474836480), show_bytes(3 * 2**20), show_bytes(100)
    ('21474836480 bytes (20.0 GiB)', '3145728 bytes (3.0 MiB)', '100 bytes')
    """
    if value >= 2**30:
        return f"{value} bytes ({value / 2**30:.1f} GiB)"
    if value >= 2**20:
        return f"{value} bytes ({value / 2**20:.1f} MiB)"
    return f"{value} bytes"


def _policy(value: Any, where: str) -> BudgetPolicy:
    try:
        return BudgetPolicy(value)
    except ValueError:
        raise ValueError(f'{where}: unsupported value "{value}": supported values: "Refuse", "Trim"') from None


@dataclass(frozen=True)
class WarmBudget:
    """A namespace's budget, as its annotations say; `problem` when they do not read (every job of the
    namespace is then refused, naming the annotation: a budget that does not read is not no budget)."""

    namespace: str
    bytes_per_node: int = 0
    policy: BudgetPolicy = BudgetPolicy.REFUSE
    problem: str = ""

    @classmethod
    def of_namespace(cls, obj: Mapping[str, Any]) -> WarmBudget | None:
        """The budget a Namespace object declares; None when it declares none."""
        meta = obj.get("metadata") or {}
        name, notes = str(meta.get("name", "")), meta.get("annotations") or {}
        if BYTES_ANNOTATION not in notes:
            return None
        try:
            budget = parse_bytes(str(notes[BYTES_ANNOTATION]))
            policy = _policy(notes.get(POLICY_ANNOTATION, BudgetPolicy.REFUSE), f"annotation {POLICY_ANNOTATION}")
        except ValueError as e:
            where = "" if str(e).startswith("annotation") else f"annotation {BYTES_ANNOTATION}: "
            return cls(name, problem=f"namespace {name}: {where}{e}")
        return cls(name, budget, policy)

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes_per_node, "policy": str(self.policy), "problem": self.problem}

    @classmethod
    def from_dict(cls, namespace: str, value: Mapping[str, Any]) -> WarmBudget:
        return cls(namespace, int(value.get("bytes") or 0), BudgetPolicy(value.get("policy") or "Refuse"),
                   str(value.get("problem") or ""))

    def policy_for(self, manifest: Mapping[str, Any]) -> BudgetPolicy:
        """The job's own policy annotation, else the namespace's."""
        notes = (manifest.get("metadata") or {}).get("annotations") or {}
        if POLICY_ANNOTATION not in notes:
            return self.policy
        try:
            return _policy(notes[POLICY_ANNOTATION], f"metadata.annotations[{POLICY_ANNOTATION}]")
        except ValueError as e:
            raise WarmBudgetExceededError(str(e)) from None


@dataclass(frozen=True)
class LabelReach:
    """What a job's label selector says of the labels of the nodes it may reach, as far as it tells pools
    apart: per key, the values such a node has one of (`matchLabels`, `In`), those it has none of (`NotIn`),
    and the keys it lacks (`DoesNotExist`). An empty one: any node.

    >>> a, b = LabelReach.of(LabelSelector(match_labels={"pool": "a"})), LabelReach.of(LabelSelector(
    ...     match_expressions=[{"key": "pool", "operator": "NotIn", "values": ["a"]}]))
    >>> a.shares_a_node_with(b), a.shares_a_node_with(LabelReach()), a.text
    (False, True, 'pool in (a)')
    """

    values: tuple[tuple[str, frozenset[str]], ...] = ()
    excluded: tuple[tuple[str, frozenset[str]], ...] = ()
    absent: frozenset[str] = frozenset()

    @classmethod
    def of(cls, selector: LabelSelector | None) -> LabelReach:
        if selector is None or getattr(selector, "names", None):
            return cls()
        values: dict[str, frozenset[str]] = {k: frozenset([v]) for k, v in (selector.match_labels or {}).items()}
        excluded: dict[str, frozenset[str]] = {}
        absent: set[str] = set()
        for requirement in selector.match_expressions or ():
            key, given = requirement.key, frozenset(requirement.values or ())
            if requirement.operator == "In":
                values[key] = values.get(key, given) & given
            elif requirement.operator == "NotIn":
                excluded[key] = excluded.get(key, frozenset()) | given
            elif requirement.operator == "DoesNotExist":
                absent.add(key)
        return cls(tuple(sorted(values.items())), tuple(sorted(excluded.items())), frozenset(absent))

    def shares_a_node_with(self, other: LabelReach) -> bool:
        """Whether one node may be reached by both (False only when the two selectors cannot both hold)."""
        mine, theirs = dict(self.values), dict(other.values)
        if any(not mine[key] & theirs[key] for key in mine.keys() & theirs.keys()):
            return False
        if self.absent & theirs.keys() or other.absent & mine.keys():
            return False
        for have, out in ((mine, dict(other.excluded)), (theirs, dict(self.excluded))):
            if any(key in out and not have[key] - out[key] for key in have):
                return False
        return True

    @property
    def text(self) -> str:
        """How the budget's figures name the nodes (`pool in (a)`), "" for any node."""
        terms = [f"{key} in ({', '.join(sorted(values))})" for key, values in self.values]
        terms += [f"{key} notin ({', '.join(sorted(values))})" for key, values in self.excluded]
        return ", ".join([*terms, *(f"!{key}" for key in sorted(self.absent))])


@dataclass(frozen=True)
class ImageCost:
    """One image a job keeps warm: its reference, its digest when known, its size in bytes when known, the
    nodes its job names (None: any node) and what its job's label selector says of them."""

    reference: str
    digest: str = ""
    bytes: int | None = None
    nodes: frozenset[str] | None = None
    labels: LabelReach = LabelReach()

    def on(self, nodes: frozenset[str] | None, labels: LabelReach = LabelReach()) -> ImageCost:
        return replace(self, nodes=nodes, labels=labels)

    @property
    def identity(self) -> str:
        return self.digest or self.reference


def named_nodes(selector: NamesOrLabelSelector | None) -> frozenset[str] | None:
    """The nodes a job's `selector` names, the only ones it may reach; None when it may reach any."""
    return frozenset(selector.names) if selector is not None and selector.names else None


# A node no job names: it holds the images of the jobs that may reach any node, and no other.
ANY_NODE = ""


def keeps_images_warm(job: StoredJob) -> bool:
    """Whether `job` counts against its namespace's budget: a pull job not being deleted (its images stay on
    its nodes until it is deleted or expires, `Always` or `Never`, pinned or not), but not one that finished
    without ever being planned (a job the budget refused at a push: it has no node)."""
    if not job.is_pull_job or job.state is JobState.DELETING:
        return False
    return not (job.state is JobState.FAILED and not job.shards)


@dataclass(frozen=True)
class BudgetFit:
    """How a job's images meet its namespace's budget."""

    budget: WarmBudget
    kept_bytes: int  # what the namespace's other live jobs keep on `node` (known sizes)
    job_bytes: int  # what the job adds there (known sizes, images kept already not counted again)
    accepted: tuple[ImageCost, ...]
    trimmed: tuple[ImageCost, ...] = ()
    unknown: tuple[ImageCost, ...] = field(default=())  # the job's images and the kept ones of unknown size
    refused: bool = False
    node: str = ANY_NODE  # the node the figures are of: the fullest the job may reach (ANY_NODE: unnamed)
    labels: LabelReach = LabelReach()  # the job's label selector, which ANY_NODE meets

    def refusal(self, subject: str) -> str:
        """Why `subject` (e.g. `ImagePullJob team-a/web`) is refused, with every figure."""
        if self.budget.problem:
            return f"{subject} refused: {self.budget.problem}"
        return (f"{subject} refused: namespace {self.budget.namespace} keeps at most "
                f"{show_bytes(self.budget.bytes_per_node)} of images warm per node; {self._where()}its other jobs keep "
                f"{show_bytes(self.kept_bytes)} and this job adds {show_bytes(self.job_bytes)}"
                f"{self._unknown_note()} (policy {self.budget.policy}; annotation {BYTES_ANNOTATION})")

    def note(self) -> str:
        """What the job's message says of the budget when it is accepted (trimmed images, unknown sizes)."""
        parts = []
        if self.trimmed:
            parts.append(f"trimmed by namespace {self.budget.namespace}'s budget of "
                         f"{show_bytes(self.budget.bytes_per_node)} per node (policy Trim): "
                         f"{', '.join(i.reference for i in self.trimmed)} not pulled; "
                         f"{self._where()}{show_bytes(self.kept_bytes + self.job_bytes)} kept with this job")
        if self.unknown:
            parts.append(self._unknown_note().removeprefix("; "))
        return "; ".join(parts)

    def _where(self) -> str:
        return f"on node {self.node} " if self.node else f"on nodes {self.labels.text} " if self.labels.text else ""

    def _unknown_note(self) -> str:
        if not self.unknown:
            return ""
        return (f"; size unknown at apply, not counted against the budget: "
                f"{', '.join(sorted({i.reference for i in self.unknown}))}")


def held_images(kept: Iterable[ImageCost]) -> dict[str, ImageCost]:
    """`kept` by identity, each digest once (the first of its references)."""
    held: dict[str, ImageCost] = {}
    for image in kept:
        held.setdefault(image.identity, image)
    return held


def _on(node: str, images: Iterable[ImageCost]) -> list[ImageCost]:
    return [i for i in images if i.nodes is None or node in i.nodes]


def _reached(nodes: frozenset[str] | None, kept: Sequence[ImageCost]) -> list[str]:
    """The nodes a job of `nodes` may reach, as far as the budget can tell them apart: those it names, or
    every node a kept job names and `ANY_NODE`."""
    if nodes is not None:
        return sorted(nodes)
    return [*sorted({n for i in kept if i.nodes is not None for n in i.nodes}), ANY_NODE]


def _places(kept: Sequence[ImageCost]) -> list[tuple[str, LabelReach]]:
    """Where the namespace's images may meet: each node a job names, and a node of each job's label selector
    no job names (`ANY_NODE`), which holds the images of every job whose selector may reach it."""
    named = sorted({n for i in kept if i.nodes is not None for n in i.nodes})
    reaches = list(dict.fromkeys(i.labels for i in kept if i.nodes is None)) or [LabelReach()]
    return [*((node, LabelReach()) for node in named), *((ANY_NODE, reach) for reach in reaches)]


def usage_line(budget: WarmBudget, kept: Iterable[ImageCost]) -> str:
    """What `prewarm describe job` says of the namespace's budget: what its live jobs keep on the fullest node.

    >>> usage_line(WarmBudget("ns", 1000), [ImageCost("a", "d", 500), ImageCost("b", "d", 500), ImageCost("c")])
    'namespace ns: 500 bytes of 1000 bytes per node kept (policy Refuse); size unknown: c'
    """
    if budget.problem:
        return budget.problem
    kept = list(kept)
    used = {(node, reach): sum(i.bytes or 0 for i in held_images(
        _on(node, [i for i in kept if i.labels.shares_a_node_with(reach)])).values()) for node, reach in _places(kept)}
    fullest = max(used, key=lambda place: (used[place], place[0], place[1].text))
    node, reach = fullest
    where = f" on node {node}" if node else f" on nodes {reach.text}" if reach.text else ""
    unknown = sorted({i.reference for i in kept if i.bytes is None})
    return (f"namespace {budget.namespace}: {show_bytes(used[fullest])} of {show_bytes(budget.bytes_per_node)} "
            f"per node kept{where} (policy {budget.policy})") + (f"; size unknown: {', '.join(unknown)}" if unknown
                                                                 else "")


def fit(budget: WarmBudget, images: Sequence[ImageCost], kept: Iterable[ImageCost], policy: BudgetPolicy, *,
        can_trim: bool, nodes: frozenset[str] | None = None, labels: LabelReach = LabelReach()) -> BudgetFit:
    """How the job of `images`, which may reach `nodes` (None: any node `labels` allows), fits `budget` beside
    `kept` (the images of the namespace's other live jobs) on every node it may reach: with `policy` `Trim` and
    `can_trim` (a list job), its images in order while they fit; otherwise all or none (`refused`). An image
    whose digest is kept already on a node costs nothing there.

    >>> b = WarmBudget("ns", 110)
    >>> f = fit(b, [ImageCost("a", "d1", 60), ImageCost("b", "d2", 50)], [ImageCost("c", "d1", 60)],
    ...         BudgetPolicy.REFUSE, can_trim=False)
    >>> f.refused, f.kept_bytes, f.job_bytes
    (False, 60, 50)
    """
    kept = [i for i in kept if i.labels.shares_a_node_with(labels)]  # the others' nodes are never this job's
    reached = _reached(nodes, kept)
    held = {node: held_images(_on(node, kept)) for node in reached}
    start = {node: sum(i.bytes or 0 for i in held[node].values()) for node in reached}
    unknown = list(held_images(i for node in reached for i in held[node].values() if i.bytes is None).values())
    if budget.problem:
        return BudgetFit(budget, max(start.values()), 0, (), refused=True)
    accepted: list[ImageCost] = []
    trimmed: list[ImageCost] = []
    used = dict(start)
    for image in images:
        adds = {node: 0 if image.identity in held[node] else image.bytes or 0 for node in reached}
        if image.bytes is None and any(image.identity not in held[node] for node in reached):
            unknown.append(image)
        if policy is BudgetPolicy.TRIM and can_trim and any(
                adds[node] and used[node] + adds[node] > budget.bytes_per_node for node in reached):
            trimmed.append(image)
            continue
        for node in reached:
            held[node].setdefault(image.identity, image)
            used[node] += adds[node]
        accepted.append(image)
    # A job that adds nothing on a node (its images are kept there already) is never refused for that node,
    # even over a budget since lowered.
    over = [node for node in reached if used[node] > start[node] and used[node] > budget.bytes_per_node]
    worst = max(over or reached, key=lambda node: (used[node], node))
    return BudgetFit(budget, start[worst], used[worst] - start[worst], tuple(accepted), tuple(trimmed),
                     tuple(i for i in unknown if i not in trimmed), bool(over) or not accepted, worst, labels)
