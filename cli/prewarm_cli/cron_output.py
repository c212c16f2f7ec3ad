"""`prewarm describe cronjob`: an AdvancedCronJob's spec, when it runs next, its runs, and its schedules on AWS."""

from __future__ import annotations

from prewarm.domain.sources import source_of
from prewarm.services.cron_jobs import CronJobDescription
from prewarm_cli.output import NONE, _fields, human_age, rfc3339, table


def _at(epoch: float | None, now: float) -> str:
    if epoch is None:
        return NONE
    delta = epoch - now
    return f"{rfc3339(epoch)} ({human_age(-delta)} ago)" if delta <= 0 else f"{rfc3339(epoch)} (in {human_age(delta)})"


def describe_cron_job(described: CronJobDescription, *, now: float) -> str:
    """The cron job as `kubectl describe` would show it, with Prewarm's runs and EventBridge Scheduler's view."""
    stored, status = described.stored, described.status
    job, key = stored.job, stored.key
    spec = job.spec
    zone = spec.zone if spec.zone_given else f"{spec.zone} (spec.timeZone not set)"
    if spec.paused:
        following = "<none> (paused)"
    else:
        following = _at(described.next_run, now)
        if spec.cron.every_seconds is not None:
            following += ", counted from now: Scheduler counts a rate from when its schedule was put"
    deadline = NONE if spec.starting_deadline_seconds is None else f"{spec.starting_deadline_seconds}s"
    active = [str(ref["name"]) for ref in status.get("active", [])]  # type: ignore[attr-defined]
    lines = _fields([
        ("Name", key.name), ("Namespace", key.namespace), *([("Cluster", key.cluster)] if key.cluster else []),
        ("API Version", job.api_version), ("Source", str(source_of(stored.manifest))),
        ("Schedule", spec.schedule), ("Time Zone", zone), ("Concurrency Policy", spec.concurrency_policy),
        ("Paused", str(spec.paused).lower()), ("Starting Deadline", deadline),
        ("History Limits", f"successful {spec.successful_jobs_history_limit}, failed "
                           f"{spec.failed_jobs_history_limit}"),
        ("Images", ", ".join(job.template.spec.images)),
        ("Last Schedule Time", _at(_last(status), now)),
        ("Next Run Time", following),
        ("Active Runs", ", ".join(active) or NONE),
    ])
    finished = [r for r in described.runs if not r.is_active]
    lines.append("History:" + ("" if finished else f"  {NONE}"))
    if finished:
        lines.append(table(["RUN", "SCHEDULED", "OUTCOME"],
                           [[r.name, rfc3339(r.scheduled_at) or NONE, "Succeeded" if r.succeeded else "Failed"]
                            for r in finished], indent="  "))
    lines.append("Schedules on AWS (EventBridge Scheduler):")
    if described.schedules_error:
        lines.append(f"  {described.schedules_error}")
    elif described.schedules:
        lines.append(table(["NAME", "EXPRESSION", "TIMEZONE", "STATE"],
                           [[s.name, s.expression, s.zone, "ENABLED" if s.enabled else "DISABLED"]
                            for s in described.schedules], indent="  "))
    if described.drift:
        lines.append(f"  Differs from the spec: {described.drift}")
    return "\n".join(lines)


def _last(status: dict[str, object]) -> float | None:
    from prewarm.domain.kubernetes import parse_time

    value = status.get("lastScheduleTime")
    return parse_time(value) if isinstance(value, str) else None
