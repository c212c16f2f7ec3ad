"""The scheduled runs the stack keeps a record of, so that an operator (`prewarm doctor`) can tell
whether they still happen: one record per schedule, its last completed run, overwritten each time.

>>> ScheduleRun(SWEEP, started_at=100.0, finished_at=101.5).duration
1.5
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SWEEP = "sweep"
DAILY_ROUND = "daily-round"
RECORDED_SCHEDULES = (SWEEP, DAILY_ROUND)

# template.yaml's SweepSchedule and RepullSchedule defaults.
DEFAULT_EXPRESSIONS = {SWEEP: "rate(1 minute)", DAILY_ROUND: "cron(0 3 * * ? *)"}

_RATE = re.compile(r"^rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}
DAY_SECONDS = 86400.0


@dataclass(frozen=True)
class ScheduleRun:
    """A run of `schedule` that completed: when it started and when it finished (epoch seconds)."""

    schedule: str
    started_at: float
    finished_at: float

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at


class ScheduleExpressionError(ValueError):
    """Not an EventBridge Scheduler `rate(...)` or `cron(...)` expression."""


def schedule_period(expression: str) -> float:
    """Seconds between runs of an EventBridge Scheduler expression.

    A `cron(...)` expression counts as daily: the only cron schedule of the stack is the daily round's.

    >>> schedule_period("rate(5 minutes)")
    300.0
    >>> schedule_period("cron(0 3 * * ? *)")
    86400.0
    """
    text = expression.strip()
    if text.startswith("cron(") and text.endswith(")"):
        return DAY_SECONDS
    match = _RATE.match(text)
    if match is None:
        raise ScheduleExpressionError(f"schedule expression {expression!r} is neither rate(...) nor cron(...)")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2).rstrip("s")])
