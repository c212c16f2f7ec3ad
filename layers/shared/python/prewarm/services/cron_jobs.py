"""AdvancedCronJobs: their schedules kept in step with their items, a run when one is due, their deletion and
status.

Applying one stores its item (`services.jobs.apply_cron_job`). The table stream hands the item to
`sync_schedules`, which puts its EventBridge Scheduler schedules (cron expression and time zone, disabled
while paused) or deletes them with the item: no function scans for due jobs. Scheduler invokes the run
function at each time with the time it was due; `run_due` then applies Kruise's controller rules
(`prewarm.domain.cronjobs`) and creates the run, an ImageListPullJob like any other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.cronjobs import (
    CRON_JOB_ANNOTATION,
    CRON_JOB_UID_ANNOTATION,
    SCHEDULED_AT_ANNOTATION,
    CronRun,
    ScheduleState,
    StoredCronJob,
    cron_job_owning,
    cron_status,
    expired_runs,
    plan_run,
    run_outcome,
    schedule_drift,
)
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.keys import JobKey
from prewarm.domain.kubernetes import parse_time
from prewarm.domain.sources import RESOURCE_API_VERSION, RESOURCE_KINDS, Source, resource_manifest, source_of
from prewarm.domain.warm_budgets import WarmBudgetExceededError
from prewarm.services.jobs import (
    Applied,
    JobNotFoundError,
    JobView,
    apply_job,
    apply_manifest,
    check_source,
    list_job_status,
    not_found,
    request_deletion,
    view_record,
)
from prewarm.services.ports import (
    ApplyItems,
    ClusterConflictError,
    CronSchedules,
    CronScheduleStates,
    ImageSizes,
    RunObjects,
    SchedulesError,
)

log = logging.getLogger(__name__)

CRON_PLURAL, RUN_PLURAL = RESOURCE_KINDS["AdvancedCronJob"], RESOURCE_KINDS["ImageListPullJob"]

__all__ = ["CronJobDescription", "RunOutcome", "cron_job_status", "cron_job_statuses", "cron_runs",
           "delete_cron_job", "describe_cron_job", "run_due", "sync_schedules"]


def sync_schedules(schedules: CronSchedules, new: StoredCronJob | None, old: StoredCronJob | None) -> str:
    """The schedules of a cron job item that changed (`new`) or went (`old` only); what was done."""
    if new is None:
        if old is None:
            return "nothing"
        schedules.delete_schedules(old.key)
        return "deleted"
    spec = new.job.spec
    schedules.put_schedules(new.key, spec.cron.scheduler_expressions(), zone=spec.zone, enabled=not spec.paused)
    return "paused" if spec.paused else "scheduled"


def _annotations(record: StoredJob) -> dict[str, str]:
    return (record.manifest.get("metadata") or {}).get("annotations") or {}


def _cron_job_of(record: StoredJob) -> tuple[JobKey, str] | None:
    """The cron job whose run `record` is (a top-level list job it annotated, not being deleted), with the uid
    of that cron job's item the run names ("" in a run made before runs named it); None for any other job."""
    annotations = _annotations(record)
    name = annotations.get(CRON_JOB_ANNOTATION)
    if name is None or not record.is_list_job or record.owner or record.state is JobState.DELETING:
        return None
    return JobKey(record.namespace, name, record.cluster), annotations.get(CRON_JOB_UID_ANNOTATION, "")


def _is_run_of(record: StoredJob, cron: StoredCronJob) -> bool:
    """Whether `record` is a run of `cron`: of its name, and not of an earlier cron job of that name (deleted
    with its runs orphaned, then applied again), as Kruise's controller tells its runs by owner uid."""
    found = _cron_job_of(record)
    return found is not None and found[0] == cron.key and (not found[1] or not cron.uid or found[1] == cron.uid)


def _run(view: JobView) -> CronRun:
    record, status = view.record, list_job_status(view)
    return CronRun(record.name, parse_time(_annotations(record).get(SCHEDULED_AT_ANNOTATION)),
                   start_time=record.start_time,
                   succeeded=run_outcome(status.completion_time, status.succeeded, status.desired))


def _runs_in(views: Iterable[JobView], cron: StoredCronJob) -> list[CronRun]:
    return sorted((_run(view) for view in views if _is_run_of(view.record, cron)), key=lambda run: run.name)


