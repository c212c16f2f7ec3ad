"""Applying, reading and deleting jobs: the one path used by the CLI and by `on_image_push`."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.cronjobs import AdvancedCronJob
from prewarm.domain.eta import Estimate
from prewarm.domain.images import parse_image
from prewarm.domain.job import ApiKind, StoredJob
from prewarm.domain.jobs import (
    PREWARM_API_VERSION,
    ImageListPullJob,
    ImagePullJob,
    JobState,
    job_key,
    own_pull_secret_problems,
)
from prewarm.domain.keys import JobKey
from prewarm.domain.liveness import is_silent
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import NodePhase
from prewarm.domain.nodes import NodeWarm
from prewarm.domain.placement import ExcludedNode
from prewarm.domain.replication import replication_note
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.rules import PrewarmRule
from prewarm.domain.snapshots import WarmSnapshot
from prewarm.domain.sources import (
    Source,
    SourceConflictError,
    reserved_annotation_problems,
    resource_uid,
    source_of,
)
from prewarm.domain.status import (
    COMPLETED_MESSAGE,
    FailedImageStatus,
    ImageListPullJobStatus,
    JobStatus,
    NodeTaskRecord,
    WaveProgress,
    progress_message,
)
from prewarm.domain.warm_budgets import ImageCost
from prewarm.services.eta import first_estimate, job_estimate
from prewarm.services.lifecycle import release_images
from prewarm.services.ports import (
    ApplyItems,
    ImageSizes,
    PlanItems,
    PullSecretReader,
    StoreConflictError,
    TaskQueues,
    TaskSendError,
)
from prewarm.services.warm_budgets import budget_fit

log = logging.getLogger(__name__)

ApplyOutcome = Literal["created", "configured", "unchanged", "refused"]

class JobNotFoundError(LookupError):
    """No job of that namespace and name (in that cluster)."""


def not_found(namespace: str, name: str, cluster: str, *, kind: str = "job") -> JobNotFoundError:
    """`JobNotFoundError` naming the missing job (or `kind`, e.g. an advancedcronjob) and where it was looked for."""
    where = f' of cluster "{cluster}"' if cluster else ""
    return JobNotFoundError(f'{kind} "{name}" not found in namespace "{namespace}"{where}')


@dataclass
class Applied:
    kind: str
    namespace: str
    name: str
    outcome: ApplyOutcome
    children: list[Applied] = field(default_factory=list)
    cluster: str = DEFAULT_CLUSTER
    # What the namespace's warm budget says of it (trimmed images, sizes unknown); the refusal at a push.
    note: str = ""

    def describe(self) -> str:
        """The kubectl-style line, e.g. `imagepulljob.apps.kruise.io/job-x created`."""
        group = "prewarm.dev" if self.kind in ("PrewarmRule", "WarmSnapshot") else "apps.kruise.io"
        return f"{self.kind.lower()}.{group}/{self.name} {self.outcome}"


def apply_manifest(
    store: ApplyItems, doc: dict[str, Any], *, now: float, from_resource: bool = False,
    secrets: PullSecretReader | None = None, cluster: str = DEFAULT_CLUSTER, sizes: ImageSizes | None = None,
) -> Applied:
    """Validates one manifest (job, list job or rule) and stores it. Raises the domain's validation error,
    or `SourceConflictError` when the name belongs to a resource (or, `from_resource`, to the CLI), or
    `WarmBudgetExceededError` when a job does not fit its namespace's warm budget (`sizes` reads its images').

    Only the resource sync (`from_resource`) may apply a manifest marked as a resource's. A manifest
    with `pullSecretsOnly` is refused unless each of its `pullSecrets` exists in its namespace, read
    through `secrets` (the cluster's `ClusterError` goes through when it cannot be read). A job goes to
    `cluster` (the stack's own by default); a rule belongs to the stack and selects its clusters itself.
    """
    from prewarm.domain.kubernetes import JobValidationError, manifest_subject

    if not from_resource and (problems := reserved_annotation_problems(doc)):
        raise JobValidationError(problems, manifest_subject(doc))
    obj = parse_manifest(doc)
    if isinstance(obj, WarmSnapshot):
        from prewarm.services.bakes import apply_warm_snapshot

        return Applied("WarmSnapshot", "", obj.name, apply_warm_snapshot(store, obj))  # type: ignore[arg-type]
    check_own_pull_secrets(obj, secrets)
    if isinstance(obj, PrewarmRule):
        manifest = obj.to_manifest()
        name = obj.metadata.name
        current = next((r for r in store.list_rules() if r.get("metadata", {}).get("name") == name), None)
        if current is not None:
            check_source("PrewarmRule", "", obj.metadata.name, owner=source_of(current), by=source_of(manifest))
        outcome = store.put_rule(obj.metadata.name, manifest, obj.spec_hash())
        return Applied("PrewarmRule", "", obj.metadata.name, outcome)  # type: ignore[arg-type]
    if isinstance(obj, AdvancedCronJob):
        return apply_cron_job(store, obj, cluster=cluster)
    return apply_job(store, obj, now=now, cluster=cluster, sizes=sizes)


def apply_cron_job(store: ApplyItems, job: AdvancedCronJob, *, cluster: str = DEFAULT_CLUSTER) -> Applied:
    """Stores an AdvancedCronJob; the table stream then puts its schedules (`services.cron_jobs`). The whole
    manifest is hashed: a resource's new generation is written even when its spec is the same."""
    key = job_key(job.namespace, job.name, cluster)
    manifest = job.to_manifest()
    current = store.get_cron_job(key)
    if current is not None:
        check_source("AdvancedCronJob", job.namespace, job.name, owner=source_of(current.manifest),
                     by=source_of(manifest))
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    outcome = store.put_cron_job(key, manifest, digest, uid=resource_uid(manifest))
    return Applied("AdvancedCronJob", job.namespace, job.name, outcome, cluster=cluster)  # type: ignore[arg-type]


def check_own_pull_secrets(obj: ImagePullJob | ImageListPullJob | PrewarmRule | AdvancedCronJob,
                           secrets: PullSecretReader | None) -> None:
    """Refuses a job or rule whose `pullSecretsOnly` names a secret its namespace lacks (it could pull
    with nothing), naming the field and the secret."""
    from prewarm.domain.kubernetes import JobValidationError

    if isinstance(obj, PrewarmRule):
        spec, namespace, at = obj.spec.template.spec, obj.spec.template.metadata.namespace, "spec.template.spec"
    elif isinstance(obj, AdvancedCronJob):
        spec, namespace, at = obj.template.spec, obj.namespace, "spec.template.imageListPullJobTemplate.spec"
    else:
        spec, namespace, at = obj.spec, obj.namespace, "spec"
    if not spec.pull_secrets_only:
        return
    subject = f"{obj.kind} {obj.metadata.name if isinstance(obj, PrewarmRule) else obj.key}"
    if secrets is None:
        raise JobValidationError([(f"{at}.pullSecretsOnly", "cannot check that its pullSecrets exist: no cluster "
                                                            "to read them from")], subject)
    names = dict.fromkeys(spec.pull_secrets or ())
    found = {name: secrets.get_secret(namespace, name) for name in names}
    if problems := own_pull_secret_problems(spec, namespace, found, at=at):
        raise JobValidationError(problems, subject)


def check_source(kind: str, namespace: str, name: str, *, owner: Source, by: Source) -> None:
    """Refuses a change of a resource's job or rule from elsewhere, and a resource over another's name."""
    if owner == by or Source.RESOURCE not in (owner, by):
        return
    what = f"{kind.lower()} {namespace + '/' if namespace else ''}{name}"
    if owner is Source.RESOURCE:
        raise SourceConflictError(
            f"{what} is managed by its {kind} resource ({PREWARM_API_VERSION}): change or delete it with kubectl")
    made = "was made by a PrewarmRule on an image push:" if owner is Source.RULE else (
        "is a run of an AdvancedCronJob:") if owner is Source.CRON else (
        f"was applied with the prewarm CLI: delete it with `prewarm delete` before creating the {kind} resource, or")
    raise SourceConflictError(f"{what} {made} give the resource another name")


def apply_job(
    store: ApplyItems,
    job: ImagePullJob | ImageListPullJob,
    *,
    now: float,
    platforms: list[dict[str, str]] | None = None,
    owner: str = "",
    cluster: str = DEFAULT_CLUSTER,
    layers: int | None = None,
    awaits_replica: str = "",
    sizes: ImageSizes | None = None,
    leaving: Collection[JobKey] = (),
    cost: ImageCost | None = None,
) -> Applied:
    """Creates the job, or re-plans it when its spec changed; the same spec twice is a no-op.
    A new or changed spec must fit its namespace's warm budget (`services.warm_budgets`: `sizes` reads the
    images' sizes, `leaving` are jobs about to go with it; a list job's child is given its `cost`), or
    `WarmBudgetExceededError` is raised and nothing already stored changes.
    A job created with `awaits_replica` is not planned until that hold is lifted (`services.push`).

    A change of what is pulled (image, pull policy, secrets, sandbox config) starts a new round on every
    node; any other change (selector, parallelism, deadlines) re-plans the current round. Editing a
    finished job runs it again: its completion is cleared and the plan decides anew.
    A list job that no longer lists an image marks that image's job for deletion (the control plane
    cancels its pulls).
    """
    if isinstance(job, ImageListPullJob):
        return _apply_list_job(store, job, now=now, cluster=cluster, sizes=sizes)
    key = job_key(job.namespace, job.name, cluster)
    note = ""
    if cost is None and not owner and (found := budget_fit(store, sizes, job, cluster=cluster, leaving=leaving)):
        cost, note = found.accepted[0], found.note()
    return retry_on_conflict(
        lambda: _apply_once(store, job, now=now, platforms=platforms, owner=owner, cluster=cluster,
                            layers=layers, awaits_replica=awaits_replica, cost=cost, note=note),
        conflict=StoreConflictError, attempts=5,
        exhausted=lambda: StoreConflictError(f"job {key} kept changing while being applied; try again"),
    )


def _apply_once(
    store: ApplyItems, job: ImagePullJob, *, now: float, platforms: list[dict[str, str]] | None, owner: str,
    cluster: str, layers: int | None = None, awaits_replica: str = "", cost: ImageCost | None = None, note: str = "",
) -> Applied:
    """One read and one conditional write; a job created or changed meanwhile raises `StoreConflictError`."""
    warm = {} if cost is None else {"warm_digest": cost.digest, "warm_bytes": cost.bytes, "budget_note": note}
    ns, name = job.metadata.namespace, job.metadata.name
    key = job_key(ns, name, cluster)
    manifest = job.to_manifest()
    spec_hash = job.spec_hash()
    current = store.get_job(key)
    if current is None:
        store.create_job(StoredJob(
            namespace=ns, name=name, uid=str(uuid.uuid4()), api_kind=ApiKind.IMAGE_PULL_JOB, manifest=manifest,
            spec_hash=spec_hash, start_time=now, created_at=now, platforms=platforms or [], owner=owner,
            cluster=cluster, layers=layers, awaits_replica=awaits_replica, **warm,  # type: ignore[arg-type]
        ))
        return Applied("ImagePullJob", ns, name, "created", cluster=cluster, note=note)
    if not current.owner:
        check_source("ImagePullJob", ns, name, owner=current.source, by=source_of(manifest))
    if current.spec_hash == spec_hash and (platforms is None or platforms == current.platforms) and (
            layers is None or layers == current.layers):
        if not current.is_unplanned_for_long(now):
            return Applied("ImagePullJob", ns, name, "unchanged", cluster=cluster)
        # Never planned (its stream record went to the DLQ): applying again retriggers the plan.
        store.replace_job_spec(current.replanned(), expected_hash=spec_hash)
        return Applied("ImagePullJob", ns, name, "configured", cluster=cluster)
    if not warm and current.spec_hash != spec_hash:  # no budget counted it: what was counted is of the old spec
        warm = {"warm_digest": "", "warm_bytes": None, "budget_note": ""}
    store.replace_job_spec(replace(current.respecified(manifest, spec_hash, now=now, platforms=platforms,
                                                       layers=layers), **warm),  # type: ignore[arg-type]
                           expected_hash=current.spec_hash)
    return Applied("ImagePullJob", ns, name, "configured", cluster=cluster, note=note)


def _apply_list_job(store: ApplyItems, job: ImageListPullJob, *, now: float, cluster: str,
                    sizes: ImageSizes | None = None) -> Applied:
    """An ImageListPullJob is stored as itself plus one child ImagePullJob per image, as Kruise does; with
    a warm budget whose policy is `Trim`, one per image that fits, in list order."""
    ns, name = job.metadata.namespace, job.metadata.name
    key = job_key(ns, name, cluster)
    manifest = job.to_manifest()
    spec_hash = job.spec_hash()
    current = store.get_job(key)
    if current is not None:
        check_source("ImageListPullJob", ns, name, owner=current.source, by=source_of(manifest))
    children = list(job.child_jobs())
    costs: dict[str, ImageCost] = {}
    note = current.budget_note if current is not None and current.spec_hash == spec_hash else ""
    if (found := budget_fit(store, sizes, job, cluster=cluster)) is not None:
        costs, note = {c.reference: c for c in found.accepted}, found.note()
        children = [c for c in children if parse_image(c.spec.image).pull_reference in costs]
    elif current is not None and current.spec_hash == spec_hash and current.budget_note:
        children = [c for c in children if c.metadata.name in current.children]  # none trimmed comes back
    child_names = [c.metadata.name for c in children]
    applied_children = [apply_job(store, c, now=now, owner=key, cluster=cluster,
                                  cost=costs.get(parse_image(c.spec.image).pull_reference)) for c in children]
    if current is None:
        store.create_job(
            StoredJob(namespace=ns, name=name, uid=str(uuid.uuid4()), api_kind=ApiKind.IMAGE_LIST_PULL_JOB,
                      manifest=manifest, spec_hash=spec_hash, start_time=now, created_at=now, planned="list",
                      children=child_names, cluster=cluster, budget_note=note)
        )
        outcome: ApplyOutcome = "created"
    elif current.spec_hash == spec_hash:
        outcome = "unchanged"
    else:
        stale = set(current.children) - set(child_names)
        changed = replace(current, manifest=manifest, generation=current.generation + 1, spec_hash=spec_hash,
                          budget_note=note)
        store.replace_job_spec(changed, expected_hash=current.spec_hash)
        store.set_job_fields(key, {"children": child_names})
        outcome = "configured"
        for child in sorted(stale):
            # Its pulls are cancelled by the control plane, which sees the child marked Deleting.
            _mark_deleting(store, job_key(ns, child, cluster), now=now)
    return Applied("ImageListPullJob", ns, name, outcome, applied_children, cluster=cluster, note=note)


def request_deletion(
    store: ApplyItems, namespace: str, name: str, *, now: float, by: Source = Source.CLI,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """Marks a job (and a list job's children) for deletion; the control plane does the rest.

    This is all the CLI does: the node queues take messages from the stack's roles only, so the
    cancels are sent by `complete_deletion`, run by `dispatch_job` on the job's stream record (and by
    the sweep if that record is lost). Reports racing with the delete find the job `Deleting` and
    change nothing. Returns how many in-flight pulls will be cancelled.
    """
    key = job_key(namespace, name, cluster)
    record = store.get_job(key)
    if record is None:
        raise not_found(namespace, name, cluster)
    if by is not Source.RESOURCE and record.source is Source.RESOURCE:
        check_source(record.api_kind, namespace, name, owner=Source.RESOURCE, by=by)
    children = record.children if record.is_list_job else []
    return sum(_mark_deleting(store, record.sibling(c), now=now) for c in children) + _mark_deleting(
        store, key, now=now)


def _mark_deleting(store: ApplyItems, key: str, *, now: float) -> int:
    record = store.get_job(key)
    if record is None:
        return 0
    if record.state != JobState.DELETING:
        store.set_job_fields(key, {"state": JobState.DELETING, "message": "job is being deleted",
                                   "deleting_since": now})
    return len(_in_flight(store, record))


def _in_flight(store: PlanItems, record: StoredJob) -> list[NodeTaskRecord]:
    if not record.shards:
        return []
    return [t for t in store.get_tasks(record.key, shards=record.ref.shards)
            if t.dispatched_at is not None and not t.phase.is_terminal]


def complete_deletion(store: PlanItems, queues: TaskQueues, key: str, *, remove_after: int | None = None) -> int:
    """The control plane's half of a delete: cancels the in-flight pulls, releases its images where no other
    job wants them (`services.lifecycle`: unpinned, removed `remove_after` seconds later), then removes the
    job's items.

    Safe to run again (a stream retry, the sweep): a job already gone is a no-op. Returns cancels sent.
    """
    record = store.get_job(key)
    if record is None or record.state != JobState.DELETING:
        return 0
    cancels = [record.cancel_task(t.node, round=t.round, reason="job deleted") for t in _in_flight(store, record)]
    failures = queues.send_many(cancels) if cancels else []
    if failures:
        # Kept for a retry: once the items are gone, nobody could tell whom to cancel.
        raise TaskSendError(failures)
    release_images(store, queues, record, remove_after=remove_after)
    store.delete_job(key)
    return len(cancels)


def delete_job(store: ApplyItems, queues: TaskQueues, namespace: str, name: str, *, now: float = 0.0,
               cluster: str = DEFAULT_CLUSTER) -> int:
    """Both halves of a delete in one process (the control plane's own tests and tools); returns cancels sent."""
    record = store.get_job(job_key(namespace, name, cluster))
    request_deletion(store, namespace, name, now=now, cluster=cluster)
    children = record.children if record is not None and record.is_list_job else []
    keys = [job_key(namespace, c, cluster) for c in children] + [job_key(namespace, name, cluster)]
    return sum(complete_deletion(store, queues, k) for k in keys)


@dataclass
class JobView:
    """A job's status as Kruise reports it, plus Prewarm's per-node detail.

    `failed_nodes` and `excluded` come from their own items (the job item holds neither, so it does not
    grow with the fleet); a list view without `with_tasks` reads failed nodes only for jobs that have some.
    """

    record: StoredJob
    desired: int
    active: int
    succeeded: int
    failed: int
    failed_nodes: list[str]
    message: str
    completion_time: float | None
    tasks: list[NodeTaskRecord] = field(default_factory=list)
    children: list[JobView] = field(default_factory=list)
    excluded: list[ExcludedNode] = field(default_factory=list)
    # Nodes whose agent said hello, read (`with_agents`) when some node still waits; None when not read.
    agents: frozenset[str] | None = None
    # How the job's nodes that joined with the startup taint warmed (`with_agents`, `Never` jobs).
    warm: dict[str, NodeWarm] = field(default_factory=dict)
    # Nodes Pulling whose agent has not reported for a while (`prewarm.domain.liveness`): a dead agent.
    silent_agents: int = 0
    # Where a job with a seed wave stands, and the round's ETA (read with its tasks); its first ETA, kept.
    wave: WaveProgress | None = None
    estimate: Estimate | None = None
    first_estimate: Estimate | None = None


def view_job(
    store: ApplyItems, namespace: str, name: str, *, now: float, with_tasks: bool = False, with_agents: bool = False,
    cluster: str = DEFAULT_CLUSTER,
) -> JobView:
    """One job; `with_tasks` reads its nodes, and `with_agents` the registered agents when a node still
    waits (so that a node with no agent can be told from one waiting its turn) or the job is `Never`
    (how its nodes warmed)."""
    record = store.get_job(job_key(namespace, name, cluster))
    if record is None:
        raise not_found(namespace, name, cluster)
    view = _view(store, record, now=now, with_tasks=with_tasks)
    if record.shards and not with_tasks:  # with_tasks has read them already
        view.excluded = store.get_excluded(record.key, shards=record.shards)
    waiting = any(t.phase is NodePhase.WAITING for t in view.tasks)
    if with_agents and (waiting or (view.tasks and record.is_never)):
        nodes = store.list_nodes(cluster)
        if waiting:
            view.agents = frozenset(n.name for n in nodes)
        mine = {t.node for t in view.tasks}
        view.warm = {n.name: n.warm for n in nodes if n.warm is not None and n.name in mine}
    return view


def view_record(store: ApplyItems, record: StoredJob, *, now: float) -> JobView:
    """A job's view from its record read already (its list job's children and failed nodes are read)."""
    return _view(store, record, now=now, with_tasks=False)


def _view(store: ApplyItems, record: StoredJob, *, now: float, with_tasks: bool) -> JobView:
    if record.is_list_job:
        children = []
        for child in record.children:
            child_record = store.get_job(record.sibling(child))
            if child_record is not None:
                children.append(_view(store, child_record, now=now, with_tasks=with_tasks))
        desired = sum(c.desired for c in children)
        done = all(c.completion_time is not None for c in children) and bool(children)
        return JobView(
            record=record, desired=desired, active=sum(c.active for c in children),
            succeeded=sum(c.succeeded for c in children), failed=sum(c.failed for c in children),
            failed_nodes=sorted({n for c in children for n in c.failed_nodes}),
            message=(COMPLETED_MESSAGE if done else f"{sum(c.completion_time is not None for c in children)}"
                     f"/{len(children)} images completed") + (f"; {record.budget_note}" if record.budget_note else ""),
            completion_time=max((c.completion_time or 0 for c in children), default=None) if done else None,
            children=children, silent_agents=sum(c.silent_agents for c in children),
        )
    c = record.counters
    message = record.message or progress_message(c.desired, c.succeeded, c.failed, record.state == JobState.COMPLETED)
    if record.placement_note:
        message += f"; {record.placement_note}"
    if record.awaits_replica:
        message += f"; {replication_note(record.awaits_replica)}"
    if record.budget_note:
        message += f"; {record.budget_note}"
    shards = record.ref.shards
    tasks = store.get_tasks(record.key, shards=shards) if with_tasks and record.shards else []
    if with_tasks:
        failed_nodes = [t.node for t in tasks if t.failed and t.round == record.round]
    elif c.failed and record.shards:
        failed_nodes = store.failed_nodes(record.key, shards=shards)
    else:
        failed_nodes = []
    wave = (WaveProgress.of(record.seeds, {t.node: t for t in tasks if t.round == record.round})
            if with_tasks and record.seeds else None)
    return JobView(
        record=record, desired=c.desired, active=c.active, succeeded=c.succeeded, failed=c.failed,
        failed_nodes=sorted(failed_nodes), message=message, completion_time=record.completion_time, tasks=tasks,
        wave=wave, first_estimate=first_estimate(record) if record.is_pull_job else None,
        estimate=job_estimate(store, record, tasks, now=now) if with_tasks and record.is_pull_job else None,
        excluded=store.get_excluded(record.key, shards=shards) if with_tasks and record.shards else [],
        silent_agents=_silent(tasks, record, now) if record.is_dispatching else 0,
    )


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(int(epoch), UTC)


def kruise_status(view: JobView) -> JobStatus | ImageListPullJobStatus:
    """The job's status field for field as Kruise reports it (the CLI's `-o yaml` and the resources')."""
    return list_job_status(view) if view.record.is_list_job else job_status(view)


def job_status(view: JobView) -> JobStatus:
    """An ImagePullJob's status, field for field as Kruise reports it."""
    r = view.record
    return JobStatus(
        desired=view.desired, active=view.active, succeeded=view.succeeded, failed=view.failed,
        failed_nodes=view.failed_nodes, start_time=_utc(r.start_time), completion_time=_utc(view.completion_time),
        message=view.message,
    )


def list_job_status(view: JobView) -> ImageListPullJobStatus:
    """An ImageListPullJob's status as Kruise reports it: counts of its ImagePullJobs, failed images listed."""
    by_image = {c.record.image: c for c in view.children}
    images = view.record.images
    failed: list[FailedImageStatus] = []
    for image in images:
        child = by_image.get(image)
        if child is not None and child.failed:
            message = f"failed on {child.failed} of {child.desired} nodes: {', '.join(child.failed_nodes)}"
            failed.append(FailedImageStatus(image_pull_job=child.record.name, name=image, message=message))
        elif child is None and view.record.budget_note:
            failed.append(FailedImageStatus(image_pull_job="", name=image, message=view.record.budget_note))
    children = list(by_image.values())
    return ImageListPullJobStatus(
        desired=len(images),
        active=sum(c.active > 0 for c in children),
        completed=sum(c.completion_time is not None for c in children),
        succeeded=sum(c.completion_time is not None and c.succeeded == c.desired for c in children),
        failed_image_statuses=failed,
        start_time=_utc(view.record.start_time),
        completion_time=_utc(view.completion_time),
    )


def list_views(store: ApplyItems, *, namespace: str | None, now: float, cluster: str | None = None) -> list[JobView]:
    """Every top-level job (of `namespace` and `cluster` when given; children of list jobs appear under
    their list job). A running job with active nodes has its nodes read, to count the silent agents
    among them."""
    views = [
        view_record(store, r, now=now)
        for r in sorted(store.list_jobs(), key=lambda r: (r.cluster, r.namespace, r.name))
        if not r.owner and (namespace is None or r.namespace == namespace) and (cluster is None or r.cluster == cluster)
    ]
    for view in views:
        for part in view.children or [view]:
            record = part.record
            if record.is_dispatching and record.counters.active and not part.tasks:
                tasks = store.get_tasks(record.key, shards=record.ref.shards)
                part.silent_agents = _silent(tasks, record, now)
        if view.children:
            view.silent_agents = sum(c.silent_agents for c in view.children)
    return views


def _silent(tasks: Iterable[NodeTaskRecord], record: StoredJob, now: float) -> int:
    return len(_silent_tasks(tasks, record, now))


def _silent_tasks(tasks: Iterable[NodeTaskRecord], record: StoredJob, now: float) -> list[NodeTaskRecord]:
    return [t for t in tasks if t.round == record.round and is_silent(t, now=now)]


def silent_pulls_by_node(store: PlanItems, *, now: float, cluster: str = DEFAULT_CLUSTER) -> dict[str, int]:
    """Per node of `cluster`, how many pulls of its running jobs have gone silent (their agent is gone or
    cut off). Node names repeat across clusters: another cluster's namesake never counts."""
    counts: dict[str, int] = {}
    for record in store.list_jobs():
        if record.cluster == cluster and record.is_dispatching and record.counters.active:
            for task in _silent_tasks(store.get_tasks(record.key, shards=record.ref.shards), record, now):
                counts[task.node] = counts.get(task.node, 0) + 1
    return counts
