"""Cron schedules as Kruise's AdvancedCronJob reads them, and as EventBridge Scheduler runs them.

Kruise parses `spec.schedule` with robfig/cron's `ParseStandard`: five fields (minute, hour, day of month,
month, day of week; names such as `MON` and `JAN`; `*`, `?`, ranges, lists and `/` steps), the descriptors
`@yearly` .. `@hourly` and `@every <duration>`, and an optional `TZ=` or `CRON_TZ=` prefix. As in robfig,
when both day fields are restricted a day matches either (`0 0 1 * MON`: the 1st and every Monday).

EventBridge Scheduler takes `cron(min hour day-of-month month day-of-week year)`, where one day field
must be `?`, Sunday is 1 and day-of-week takes no `/` step, or `rate(N minutes)`. So a schedule
restricting both day fields becomes two expressions (one per day field), a day-of-week step becomes a list,
and `@every` must be whole minutes, EventBridge's finest rate.

>>> CronSchedule.parse("*/15 9-17 * * MON-FRI").scheduler_expressions()
['cron(0/15 9-17 ? * 2-6 *)']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["SCHEDULE_PATTERN", "TIME_ZONE_PATTERN", "CronSchedule", "CronScheduleError", "time_zone_problem"]

# Scheduler's ScheduleExpression is at most 256 characters (CreateSchedule API reference).
SCHEDULER_EXPRESSION_MAX = 256


class CronScheduleError(ValueError):
    """A schedule robfig/cron (so Kruise) refuses, or that EventBridge Scheduler cannot run; says which part."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()


