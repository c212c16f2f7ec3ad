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
from dataclasses import dataclass, field

from prewarm.domain.cronjobs import (
    CRON_JOB_ANNOTATION,
    SCHEDULED_AT_ANNOTATION,
    CronRun,
    StoredCronJob,
    cron_status,
    expired_runs,
    plan_run,
    run_outcome,
)
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.keys import JobKey
from prewarm.domain.kubernetes import parse_time
from prewarm.domain.sources import Source, source_of
from prewarm.services.jobs import (
    JobNotFoundError,
    apply_job,
    check_source,
    list_job_status,
    request_deletion,
    view_job,
)
from prewarm.services.ports import ApplyItems, CronSchedules

log = logging.getLogger(__name__)

__all__ = ["RunOutcome", "cron_job_status", "cron_runs", "delete_cron_job", "run_due", "sync_schedules"]


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


def _is_run_of(record: StoredJob, key: JobKey) -> bool:
    annotations = (record.manifest.get("metadata") or {}).get("annotations") or {}
    return (record.is_list_job and not record.owner and annotations.get(CRON_JOB_ANNOTATION) == key.name
            and record.namespace == key.namespace and record.cluster == key.cluster
            and record.state is not JobState.DELETING)


def cron_runs(store: ApplyItems, key: JobKey, *, now: float) -> list[CronRun]:
    """The runs of cron job `key`: its ImageListPullJobs not being deleted, as the rules read them (only
    they are read beyond the job items)."""
    runs = []
    for record in store.list_jobs():
        if not _is_run_of(record, key):
            continue
        try:
            view = view_job(store, record.namespace, record.name, now=now, cluster=record.cluster)
        except JobNotFoundError:
            continue  # deleted meanwhile
        status = list_job_status(view)
        annotations = (record.manifest.get("metadata") or {}).get("annotations") or {}
        runs.append(CronRun(record.name, parse_time(annotations.get(SCHEDULED_AT_ANNOTATION)),
                            start_time=record.start_time,
                            succeeded=run_outcome(status.completion_time, status.succeeded, status.desired)))
    return sorted(runs, key=lambda run: run.name)


@dataclass
class RunOutcome:
    """What one due time of a cron job did: the run created (or "" and why not), runs replaced and expired."""

    cron_job: str
    run: str = ""
    skipped: str = ""
    replaced: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


def run_due(store: ApplyItems, key: JobKey, *, scheduled_at: float, now: float) -> RunOutcome:
    """The run of cron job `key` due at `scheduled_at`, as Kruise's controller decides it; then the finished
    runs beyond the history limits are deleted. The run's name is the due time's, so a time delivered twice
    creates one run."""
    outcome = RunOutcome(str(key))
    stored = store.get_cron_job(key)
    if stored is None:
        outcome.skipped = "the cron job is gone"
        return outcome
    job = stored.job
    plan = plan_run(job.spec, scheduled_at=scheduled_at, now=now, runs=cron_runs(store, key, now=now))
    if plan.create:
        for name in plan.replace:
            _delete_run(store, key.sibling(name), now=now)
        outcome.replaced = list(plan.replace)
        applied = apply_job(store, job.run(scheduled_at), now=now, cluster=key.cluster)
        outcome.run = applied.name
    else:
        outcome.skipped = plan.reason
    for name in expired_runs(job.spec, cron_runs(store, key, now=now)):
        _delete_run(store, key.sibling(name), now=now)
        outcome.expired.append(name)
    log.info("cron job %s due at %s: %s", key, scheduled_at, outcome)
    return outcome


def _delete_run(store: ApplyItems, run: JobKey, *, now: float) -> None:
    with contextlib.suppress(JobNotFoundError):  # deleted meanwhile: what was asked is done
        request_deletion(store, run.namespace, run.name, now=now, cluster=run.cluster)


def delete_cron_job(store: ApplyItems, key: JobKey, *, now: float, by: Source = Source.CLI) -> list[str]:
    """Deletes cron job `key` and, as Kubernetes' garbage collector does with Kruise's, its runs; the stream
    then deletes its schedules. Returns the runs marked for deletion; `JobNotFoundError` when there is none."""
    stored = store.get_cron_job(key)
    if stored is None:
        where = f' of cluster "{key.cluster}"' if key.cluster else ""
        raise JobNotFoundError(f'advancedcronjob "{key.name}" not found in namespace "{key.namespace}"{where}')
    check_source("AdvancedCronJob", key.namespace, key.name, owner=source_of(stored.manifest), by=by)
    runs = [run.name for run in cron_runs(store, key, now=now)]
    store.delete_cron_job(key)
    for name in runs:
        _delete_run(store, key.sibling(name), now=now)
    return runs


def cron_job_status(store: ApplyItems, stored: StoredCronJob, *, now: float) -> dict[str, object]:
    """Kruise's status of a cron job: `type`, `active` runs and `lastScheduleTime`."""
    return cron_status(cron_runs(store, stored.key, now=now), stored.key.namespace, stored.job.api_version)