def _run_views(store: ApplyItems, records: Iterable[StoredJob], crons: Iterable[StoredCronJob], *, now: float
               ) -> list[JobView]:
    """The views of the runs of `crons` among `records` (only they are read beyond the job items)."""
    wanted = list(crons)
    return [view_record(store, record, now=now) for record in records
            if any(_is_run_of(record, cron) for cron in wanted)]


def _runs_of(store: ApplyItems, cron: StoredCronJob, *, now: float) -> list[CronRun]:
    return _runs_in(_run_views(store, store.list_jobs(), [cron], now=now), cron)


def cron_runs(store: ApplyItems, key: JobKey, *, now: float) -> list[CronRun]:
    """The runs of cron job `key`: its ImageListPullJobs not being deleted, as the rules read them (only
    they are read beyond the job items); none when there is no such cron job."""
    cron = store.get_cron_job(key)
    return [] if cron is None else _runs_of(store, cron, now=now)


@dataclass
class RunOutcome:
    """What one due time of a cron job did: the run created (or "" and why not), runs replaced and expired."""

    cron_job: str
    run: str = ""
    skipped: str = ""
    replaced: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


def run_due(store: ApplyItems, key: JobKey, *, scheduled_at: float, now: float,
            objects: Callable[[], RunObjects] | None = None, sizes: ImageSizes | None = None) -> RunOutcome:
    """The run of cron job `key` due at `scheduled_at`, as Kruise's controller decides it; then the finished
    runs beyond the history limits are deleted. The run's name is the due time's, so a time delivered twice
    creates one run.

    A cron job applied as a resource has its runs as objects in its cluster, as Kruise's controller makes
    them: `objects()` (built only then) is that cluster's API. Each run is an ImageListPullJob object the
    cron job's object controls (so `kubectl get imagelistpulljobs` lists it and the garbage collector deletes
    it with the cron job), applied to the table as that resource's job (the sync then finds it unchanged and
    writes its status); replaced and expired runs' objects are deleted with their jobs. A run its namespace's
    warm budget refuses (`sizes` reads its images' sizes) is skipped with the refusal as the reason."""
    outcome = RunOutcome(str(key))
    stored = store.get_cron_job(key)
    if stored is None:
        outcome.skipped = "the cron job is gone"
        return outcome
    job = stored.job
    api, owner = None, None
    if source_of(stored.manifest) is Source.RESOURCE:
        if objects is None:
            outcome.skipped = "a cron job resource's runs are objects in its cluster: no cluster API was given"
            return outcome
        api = objects()
        owner = api.get_object(RESOURCE_API_VERSION, CRON_PLURAL, key.name, key.namespace)
        if owner is None:  # the sync deletes the item next
            outcome.skipped = "the cron job's resource is gone"
            return outcome
    runs = _runs_of(store, stored, now=now)
    plan = plan_run(job.spec, scheduled_at=scheduled_at, now=now, runs=runs)
    if plan.create:
        for name in plan.replace:
            _delete_run(store, key.sibling(name), now=now, api=api)
        outcome.replaced = list(plan.replace)
        try:
            if api is None or owner is None:
                applied = apply_job(store, job.run(scheduled_at, stored.uid), now=now, cluster=key.cluster, sizes=sizes)
            else:
                applied = _run_object(store, api, job.run_object(scheduled_at, owner["metadata"]["uid"], stored.uid),
                                      now=now,
                                      cluster=key.cluster, sizes=sizes)
        except WarmBudgetExceededError as e:
            outcome.skipped = str(e)
            log.warning("cron job %s due at %s: run %s", key, scheduled_at, e)
            return outcome
        outcome.run = applied.name
        # The replaced runs were active and a new run is: the finished runs are still those read. Only a run
        # of this time given a new spec (`configured`) may have started again: then they are read anew.
        if applied.outcome == "configured":
            runs = _runs_of(store, stored, now=now)
    else:
        outcome.skipped = plan.reason
    for name in expired_runs(job.spec, runs):
        _delete_run(store, key.sibling(name), now=now, api=api)
        outcome.expired.append(name)
    log.info("cron job %s due at %s: %s", key, scheduled_at, outcome)
    return outcome


def _run_object(store: ApplyItems, api: RunObjects, obj: dict[str, Any], *, now: float, cluster: str,
                sizes: ImageSizes | None = None) -> Applied:
    """Creates a run's object (found when an earlier delivery of its time made it) and applies it as the
    resource sync would."""
    meta = obj["metadata"]
    try:
        created = api.create_object(RESOURCE_API_VERSION, RUN_PLURAL, obj, meta["namespace"])
    except ClusterConflictError:
        found = api.get_object(RESOURCE_API_VERSION, RUN_PLURAL, meta["name"], meta["namespace"])
        owner = obj["metadata"]["ownerReferences"][0]["name"]
        if found is None or cron_job_owning(found) != owner:
            raise  # another's object of that name (or gone meanwhile): Scheduler's retry tries again
        created = found
    return apply_manifest(store, resource_manifest(created), now=now, from_resource=True, secrets=api,
                          cluster=cluster, sizes=sizes)