_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day of month", 1, 31)
_MONTH = _Field("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))
_DOW = _Field("day of week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
_FIELDS = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)

_DESCRIPTORS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
# Go's time.ParseDuration units, as `@every` takes them.
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Far enough for `0 0 29 2 *` after a skipped leap year (2100): robfig gives up after five years too.
_SEARCH_YEARS = 5


def _field_pattern(value: str) -> str:
    term = f"(?:[*?]|{value}(?:-{value})?)(?:/[1-9][0-9]*)?"
    return f"{term}(?:,{term})*"


def _names(field: _Field) -> str:
    return f"|(?i:{'|'.join(field.names)})" if field.names else ""


# The grammar above as an RE2 pattern, for the CRD's schema (cli/prewarm_cli/install/crds.py): the fields, their
# ranges and names, the descriptors and the TZ prefix. What it cannot say (a range that ends before it starts,
# an unknown zone, an @every that is no whole number of minutes) is refused by the model, in the sync.
_FIELD_VALUES = ("[0-5]?[0-9]", "[01]?[0-9]|2[0-3]", "0?[1-9]|[12][0-9]|3[01]", f"0?[1-9]|1[0-2]{_names(_MONTH)}",
                 f"[0-6]{_names(_DOW)}")
SCHEDULE_PATTERN = (
    r"^\s*(?:(?:CRON_)?TZ=\S+\s+)?(?:@(?:yearly|annually|monthly|weekly|daily|midnight|hourly)|@every\s+\S+|"
    + r"\s+".join(_field_pattern(f"(?:{values})") for values in _FIELD_VALUES) + r")\s*$"
)
# An IANA name's shape; whether the zone exists is the model's check.
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*$"


def time_zone_problem(name: str) -> str | None:
    """Why `name` is not a time zone Kruise's webhook accepts (an IANA name; not `Local`), or None."""
    if not name:
        return "must be nil or a non-empty string"
    if name.lower() == "local":
        return "must be an explicit time zone as defined in https://www.iana.org/time-zones"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f'unknown time zone "{name}"'
    return None


def _number(text: str, field: _Field) -> int:
    upper = text.upper()
    if upper in field.names:
        return field.names.index(upper) + field.low
    if not text.isdigit():
        raise CronScheduleError(f'{field.name}: "{text}" is not a number' + (
            f" or one of {', '.join(field.names)}" if field.names else ""))
    return int(text)


def _parse_field(text: str, field: _Field) -> tuple[frozenset[int], bool]:
    """The values of one field, and whether it is a star (`*` or `?` without a step): robfig's starBit."""
    values: set[int] = set()
    star = False
    for part in text.split(","):
        range_text, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronScheduleError(f'{field.name}: step "{step_text}" must be a positive number')
            step = int(step_text)
        if range_text in ("*", "?"):
            low, high = field.low, field.high
            star = star or step == 1
        else:
            low_text, dash, high_text = range_text.partition("-")
            low = _number(low_text, field)
            high = _number(high_text, field) if dash else (field.high if slash else low)
        if low < field.low or high > field.high:
            raise CronScheduleError(f'{field.name}: "{part}" is outside {field.low}-{field.high}')
        if low > high:
            raise CronScheduleError(f'{field.name}: "{part}" starts after it ends')
        values.update(range(low, high + 1, step))
    return frozenset(values), star


def _every_seconds(text: str) -> float:
    rest, total = text, 0.0
    if not rest:
        raise CronScheduleError("@every needs a duration such as 5m or 1h30m")
    while rest:
        match = _DURATION_PART.match(rest)
        if match is None:
            raise CronScheduleError(f'@every: "{text}" is not a duration such as 5m or 1h30m')
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        rest = rest[match.end():]
    if total < 1:
        # robfig's Every rounds below a second up to one second; EventBridge refuses it anyway below.
        total = 1.0
    return total


@dataclass(frozen=True)
class CronSchedule:
    """A parsed schedule: the allowed values of each field (or `every_seconds` for `@every`), and the time
    zone a `TZ=` prefix named."""

    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset()
    weekdays: frozenset[int] = frozenset()
    days_star: bool = True
    weekdays_star: bool = True
    every_seconds: float | None = None
    time_zone: str | None = None

    @classmethod
    def parse(cls, text: str) -> CronSchedule:
        """Reads a schedule as robfig/cron's ParseStandard does; raises `CronScheduleError` naming the part."""
        spec = text.strip()
        if not spec:
            raise CronScheduleError("empty spec string")
        time_zone = None
        if spec.startswith(("TZ=", "CRON_TZ=")):
            zone_part, _, spec = spec.partition(" ")
            time_zone = zone_part.partition("=")[2]
            if problem := time_zone_problem(time_zone):
                raise CronScheduleError(f"provided bad location {time_zone}: {problem}")
            spec = spec.strip()
        if spec.startswith("@"):
            if spec.startswith("@every "):
                return cls(every_seconds=_every_seconds(spec.removeprefix("@every ").strip()), time_zone=time_zone)
            if spec not in _DESCRIPTORS:
                raise CronScheduleError(f'unrecognized descriptor: "{spec}"')
            spec = _DESCRIPTORS[spec]
        fields = spec.split()
        if len(fields) != len(_FIELDS):
            raise CronScheduleError(f"expected exactly 5 fields, found {len(fields)}: {spec!r}")
        parsed = [_parse_field(part, field) for part, field in zip(fields, _FIELDS, strict=True)]
        return cls(minutes=parsed[0][0], hours=parsed[1][0], days=parsed[2][0], months=parsed[3][0],
                   weekdays=parsed[4][0], days_star=parsed[2][1], weekdays_star=parsed[4][1], time_zone=time_zone)

    def _day_matches(self, day: datetime) -> bool:
        in_days = day.day in self.days
        in_weekdays = (day.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_days and in_weekdays
        return in_days or in_weekdays

    def next_after(self, after: float, zone: str = "UTC") -> float | None:
        """The first time strictly after `after` (epoch seconds) that the schedule fires in `zone` (its own
        `TZ=` zone first), or None within five years. An `@every` schedule fires `every_seconds` apart from
        `after`, as robfig's does from its start."""
        if self.every_seconds is not None:
            return after + self.every_seconds
        tz = ZoneInfo(self.time_zone or zone)
        local = (datetime.fromtimestamp(after, tz).replace(second=0, microsecond=0, tzinfo=None)
                 + timedelta(minutes=1))
        end = local.replace(year=local.year + _SEARCH_YEARS)
        while local < end:
            if local.month not in self.months:
                local = (local.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(local):
                local = local.replace(hour=0, minute=0) + timedelta(days=1)
            elif local.hour not in self.hours:
                local = local.replace(minute=0) + timedelta(hours=1)
            elif local.minute not in self.minutes:
                local += timedelta(minutes=1)
            else:
                fired = local.replace(tzinfo=tz)
                # A wall time a DST change skips does not exist: move on, as the time does.
                if fired.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == local:
                    return fired.timestamp()
                local += timedelta(minutes=1)
        return None

    def latest_at_or_before(self, now: float, since: float, zone: str = "UTC") -> float | None:
        """The last time in (`since`, `now`] that the schedule fires, or None: which run is due now."""
        latest, at = None, since
        while (following := self.next_after(at, zone)) is not None and following <= now:
            latest = at = following
        return latest

    def scheduler_expressions(self) -> list[str]:
        """The EventBridge Scheduler expressions that together fire when this schedule does; raises
        `CronScheduleError` for what Scheduler cannot run (a rate below a minute, a too long expression)."""
        if self.every_seconds is not None:
            minutes, rest = divmod(self.every_seconds, 60)
            if rest or minutes < 1:
                raise CronScheduleError(f"@every {self.every_seconds:g}s: EventBridge Scheduler runs rates of "
                                        "whole minutes only, at least 1 minute")
            return [f"rate({int(minutes)} minute{'s' if minutes > 1 else ''})"]
        minute, hour, month = _scheduler_field(self.minutes, _MINUTE), _scheduler_field(self.hours, _HOUR), \
            _scheduler_field(self.months, _MONTH)
        days = _scheduler_field(self.days, _DOM)
        # Scheduler's day-of-week takes no `/` (its cron table: `, - * ? L #`), so no steps there
        weekdays = _scheduler_field(frozenset(day + 1 for day in self.weekdays), _Field("", 1, 7), steps=False)
        if self.weekdays_star:
            pairs = [(days, "?")]  # robfig ANDs the day fields when one is a star: the other one decides
        elif self.days_star:
            pairs = [("?", weekdays)]
        else:
            pairs = [(days, "?"), ("?", weekdays)]  # either matches: one schedule each
        expressions = [f"cron({minute} {hour} {day_of_month} {month} {day_of_week} *)"
                       for day_of_month, day_of_week in pairs]
        for expression in expressions:
            if len(expression) > SCHEDULER_EXPRESSION_MAX:
                raise CronScheduleError(f"becomes {expression}, longer than EventBridge Scheduler's "
                                        f"{SCHEDULER_EXPRESSION_MAX} characters: use ranges or steps")
        return expressions


def _scheduler_field(values: frozenset[int], field: _Field, steps: bool = True) -> str:
    """A field's values in Scheduler's grammar: `*`, a range, `start/step` to the field's end (if `steps`),
    or a list."""
    ordered = sorted(values)
    if ordered == list(range(field.low, field.high + 1)):
        return "*"
    if len(ordered) == 1:
        return str(ordered[0])
    step = ordered[1] - ordered[0]
    if ordered == list(range(ordered[0], ordered[-1] + 1, step)):
        if step == 1:
            return f"{ordered[0]}-{ordered[-1]}"
        if steps and ordered[-1] + step > field.high:
            return f"{ordered[0]}/{step}"
    return ",".join(str(value) for value in ordered)
