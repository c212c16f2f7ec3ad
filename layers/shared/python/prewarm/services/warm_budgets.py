"""A namespace's warm budget at apply: what its other live jobs keep, what the job adds (the rule is
`prewarm.domain.warm_budgets`'s); and the budgets' copy in the table, kept by the resource sync from the
Namespaces' annotations (every apply reads it there: a push's function reaches no cluster)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.images import parse_image
from prewarm.domain.job import ApiKind, StoredJob
from prewarm.domain.jobs import ImageListPullJob, ImagePullJob, JobState, job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.warm_budgets import (
    BudgetFit,
    ImageCost,
    LabelReach,
    WarmBudget,
    WarmBudgetExceededError,
    fit,
    keeps_images_warm,
    named_nodes,
    usage_line,
)
from prewarm.services.ports import ApplyItems, ImageSizes, WarmBudgetItems

log = logging.getLogger(__name__)


def copy_namespace_budgets(store: WarmBudgetItems, namespaces: Sequence[dict[str, Any]], *,
                           cluster: str = DEFAULT_CLUSTER) -> bool:
    """Stores the budgets `namespaces` (every Namespace of `cluster`) declare; False when unchanged."""
    budgets = {b.namespace: b for b in map(WarmBudget.of_namespace, namespaces) if b is not None}
    changed = store.put_warm_budgets(budgets, cluster)
    if changed:
        log.info("warm budgets of cluster %r: %s", cluster,
                 ", ".join(f"{ns} {b.bytes_per_node} ({b.policy})" for ns, b in sorted(budgets.items())) or "none")
    return changed


def _sizer(sizes: ImageSizes | None) -> Callable[[str], ImageCost]:
    """Reads each image's size once (None: every size unknown)."""
    read: dict[str, ImageCost] = {}

    def size(image: str) -> ImageCost:
        if image not in read:
            read[image] = sizes.image_size(image) if sizes is not None else ImageCost(image)
        return read[image]

    return size


def _kept(store: ApplyItems, size: Callable[[str], ImageCost], namespace: str, cluster: str,
          mine: Collection[JobKey]) -> list[ImageCost]:
    """The images the namespace's live jobs in `cluster` keep warm, but those of `mine` (the job applied, and
    what it replaces or retires). A job stored before budgets has its size read now."""
    kept = []
    for other in store.list_jobs():
        if (other.cluster != cluster or other.namespace != namespace or other.key in mine or other.owner in mine
                or not keeps_images_warm(other)):
            continue
        stored = ImageCost(other.pull_reference, other.warm_digest, other.warm_bytes)
        measured = stored if other.warm_digest or other.warm_bytes is not None else size(other.pull_reference)
        selector = other.pull_job.spec.selector
        kept.append(measured.on(named_nodes(selector), LabelReach.of(selector)))
    return kept


def budget_fit(store: ApplyItems, sizes: ImageSizes | None, job: ImagePullJob | ImageListPullJob, *,
               cluster: str, leaving: Collection[JobKey] = ()) -> BudgetFit | None:
    """How `job` fits its namespace's warm budget in `cluster` (None: the namespace has none, or `job` is
    stored with this spec already: a job accepted once is never refused again for the same spec);
    `leaving`: jobs about to go with it (a push's superseded digests), which do not count. Raises
    `WarmBudgetExceededError`, naming the namespace, the budget and the bytes, when it does not fit."""
    budget = store.get_warm_budgets(cluster).get(job.namespace)
    key = job_key(job.namespace, job.name, cluster)
    if budget is None or ((current := store.get_job(key)) is not None and current.spec_hash == job.spec_hash()):
        return None
    policy = budget.policy_for(job.to_manifest())
    size = _sizer(sizes)
    images = job.spec.images if isinstance(job, ImageListPullJob) else [job.spec.image]
    nodes, labels = named_nodes(job.spec.selector), LabelReach.of(job.spec.selector)
    costs = [size(parse_image(image).pull_reference).on(nodes, labels) for image in images]
    kept = _kept(store, size, job.namespace, cluster, {key, *leaving})
    found = fit(budget, costs, kept, policy, can_trim=isinstance(job, ImageListPullJob), nodes=nodes, labels=labels)
    if found.refused:
        raise WarmBudgetExceededError(found.refusal(f"{job.kind} {key}"))
    return found


def budget_usage(store: ApplyItems, namespace: str, *, cluster: str = DEFAULT_CLUSTER) -> str | None:
    """What the namespace's live jobs keep against its warm budget, from the sizes kept on them (no registry
    read: a job stored before budgets counts as unknown); None when the namespace has no budget."""
    budget = store.get_warm_budgets(cluster).get(namespace)
    if budget is None:
        return None
    return usage_line(budget, _kept(store, ImageCost, namespace, cluster, ()))


def refused_at_push(store: ApplyItems, job: ImagePullJob, refusal: str, *, now: float, cluster: str,
                    platforms: list[dict[str, str]] | None) -> None:
    """Records a rule's job that the budget refused at a push as a `Failed` job that was never planned, its
    message the refusal: `prewarm get jobs` shows it, and it keeps nothing warm. Kept when one is there."""
    key = job_key(job.namespace, job.name, cluster)
    if store.get_job(key) is not None:
        return
    store.create_job(StoredJob(
        namespace=job.namespace, name=job.name, uid=str(uuid.uuid4()), api_kind=ApiKind.IMAGE_PULL_JOB,
        manifest=job.to_manifest(), spec_hash=job.spec_hash(), state=JobState.FAILED, start_time=now,
        completion_time=now, created_at=now, message=refusal, platforms=platforms or [], cluster=cluster))
    log.warning("push job refused by its namespace's warm budget: %s", refusal)