def _delete_run(store: ApplyItems, run: JobKey, *, now: float, api: RunObjects | None = None) -> None:
    """Deletes a run (its object too, given its cluster's `api`). By the cron job's authority, whatever
    made the run's job: a run of a resource is that resource's, and its cron job may delete it."""
    if api is not None:
        api.delete_object(RESOURCE_API_VERSION, RUN_PLURAL, run.name, run.namespace)
    with contextlib.suppress(JobNotFoundError):  # deleted meanwhile: what was asked is done
        request_deletion(store, run.namespace, run.name, now=now, cluster=run.cluster, by=Source.RESOURCE)


def delete_cron_job(store: ApplyItems, key: JobKey, *, now: float, by: Source = Source.CLI,
                    orphaned: Collection[str] = ()) -> list[str]:
    """Deletes cron job `key` and, as Kubernetes' garbage collector does with Kruise's, its runs but the
    `orphaned` ones (a resource deleted with `--cascade=orphan`: their objects outlived it, and keep running
    as jobs of their own); the stream then deletes its schedules. Returns the runs marked for deletion;
    `JobNotFoundError` when there is none."""
    stored = store.get_cron_job(key)
    if stored is None:
        raise not_found(key.namespace, key.name, key.cluster, kind="advancedcronjob")
    check_source("AdvancedCronJob", key.namespace, key.name, owner=source_of(stored.manifest), by=by)
    runs = sorted(record.name for record in store.list_jobs()
                  if _is_run_of(record, stored) and record.name not in orphaned)
    store.delete_cron_job(key)
    for name in runs:
        _delete_run(store, key.sibling(name), now=now)
    return runs


def cron_job_status(store: ApplyItems, stored: StoredCronJob, *, now: float,
                    views: Sequence[JobView] | None = None) -> dict[str, object]:
    """Kruise's status of a cron job: `type`, `active` runs and `lastScheduleTime`. `views`: the job views
    read already (the resource sync's), among which its runs are; else its runs are read."""
    runs = _runs_of(store, stored, now=now) if views is None else _runs_in(views, stored)
    return cron_status(runs, stored.key.namespace, stored.job.api_version)


def cron_job_statuses(store: ApplyItems, crons: Sequence[StoredCronJob], *, now: float) -> list[dict[str, object]]:
    """The status of each of `crons`, their runs read with one read of the job items."""
    views = _run_views(store, store.list_jobs(), crons, now=now)
    return [cron_job_status(store, cron, now=now, views=views) for cron in crons]


@dataclass
class CronJobDescription:
    """A cron job in full (`prewarm describe cronjob`): its item, Kruise's status, its runs (active and kept),
    when the next is due, and its schedules on AWS with how they differ from the spec (or why they could not
    be read)."""

    stored: StoredCronJob
    status: dict[str, object]
    runs: list[CronRun]
    next_run: float | None
    schedules: list[ScheduleState] = field(default_factory=list)
    drift: str = ""
    schedules_error: str = ""


def describe_cron_job(store: ApplyItems, schedules: CronScheduleStates | None, key: JobKey, *, now: float
                      ) -> CronJobDescription:
    """Cron job `key` in full; `schedules` None (or failing) leaves the AWS part unread, saying why.
    `JobNotFoundError` when there is none."""
    stored = store.get_cron_job(key)
    if stored is None:
        raise not_found(key.namespace, key.name, key.cluster, kind="advancedcronjob")
    spec = stored.job.spec
    runs = _runs_of(store, stored, now=now)
    described = CronJobDescription(stored, cron_status(runs, key.namespace, stored.job.api_version), runs,
                                   spec.next_run(now))
    if schedules is None:
        described.schedules_error = "not read: the stack names no cron schedule prefix (output CronSchedulePrefix)"
        return described
    try:
        described.schedules = schedules.get_schedules(key)
    except SchedulesError as e:  # refused, throttled, unreachable: shown, not fatal
        described.schedules_error = f"not read: {e}"
        return described
    described.drift = schedule_drift(spec, described.schedules)
    return described
