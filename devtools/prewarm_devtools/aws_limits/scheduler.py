"""EventBridge Scheduler's refusals in front of moto, which stores any schedule: a name of 1 to 64 of
`[0-9a-zA-Z-_.]`, an expression of at most 256 characters that is `rate(...)`, `cron(...)` of six fields with
`?` in one day field and in each field only the wildcards it takes, or `at(...)`, and a known time zone
(CreateSchedule API reference, "Request parameters"; "Schedule types on EventBridge Scheduler"). Who may call
is `authorization`'s to decide."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from moto.core.exceptions import JsonRESTError

ACTIONS = ("create_schedule", "update_schedule")
_NAME = re.compile(r"[0-9a-zA-Z\-_.]{1,64}")
_RATE = re.compile(r"rate\([1-9][0-9]* (?:minute|minutes|hour|hours|day|days)\)")
_AT = re.compile(r"at\(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\)")
_CRON = re.compile(r"cron\((\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\)")
EXPRESSION_MAX = 256
# What each cron field takes besides numbers and its names: the cron expressions table of "Schedule types on
# EventBridge Scheduler". Day-of-week takes no `/`, so `cron(0 9 ? * 2/2 *)` is refused.
_CRON_FIELDS = (("minutes", ",-*/", ""), ("hours", ",-*/", ""), ("day-of-month", ",-*?/LW", ""),
                ("month", ",-*/", "JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC"),
                ("day-of-week", ",-*?L#", "SUN|MON|TUE|WED|THU|FRI|SAT"), ("year", ",-*/", ""))


def expression_problem(expression: str) -> str | None:
    """Why Scheduler refuses `expression`, or None."""
    if len(expression) > EXPRESSION_MAX:
        return f"ScheduleExpression is longer than {EXPRESSION_MAX} characters"
    if _RATE.fullmatch(expression) or _AT.fullmatch(expression):
        return None
    cron = _CRON.fullmatch(expression)
    if cron is None:
        return f"Invalid Schedule Expression {expression}."
    if (cron.group(3) == "?") == (cron.group(5) == "?"):
        return f"Invalid Schedule Expression {expression}: one of day-of-month and day-of-week must be ?"
    for (field, wildcards, names), text in zip(_CRON_FIELDS, cron.groups(), strict=True):
        rest = re.sub(f"[0-9]|{names}" if names else "[0-9]", "", text.upper())
        if refused := "".join(sorted(set(rest) - set(wildcards))):
            return f"Invalid Schedule Expression {expression}: {field} does not take {refused}"
    return None


def schedule_name(handler: Any) -> str:
    return unquote(handler.uri.split("?")[0].rstrip("/").split("/")[-1])


class SchedulerLimits:
    def guard(self, action: str, handler: Any, run: Callable[[], Any]) -> Any:
        name = schedule_name(handler)
        if not _NAME.fullmatch(name):
            raise JsonRESTError("ValidationException", f"Name {name!r} must be 1 to 64 of [0-9a-zA-Z-_.]")
        if problem := expression_problem(str(handler._get_param("ScheduleExpression") or "")):
            raise JsonRESTError("ValidationException", problem)
        zone = handler._get_param("ScheduleExpressionTimezone")
        if zone:
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError):
                raise JsonRESTError("ValidationException", f"Invalid ScheduleExpressionTimezone {zone}") from None
        return run()
