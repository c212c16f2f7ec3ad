"""Kubernetes-native jobs: ImagePullJob, ImageListPullJob, PrewarmRule and AdvancedCronJob resources kept in step
with the table.

`sync_resources` runs every minute. It lists the four resources across the cluster (one paged list
each), compares them with one read of the table's jobs and rules, applies what changed through the
same `apply_manifest` as the CLI, deletes the jobs and rules whose resource is gone, and writes each
resource's status (Kruise's fields, plus Prewarm's node counts and bytes) only when it differs from
what the resource holds. A resource whose `metadata.generation` is the one its job was applied from
costs no table write; a status that did not change costs no API write. So a quiet cluster of 1,000
jobs costs four list calls, one table scan and a byte read per running job; a cron job resource adds a read
of its item (its runs are among the jobs read).

Who meets whom (`prewarm.domain.sources`): a resource owns its name; a CLI job of the same name is
kept, and the resource's status says why it is not applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prewarm.domain.bakes import SnapshotState
from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.cronjobs import cron_job_owning, orphaned_runs
from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.sources import (
    GENERATION_ANNOTATION,
    RESOURCE_API_VERSION,
    RESOURCE_KINDS,
    STACK_KINDS,
    Source,
    SourceConflictError,
    resource_generation,
    resource_manifest,
    resource_uid,
    source_of,
)
from prewarm.domain.status import job_bytes
from prewarm.domain.warm_budgets import WarmBudgetExceededError
from prewarm.services.bakes import delete_warm_snapshot
from prewarm.services.clusters import on_each_cluster, raise_if_own_unreachable, record_health, unreachable
from prewarm.services.cron_jobs import cron_job_status, delete_cron_job
from prewarm.services.jobs import JobView, apply_manifest, kruise_status, list_views, request_deletion
from prewarm.services.ports import (
    ApplyItems,
    ClusterConflictError,
    ClusterDirectory,
    ClusterError,
    ClusterNotFoundError,
    ImageSizes,
    JobStore,
)
from prewarm.services.warm_budgets import copy_namespace_budgets

log = logging.getLogger(__name__)

# A PrewarmRule serves every cluster (`spec.clusters`), so one cluster holds the rule resources: the stack's own.
RULES_FROM_OWN_CLUSTER = ("PrewarmRule resources are read from the stack's own cluster only; "
                          "apply the rule there (spec.clusters selects the clusters it serves)")

__all__ = ["ResourceApi", "SyncReport", "resource_status", "sync_resources"]

Obj = dict[str, Any]


class ResourceApi(Protocol):
    """The Kubernetes API as the sync needs it (`prewarm.adapters.kube.KubeCluster` is one)."""

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None,
                     label_selector: str | None = None) -> list[Obj]: ...

    def replace_status(self, api_version: str, plural: str, name: str, body: Mapping[str, Any],
                       namespace: str | None = None) -> Obj: ...

    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool: ...

    def get_secret(self, namespace: str, name: str) -> Obj | None: ...


@dataclass
class SyncReport:
    """What one sync did, for its log line and metrics."""

    listed: int = 0
    applied: list[str] = field(default_factory=list)
    unchanged: int = 0
    refused: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    statuses_written: int = 0
    status_conflicts: int = 0
    missing_kinds: list[str] = field(default_factory=list)
    # Registered clusters whose API failed this sync (name → why); the others were synced.
    unreachable: dict[str, str] = field(default_factory=dict)

    def add(self, other: SyncReport, cluster: str) -> None:
        """Counts another cluster's sync in this one; its lines name that cluster."""
        def named(lines: list[str]) -> list[str]:
            return [f"{cluster}: {line}" for line in lines] if cluster else lines

        self.listed += other.listed
        self.applied += named(other.applied)
        self.unchanged += other.unchanged
        self.refused += named(other.refused)
        self.deleted += named(other.deleted)
        self.expired += named(other.expired)
        self.statuses_written += other.statuses_written
        self.status_conflicts += other.status_conflicts
        self.missing_kinds += named(other.missing_kinds)


