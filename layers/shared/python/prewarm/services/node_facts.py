"""Warm as a node fact after the first hello: a node's `PrewarmWarm` condition and its rules' node labels kept
true to what its pulls say (docs/agent.md, "Warm at boot"; docs/job-spec.md, `spec.nodeLabel`).

The first hello sets the condition (`services.boot`), and a tainted node's `Warmed` sets it again; a node that
never held the taint, or that a new `Never` job selects later, is judged here when reports change its
phases in those jobs or a labelled rule's (`record_status`), and an unverified node once its cluster answers
(`services.verifying`). A rule with `spec.nodeLabel` puts that label on a node once every image of its jobs
there is present, and takes it off while a new one (a new digest pushed) is not. A node in none of a
labelled rule's jobs (it joined after the rule's last push: a rule's jobs are `Always`) holds the label once
every image of the rule's newest jobs is on it through its `Never` jobs or at boot.

Per node judged: its registration, its Node (one GET), and a write only when the condition or a label
differs from what the Node shows; the jobs' node items are read once for all the nodes of a batch, and, for a
batch with a node in a `Never` job while a rule has `spec.nodeLabel`, the rules and jobs once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from prewarm.domain.boot import (
    at_pulls,
    digests_on_node,
    label_patch,
    labels_from_images,
    labels_held,
    node_condition,
    node_label_of,
    pulls_present,
)
from prewarm.domain.images import ImageRef, InvalidImageReference, parse_image
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import NodePhase
from prewarm.domain.rules import REPOSITORY_ANNOTATION, RULE_ANNOTATION, TAG_ANNOTATION, PrewarmRule
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.boot import set_condition
from prewarm.services.ports import (
    ClusterError,
    ClusterInvalidError,
    JobItems,
    NodeItems,
    NodeTaskItems,
    NodeWarmWrites,
    RuleItems,
    StoreError,
)

log = logging.getLogger(__name__)

# Nodes judged per batch and cluster: each costs a GET of its Node and at most two patches (the status path's
# Kubernetes client is bounded: `adapters.bounded`). Past that, the next reports of those nodes judge them.
NODES_PER_BATCH = 100


class FactItems(JobItems, NodeTaskItems, NodeItems, RuleItems, Protocol):
    """Jobs, their node items, registered nodes and rules."""


def judge_nodes(store: FactItems, writes: NodeWarmWrites, cluster: str, nodes: Iterable[str], *, now: float,
                jobs: Iterable[str] = (), every: bool = False) -> list[str]:
    """Sets the condition and the rules' node labels of `nodes` of cluster `cluster` from their tasks in the
    running `Never` jobs and in the running jobs of rules with a node label, and in `jobs` (keys of jobs whose
    reports changed these nodes: a rule's job that just finished is no longer running). `every`: a node in none
    of those jobs is judged too (a node just verified gets its first condition). Returns the nodes
    whose Node was written. A store or cluster that fails is logged: the next reports judge the nodes again."""
    names = sorted(set(nodes))[:NODES_PER_BATCH]
    if not names:
        return []
    try:
        records = _judged_jobs(store, cluster, jobs)
        if not records and not every:
            return []
        tasks = {r.key: store.get_tasks_of(r.ref, names) for r in records}
    except StoreError as e:
        log.warning("nodes %s: their PrewarmWarm condition and labels not judged now: %s", ", ".join(names), e)
        return []
    written: list[str] = []
    late = _LateLabels(store, cluster, names)
    for node in names:
        never = [(r.pull_reference, tasks[r.key][node].phase is NodePhase.SUCCEEDED)
                 for r in records if r.is_running_never and node in tasks[r.key]]
        labelled = [(label, r.pull_reference, tasks[r.key][node].phase is NodePhase.SUCCEEDED)
                    for r in records if (label := node_label_of(r.manifest)) and node in tasks[r.key]]
        if not never and not labelled and not every:
            continue  # in none of these jobs: nothing of its warm-up changed
        try:
            judged = late.of(node, [image for image, _ in never], {key for key, _, _ in labelled})
            if _judge(store, writes, cluster, node, never, labelled, judged, now=now):
                written.append(node)
        except (ClusterError, StoreError) as e:
            log.warning("node %s: its PrewarmWarm condition and labels not written: %s", node, e)
    return written


def sets_node_facts(record: StoredJob) -> bool:
    """Whether a node's tasks in this job are what its condition or a label is judged from: a running `Never`
    job's, or a job of a rule with a node label."""
    return record.is_pull_job and (record.is_running_never or node_label_of(record.manifest) is not None)


def _judged_jobs(store: FactItems, cluster: str, keys: Iterable[str]) -> list[StoredJob]:
    running = {r.key: r for r in store.list_running_jobs(cluster)}
    for key in set(keys) - set(running):
        record = store.get_job(key)
        if record is not None and record.is_pull_job:
            running[record.key] = record
    return [r for r in running.values() if sets_node_facts(r)]


class _LateLabels:
    """The labels of rules whose jobs a node is not in (it joined after their push: a rule's jobs are `Always`),
    judged from the images of each rule's newest jobs (one per repository and tag: the digests `keepDigests`
    keeps are not what a node joining now must have). Read once a batch, and only for a node whose `Never` jobs
    pull an image a labelled rule may push: the rules, then the jobs and their node items."""

    def __init__(self, store: FactItems, cluster: str, names: Sequence[str]) -> None:
        self.store, self.cluster, self.names = store, cluster, names
        self._rules: list[PrewarmRule] | None = None
        self._jobs: dict[str, list[StoredJob]] | None = None
        self._tasks: dict[str, dict[str, NodeTaskRecord]] = {}

    def of(self, node: str, never: Sequence[str], judged: set[str]) -> dict[str, list[tuple[str, bool, bool]]]:
        """Per label not in `judged` (those of the rule jobs the node's tasks were read from), each image of
        the rule's newest jobs: (image, whether its task on the node Succeeded, whether the node is in it)."""
        if not never or not self._may_push(never):
            return {}
        if self._jobs is None:
            self._jobs = self._newest_jobs()
            self._tasks = {job.key: self.store.get_tasks_of(job.ref, self.names)
                           for jobs in self._jobs.values() for job in jobs}
        found: dict[str, list[tuple[str, bool, bool]]] = {}
        for label, jobs in self._jobs.items():
            if label in judged:
                continue
            for job in jobs:
                task = self._tasks[job.key].get(node)
                found.setdefault(label, []).append(
                    (job.pull_reference, task is not None and task.phase is NodePhase.SUCCEEDED, task is not None))
        return found

    def _may_push(self, images: Sequence[str]) -> bool:
        if self._rules is None:
            self._rules = [rule for doc in self.store.list_rules() if (doc.get("spec") or {}).get("nodeLabel")
                           and isinstance(rule := _rule(doc), PrewarmRule)]
        refs = [ref for image in images if (ref := _parsed(image)) is not None]
        return any(rule.pushes_to(ref.repository, ref.registry) for rule in self._rules for ref in refs)

    def _newest_jobs(self) -> dict[str, list[StoredJob]]:
        newest: dict[tuple[str, ...], StoredJob] = {}
        for job in self.store.list_jobs():
            label = node_label_of(job.manifest)
            if label is None or job.cluster != self.cluster or not job.is_pull_job or job.state is JobState.DELETING:
                continue
            notes = job.manifest["metadata"]["annotations"]
            origin = (label, *(str(notes.get(k, "")) for k in (RULE_ANNOTATION, REPOSITORY_ANNOTATION, TAG_ANNOTATION)))
            if origin not in newest or (job.created_at or 0.0) > (newest[origin].created_at or 0.0):
                newest[origin] = job
        jobs: dict[str, list[StoredJob]] = {}
        for (label, *_), job in newest.items():
            jobs.setdefault(label, []).append(job)
        return jobs


def _rule(doc: Mapping[str, Any]) -> Any:
    """A stored rule, or None when it no longer reads as one (validated when applied: an older version's)."""
    try:
        return parse_manifest(doc)
    except JobValidationError as e:
        log.warning("rule %s not read for node labels: %s", (doc.get("metadata") or {}).get("name"), e)
        return None


def _parsed(image: str) -> ImageRef | None:
    try:
        return parse_image(image)
    except InvalidImageReference:
        return None


def _judge(store: FactItems, writes: NodeWarmWrites, cluster: str, node: str, never: Sequence[tuple[str, bool]],
           labelled: Sequence[tuple[str, str, bool]], late: Mapping[str, Sequence[tuple[str, bool, bool]]], *,
           now: float) -> bool:
    """`never`, `labelled`: the node's tasks in the judged jobs (image, whether Succeeded; label first for a
    rule's job). `late`: per label of a rule none of whose judged jobs the node is in, its newest jobs'
    images (`_LateLabels.of`): the label holds once each is on the node by any account."""
    registered = store.get_node(node, cluster)
    at_boot = set(registered.boot.present) if registered is not None and registered.boot is not None else set()
    # Not registered, or not judged yet by its first hello (that hello sets the condition): its labels only.
    judged = registered is not None and (registered.boot is not None or bool(never))
    if not judged and not labelled and not late:
        return False
    seen = writes.get_node(node)
    if seen is None:
        return False  # gone from the cluster: the departures forget it
    on_node = at_boot | digests_on_node(seen)
    present = pulls_present([(image, ok) for image, ok in never], on_node)
    held = labels_held((label, pulls_present([(image, ok)], on_node)[image]) for label, image, ok in labelled)
    pulled = {image for entries in late.values() for image, ok, _ in entries if ok}
    told = {image for entries in late.values() for image, _, in_job in entries if in_job}
    held.update(labels_from_images({label: [image for image, _, _ in entries] for label, entries in late.items()},
                                   {image for image, ok in present.items() if ok} | on_node | pulled,
                                   set(present) | on_node | told))
    condition = None
    if judged and registered is not None:
        condition = at_pulls(registered.boot, list(present), [image for image, ok in present.items() if not ok])
    wrote = False
    if condition is not None and node_condition(seen) != condition:
        set_condition(writes, node, condition, now=now)
        wrote = True
    for key, has in sorted(held.items()):
        if (ops := label_patch(seen, key, has)) is None:
            continue
        try:
            writes.patch_node(node, ops)
        except ClusterInvalidError as e:  # its guard failed: the Node changed since read; the next report tells
            log.info("node %s: label %s not changed now: %s", node, key, e)
            continue
        log.info("node %s: label %s %s", node, key, "set" if has else "removed")
        wrote = True
    return wrote


# Nodes the sweep judges again per cluster, in turn, in one run of ten (the sweep runs each minute): a repair
# of what a report's judgement could not write (a refused patch, an API that failed then); 20 nodes cost
# the running jobs' node items of 20 nodes and at most 20 GETs of a Node, every ten minutes.
REPAIRS_PER_RUN = 20
REPAIR_EVERY_RUNS = 10


def repair_nodes(store: FactItems, writes: NodeWarmWrites, cluster: str, registered: Iterable[str], *,
                 now: float) -> list[str]:
    """The sweep's repair, in one run (the sweep's minute) of `REPAIR_EVERY_RUNS`: `judge_nodes` of the
    `REPAIRS_PER_RUN` registered nodes whose turn it is, from their tasks in the running `Never` jobs and
    labelled rules' jobs. Returns the nodes whose Node was written."""
    run, names = int(now // 60), sorted(registered)
    if not names or run % REPAIR_EVERY_RUNS:
        return []
    start = run // REPAIR_EVERY_RUNS * REPAIRS_PER_RUN % len(names)
    turn = (names[start:] + names[:start])[:REPAIRS_PER_RUN]
    return judge_nodes(store, writes, cluster, turn, now=now)
