"""EventBridge Scheduler's deliveries for the schedules functions create at run time (the cron jobs'): moto
stores schedules and never fires them, so the local stack does, as Scheduler would: each ENABLED schedule at
the times its `cron(...)` or `rate(...)` expression gives in its time zone (counted from when it was created or
last changed), its target function invoked with the schedule's Input, context attributes filled in.

Times come from the product's own reading of cron (`prewarm.domain.cron`), the expression turned back into
robfig's grammar: `?` is `*` and Scheduler's days of the week (SUN=1..SAT=7) are robfig's (0..6).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prewarm.domain.cron import CronSchedule, CronScheduleError
from prewarm.domain.kubernetes import format_time

log = logging.getLogger(__name__)

_RATE = re.compile(r"rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)")
_CRON = re.compile(r"cron\((\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\)")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def _robfig_weekdays(field: str) -> str:
    def shift(term: str) -> str:
        values, slash, step = term.partition("/")
        values = re.sub(r"\d+", lambda m: str(int(m.group()) - 1), values)
        return values + slash + step

    return ",".join(shift(term) for term in field.split(","))


def schedule_of(expression: str) -> CronSchedule:
    """A Scheduler expression as a `CronSchedule`; `CronScheduleError` for what the local stack cannot run
    (`at(...)`, a year other than `*`, `L`, `W` or `#`)."""
    text = expression.strip()
    if rate := _RATE.fullmatch(text):
        return CronSchedule(every_seconds=float(int(rate.group(1)) * _UNIT_SECONDS[rate.group(2).rstrip("s")]))
    cron = _CRON.fullmatch(text)
    if cron is None or cron.group(6) != "*" or re.search(r"[LW#]", text):
        raise CronScheduleError(f"the local stack runs rate(...) and cron(...) of any year only, not {expression}")
    minute, hour, days, month, weekdays = (("*" if part == "?" else part) for part in cron.groups()[:5])
    return CronSchedule.parse(f"{minute} {hour} {days} {month} {_robfig_weekdays(weekdays)}")


@dataclass
class _Seen:
    modified: float
    since: float
    schedule: dict[str, Any]  # GetSchedule's answer at `modified`: read again only once it changed


class LocalScheduler:
    """Fires the schedules of moto's Scheduler: `pump()` invokes each one due since the last call through
    `invoke(target_arn, event)`."""

    def __init__(self, client: Any, invoke: Callable[[str, dict[str, Any]], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.invoke, self.clock = client, invoke, clock
        self._seen: dict[str, _Seen] = {}
        self._running: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def pump(self, *, wait: bool = True) -> int:
        """Fires what is due, side by side as Scheduler invokes its targets; returns how many it fired.
        `wait`: return once those invocations end; else at once, as Scheduler does not wait for a target
        either (a slow one must not make the next schedule late: `join` waits for them)."""
        now, fired = self.clock(), []
        listed = self.client.list_schedules().get("Schedules", [])
        self._seen = {s["Arn"]: self._seen[s["Arn"]] for s in listed if s["Arn"] in self._seen}
        for summary in listed:
            if summary.get("State") != "ENABLED":
                self._seen.pop(summary["Arn"], None)
                continue
            modified = summary["LastModificationDate"].timestamp()
            seen = self._seen.get(summary["Arn"])
            if seen is None or seen.modified != modified:
                got = self.client.get_schedule(Name=summary["Name"], GroupName=summary.get("GroupName", "default"))
                seen = self._seen[summary["Arn"]] = _Seen(modified, since=min(modified, now), schedule=got)
            schedule = seen.schedule
            try:
                due = schedule_of(schedule["ScheduleExpression"]).latest_at_or_before(
                    now, since=seen.since, zone=schedule.get("ScheduleExpressionTimezone") or "UTC")
            except CronScheduleError as e:
                log.warning("schedule %s not run locally: %s", summary["Name"], e)
                continue
            if due is None:
                continue
            seen.since = due
            fired.append(threading.Thread(target=self._fire, args=(schedule, due), name=f"fire-{summary['Name']}"))
        with self._lock:
            self._running = {t for t in self._running if t.is_alive()} | set(fired)
        for thread in fired:
            thread.start()
        if wait:
            for thread in fired:
                thread.join()
        return len(fired)

    def join(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the invocations fired without waiting; False if some still run."""
        deadline = time.monotonic() + timeout
        with self._lock:
            running = list(self._running)
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in running)

    def _fire(self, schedule: dict[str, Any], scheduled_at: float) -> None:
        target = schedule["Target"]
        scheduled = format_time(scheduled_at)
        text = target.get("Input") or "{}"
        for attribute, value in (("schedule-arn", schedule["Arn"]), ("scheduled-time", scheduled),
                                 ("execution-id", str(uuid.uuid4())), ("attempt-number", "1")):
            text = text.replace(f"<aws.scheduler.{attribute}>", value)
        try:
            self.invoke(target["Arn"], json.loads(text))
        except Exception:  # Scheduler retries and dead-letters; locally the failure is logged with its traceback
            log.exception("schedule %s: its target failed", schedule["Name"])