def sync_clusters(store: JobStore, clusters: ClusterDirectory, *, clock: Callable[[], float],
                  sizes: ImageSizes | None = None) -> SyncReport:
    """Each served cluster's resources, side by side (`services.clusters`), so a cluster whose API hangs
    until its timeouts keeps none of the others waiting. A cluster that fails is in `unreachable`; how
    each answered is recorded on its cluster item."""
    runs = on_each_cluster(clusters, lambda name, api: sync_resources(store, api, now=clock(), cluster=name,
                                                                      sizes=sizes), clock=clock)
    report = SyncReport()
    for run in runs:
        if run.outcome is not None:
            report.add(run.outcome, run.name)
    report.unreachable = unreachable(runs)
    record_health(store, clusters, runs, synced=True)
    return report


def run_sync(store: JobStore, clusters: ClusterDirectory, *, clock: Callable[[], float],
             sizes: ImageSizes | None = None) -> SyncReport:
    """The sync's scheduled run: `sync_clusters`; it fails (`ClusterUnavailableError`) when the stack's own
    cluster did, after the others were synced."""
    report = sync_clusters(store, clusters, clock=clock, sizes=sizes)
    raise_if_own_unreachable(report.unreachable, clusters, "synced")
    return report


def sync_resources(store: ApplyItems, api: ResourceApi, *, now: float, cluster: str = DEFAULT_CLUSTER,
                   sizes: ImageSizes | None = None) -> SyncReport:
    """The resources of one cluster (`api` is its API) into the table, their status back to them. A job
    resource belongs to the cluster it lives in; `PrewarmRule` resources, which serve every cluster, are
    read from the stack's own cluster only (elsewhere their status says so). The Namespaces' warm budgets
    are copied to the table first, so that the jobs applied here, with the CLI and at pushes meet them."""
    report = SyncReport()
    try:
        copy_namespace_budgets(store, api.list_objects("v1", "namespaces"), cluster=cluster)
    except ClusterError as e:  # the copy stored stands; an install older than budgets may not list namespaces
        log.warning("namespaces' warm budgets not read in cluster %r: %s", cluster, e)
    listed: dict[str, list[Obj]] = {}
    for kind, plural in RESOURCE_KINDS.items():
        try:
            listed[kind] = api.list_objects(RESOURCE_API_VERSION, plural)
        except ClusterNotFoundError:
            # No CRD: nothing to apply, and nothing is deleted on the strength of an absent type.
            report.missing_kinds.append(f"{plural}.prewarm.dev")
    report.listed = sum(len(objs) for objs in listed.values())
    stored, deleting = _stored_manifests(store, cluster)
    problems: dict[tuple[str, str], str] = {}
    gone: set[str] = set()
    for kind, objs in listed.items():
        for obj in objs:
            key = _key(obj, cluster)
            if kind in STACK_KINDS and cluster != DEFAULT_CLUSTER:
                problems[(kind, key)] = RULES_FROM_OWN_CLUSTER
                continue
            if _orphan_run(obj, stored, cluster):
                # Its cron job went, and the garbage collector has not deleted it yet: not a job to start.
                meta = obj["metadata"]
                api.delete_object(RESOURCE_API_VERSION, RESOURCE_KINDS[kind], meta["name"], meta.get("namespace"))
                report.deleted.append(f"{kind} {key} (a run of a deleted AdvancedCronJob)")
                gone.add(f"{kind} {key}")
                continue
            problem = _apply(store, api, kind, obj, stored.get((kind, key)), report, now=now, cluster=cluster,
                             sizes=sizes)
            if problem is not None:
                problems[(kind, key)] = problem
    _delete_gone(store, listed, stored, deleting, report, now=now, cluster=cluster)
    views: dict[str, JobView] = {v.record.key: v for v in list_views(store, namespace=None, now=now, cluster=cluster)}
    expired = set(report.expired) | gone
    for kind, objs in listed.items():
        for obj in objs:
            key = _key(obj, cluster)
            if f"{kind} {key}" in expired:
                continue
            view = views.get(key) if kind not in (*STACK_KINDS, "AdvancedCronJob") else None
            if view is not None and view.record.source is not Source.RESOURCE:
                view = None  # a CLI job of that name: its status is not this resource's
            status = resource_status(obj, view, problems.get((kind, key)), store=store)
            if kind == "AdvancedCronJob" and (problems.get((kind, key)) is None):
                status = {**_cron_status(store, key, list(views.values()), now=now), **status}
            if status != (obj.get("status") or {}):
                _write_status(api, kind, obj, status, report)
    if report.applied or report.refused or report.deleted or report.statuses_written:
        log.info("resources synced: %d listed, %d applied, %d unchanged, %d refused, %d deleted, %d statuses written",
                 report.listed, len(report.applied), report.unchanged, len(report.refused), len(report.deleted),
                 report.statuses_written)
    return report


def _apply(store: ApplyItems, api: ResourceApi, kind: str, obj: Obj, current: Obj | None, report: SyncReport, *,
           now: float, cluster: str, sizes: ImageSizes | None) -> str | None:
    """Applies one resource unless its job holds its generation already; the problem when refused."""
    key, meta = _key(obj, cluster), obj["metadata"]
    if current is not None and source_of(current) is Source.RESOURCE and (
            resource_generation(current) == str(meta.get("generation", ""))) and (
            kind != "AdvancedCronJob" or resource_uid(current) == str(meta.get("uid", ""))):
        report.unchanged += 1
        return None
    if current is None and kind in ("ImagePullJob", "ImageListPullJob") and (obj.get("status") or {}).get(
            "completionTime"):
        # Its job finished and ttlSecondsAfterFinished removed it: as Kruise, the resource goes too.
        api.delete_object(RESOURCE_API_VERSION, RESOURCE_KINDS[kind], meta["name"], meta.get("namespace"))
        report.expired.append(f"{kind} {key}")
        return None
    try:
        applied = apply_manifest(store, resource_manifest(obj), now=now, from_resource=True, secrets=api,
                                 cluster=cluster, sizes=sizes)
    except (JobValidationError, SourceConflictError, WarmBudgetExceededError) as e:
        report.refused.append(f"{kind} {key}: {e}")
        return str(e)
    except ClusterError as e:
        # Only the pullSecretsOnly check reads the cluster here; unchecked is not applied (the next sync
        # tries again), so such a job never starts without its secrets.
        problem = f"cannot check that spec.pullSecrets exist (spec.pullSecretsOnly): {e}"
        report.refused.append(f"{kind} {key}: {problem}")
        return problem
    report.applied.append(f"{kind} {key} {applied.outcome}")
    return None


def resource_status(obj: Mapping[str, Any], view: JobView | None, problem: str | None, *, store: ApplyItems) -> Obj:
    """The status a resource should hold: Kruise's fields and Prewarm's node counts and bytes for a job,
    `observedGeneration`, and `message` saying why it is not applied when it is not."""
    generation = (obj.get("metadata") or {}).get("generation")
    status: Obj = {}
    if view is not None:
        status.update(kruise_status(view).to_dict())
        if view.record.is_pull_job:
            status["nodes"] = _node_counts(view)
            if view.active and view.record.shards:
                done, total = job_bytes(store.get_tasks(view.record.key, shards=view.record.ref.shards))
                status["bytes"] = {"done": done, "total": total}
            elif (old := (obj.get("status") or {}).get("bytes")) is not None and not view.active:
                status["bytes"] = old  # the last figures stand once nothing is pulling
    if problem is not None:
        status["message"] = f"not applied: {problem}"
    elif obj.get("kind") == "PrewarmRule":
        status["message"] = "rule is active"
    elif obj.get("kind") == "WarmSnapshot":
        found = store.get_warm_snapshot(str((obj.get("metadata") or {}).get("name", "")))
        status.update(SnapshotState.from_dict(found[1] if found else None).resource_status())
    if generation is not None and problem is None:
        status["observedGeneration"] = generation
    return status


def _cron_status(store: ApplyItems, key: str, views: Sequence[JobView], *, now: float) -> Obj:
    """An AdvancedCronJob resource's Kruise status (its runs, among the sync's job views), when its cron job
    is the resource's."""
    stored = store.get_cron_job(JobKey.parse(key))
    if stored is None or source_of(stored.manifest) is not Source.RESOURCE:
        return {}
    return cron_job_status(store, stored, now=now, views=views)


def _orphan_run(obj: Mapping[str, Any], stored: Mapping[tuple[str, str], Obj], cluster: str) -> bool:
    """Whether `obj` is the run object of a cron job the table no longer holds as a resource."""
    owner = cron_job_owning(obj) if obj.get("kind") == "ImageListPullJob" else None
    if owner is None:
        return False
    cron = stored.get(("AdvancedCronJob", job_key(obj["metadata"].get("namespace", ""), owner, cluster)))
    return cron is None or source_of(cron) is not Source.RESOURCE


def _node_counts(view: JobView) -> dict[str, int]:
    waiting = max(0, view.desired - view.active - view.succeeded - view.failed)
    return {"waiting": waiting, "pulling": view.active, "succeeded": view.succeeded, "failed": view.failed}


def _key(obj: Mapping[str, Any], cluster: str) -> str:
    meta = obj.get("metadata") or {}
    return job_key(meta["namespace"], meta["name"], cluster) if meta.get("namespace") else str(meta["name"])


def _stored_manifests(store: ApplyItems, cluster: str) -> tuple[dict[tuple[str, str], Obj], set[str]]:
    """Each top-level job's of `cluster` and (for the stack's own cluster) each rule's and warm snapshot's
    stored manifest, by (kind, key); and the warm snapshots being deleted."""
    found: dict[tuple[str, str], Obj] = {}
    deleting: set[str] = set()
    for record in store.list_jobs():
        if not record.owner and record.state is not JobState.DELETING and record.cluster == cluster:
            found[(record.api_kind, record.key)] = record.manifest
    for cron in store.list_cron_jobs():
        if cron.key.cluster == cluster:
            found[("AdvancedCronJob", cron.key)] = cron.manifest
    if cluster == DEFAULT_CLUSTER:
        for rule in store.list_rules():
            found[("PrewarmRule", str(rule.get("metadata", {}).get("name", "")))] = rule
        for manifest, state, _version in store.list_warm_snapshots():
            name = str(manifest.get("metadata", {}).get("name", ""))
            if SnapshotState.from_dict(state).deleted_at is not None:
                manifest = _being_deleted(manifest)
                deleting.add(name)
            found[("WarmSnapshot", name)] = manifest
    return found, deleting


def _delete_gone(store: ApplyItems, listed: Mapping[str, Sequence[Obj]], stored: Mapping[tuple[str, str], Obj],
                 deleting: set[str], report: SyncReport, *, now: float, cluster: str) -> None:
    present = {(kind, _key(obj, cluster)) for kind, objs in listed.items() for obj in objs}
    for (kind, key), manifest in stored.items():
        if kind not in listed or (kind, key) in present:
            continue
        # A resource's record goes with it; a CLI-applied warm snapshot `prewarm delete` began deleting is
        # carried on here too (only this function may delete its record once its FSR is off).
        if source_of(manifest) is not Source.RESOURCE and not (kind == "WarmSnapshot" and key in deleting):
            continue
        if kind == "PrewarmRule":
            store.delete_rule(key)
        elif kind == "WarmSnapshot":
            if not delete_warm_snapshot(store, key, now):
                continue  # its FSR is being disabled first: the next sync looks again
        elif kind == "AdvancedCronJob":
            assert isinstance(key, JobKey), key
            orphaned = orphaned_runs(key.namespace, key.name, listed.get("ImageListPullJob", ()))
            delete_cron_job(store, key, now=now, by=Source.RESOURCE, orphaned=orphaned)
        else:
            assert isinstance(key, JobKey), key  # a job's: its stored record's key
            request_deletion(store, key.namespace, key.name, now=now, by=Source.RESOURCE, cluster=key.cluster)
        report.deleted.append(f"{kind} {key}")


def _being_deleted(manifest: Obj) -> Obj:
    """A WarmSnapshot record being deleted, as no resource's generation: one of that name created again is
    applied (`_apply`), which takes the deletion back; while none is, each sync carries the deletion on."""
    meta = manifest.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != GENERATION_ANNOTATION}
    return {**manifest, "metadata": {**meta, "annotations": annotations}}


def _write_status(api: ResourceApi, kind: str, obj: Obj, status: Obj, report: SyncReport) -> None:
    meta = obj["metadata"]
    body = {**obj, "status": status}  # its resourceVersion: a resource changed meanwhile is not overwritten
    try:
        api.replace_status(RESOURCE_API_VERSION, RESOURCE_KINDS[kind], meta["name"], body, meta.get("namespace"))
    except (ClusterConflictError, ClusterNotFoundError):
        report.status_conflicts += 1  # changed or deleted meanwhile: the next sync sees the new one
        return
    report.statuses_written += 1
