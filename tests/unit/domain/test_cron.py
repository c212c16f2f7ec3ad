"""Cron schedules as robfig/cron's ParseStandard (Kruise's parser) reads them, their fire times, and the
EventBridge Scheduler expressions that run them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from prewarm.domain.cron import CronSchedule, CronScheduleError, time_zone_problem


def at(text: str, zone: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def iso(epoch: float | None, zone: str = "UTC") -> str:
    assert epoch is not None
    return datetime.fromtimestamp(epoch, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %a")


# Scheduler's cron table ("Schedule types on EventBridge Scheduler"): each field's values and the wildcards it
# takes (L, W and # left out: never written). Read independently of the code under test.
SCHEDULER_FIELDS = ((0, 59, ",-*/"), (0, 23, ",-*/"), (1, 31, ",-*?/"), (1, 12, ",-*/"), (1, 7, ",-*?"))


def scheduler_values(text: str, low: int, high: int, wildcards: str) -> set[int]:
    assert not set(re.sub("[0-9]", "", text)) - set(wildcards), f"{text!r}: the field takes only {wildcards}"
    values: set[int] = set()
    for term in text.split(","):
        span, slash, step = term.partition("/")
        first, dash, last = span.partition("-")
        start = low if first in ("*", "?") else int(first)
        end = int(last) if dash else high if slash or first in ("*", "?") else start
        values.update(range(start, end + 1, int(step) if slash else 1))
    assert values and values <= set(range(low, high + 1)), f"{text!r} is outside {low}-{high}"
    return values


def scheduler_fires(expressions: list[str], start: datetime, days: int) -> list[datetime]:
    """When Scheduler fires these UTC expressions together in `days` days from `start`, as its table reads."""
    fires: set[datetime] = set()
    for expression in expressions:
        fields = re.fullmatch(r"cron\((\S+) (\S+) (\S+) (\S+) (\S+) \*\)", expression)
        assert fields is not None, expression
        assert (fields[3] == "?") != (fields[5] == "?"), f"{expression}: one day field must be ?"
        minutes, hours, days_of_month, months, weekdays = (
            scheduler_values(text, *field) for text, field in zip(fields.groups(), SCHEDULER_FIELDS, strict=True))
        for n in range(days):
            day = start + timedelta(days=n)
            if day.day in days_of_month and day.month in months and day.isoweekday() % 7 + 1 in weekdays:
                fires.update(day.replace(hour=hour, minute=minute) for hour in hours for minute in minutes)
    return sorted(fires)


def kubernetes_fires(schedule: CronSchedule, start: datetime, days: int) -> list[datetime]:
    fires: list[datetime] = []
    after, end = start.timestamp() - 1, (start + timedelta(days=days)).timestamp()
    while (following := schedule.next_after(after)) is not None and following < end:
        fires.append(datetime.fromtimestamp(following, UTC))
        after = following
    return fires


@pytest.mark.parametrize(("schedule", "expressions"), [
    ("* * * * *", ["cron(* * * * ? *)"]),
    ("*/5 * * * *", ["cron(0/5 * * * ? *)"]),
    ("*/15 9-17 * * MON-FRI", ["cron(0/15 9-17 ? * 2-6 *)"]),
    ("0 2 * * *", ["cron(0 2 * * ? *)"]),
    ("30 1 1,15 * *", ["cron(30 1 1,15 * ? *)"]),
    ("0 0 * JAN,jul sun", ["cron(0 0 ? 1/6 1 *)"]),  # January and July: from 1, every 6th month
    ("0 0 ? * 0", ["cron(0 0 ? * 1 *)"]),
    ("5-20/5 * * * *", ["cron(5,10,15,20 * * * ? *)"]),
    # robfig: both day fields restricted match either, so one schedule each
    ("0 0 1 * MON", ["cron(0 0 1 * ? *)", "cron(0 0 ? * 2 *)"]),
    ("@daily", ["cron(0 0 * * ? *)"]),
    ("@hourly", ["cron(0 * * * ? *)"]),
    ("@weekly", ["cron(0 0 ? * 1 *)"]),
    ("@yearly", ["cron(0 0 1 1 ? *)"]),
    ("@every 5m", ["rate(5 minutes)"]),
    ("@every 1h", ["rate(60 minutes)"]),
    ("@every 1m0s", ["rate(1 minute)"]),
    ("TZ=Asia/Shanghai 30 2 * * *", ["cron(30 2 * * ? *)"]),
])
def test_kruise_schedules_become_scheduler_expressions(schedule: str, expressions: list[str]) -> None:
    assert CronSchedule.parse(schedule).scheduler_expressions() == expressions
    if expressions[0].startswith("cron("):  # and each field within Scheduler's table
        scheduler_fires(expressions, datetime(2026, 11, 28, tzinfo=UTC), 1)


@pytest.mark.parametrize(("schedule", "expressions"), [
    ("0 9 * * MON,WED,FRI", ["cron(0 9 ? * 2,4,6 *)"]),
    ("0 0 * * */2", ["cron(0 0 ? * 1,3,5,7 *)"]),
    ("0 0 * * 1-5", ["cron(0 0 ? * 2-6 *)"]),
    ("0 0 * * SUN,SAT", ["cron(0 0 ? * 1,7 *)"]),
    ("30 6 * * 2/3", ["cron(30 6 ? * 3,6 *)"]),  # Tuesday and Friday
    ("0 12 1 * */2", ["cron(0 12 1 * ? *)", "cron(0 12 ? * 1,3,5,7 *)"]),
    ("0 0 */2 * *", ["cron(0 0 1/2 * ? *)"]),  # day-of-month takes a step
    ("0 0 * JAN,jul sun", ["cron(0 0 ? 1/6 1 *)"]),
])
def test_scheduler_expressions_take_only_each_fields_wildcards_and_fire_as_kubernetes_does(
        schedule: str, expressions: list[str]) -> None:
    parsed = CronSchedule.parse(schedule)
    assert parsed.scheduler_expressions() == expressions
    start = datetime(2026, 11, 28, tzinfo=UTC)
    assert scheduler_fires(expressions, start, 400) == kubernetes_fires(parsed, start, 400)


def test_every_set_of_weekdays_fires_on_those_days_with_no_step_in_day_of_week() -> None:
    start = datetime(2026, 11, 28, tzinfo=UTC)
    for mask in range(1, 128):
        schedule = CronSchedule.parse("0 0 * * " + ",".join(str(day) for day in range(7) if mask >> day & 1))
        expressions = schedule.scheduler_expressions()
        assert scheduler_fires(expressions, start, 14) == kubernetes_fires(schedule, start, 14), expressions


@pytest.mark.parametrize(("schedule", "message"), [
    ("", "empty spec string"),
    ("* * * *", "expected exactly 5 fields, found 4"),
    ("* * * * * *", "expected exactly 5 fields, found 6"),
    ("60 * * * *", 'minute: "60" is outside 0-59'),
    ("* 24 * * *", 'hour: "24" is outside 0-23'),
    ("* * 0 * *", 'day of month: "0" is outside 1-31'),
    ("* * * 13 *", 'month: "13" is outside 1-12'),
    ("* * * * 7", 'day of week: "7" is outside 0-6'),
    ("* * * * FUN", 'day of week: "FUN" is not a number or one of SUN'),
    ("10-5 * * * *", 'minute: "10-5" starts after it ends'),
    ("*/0 * * * *", 'minute: step "0" must be a positive number'),
    ("@fortnightly", 'unrecognized descriptor: "@fortnightly"'),
    ("@every soon", '@every: "soon" is not a duration'),
    ("TZ=Mars/Olympus * * * * *", "provided bad location Mars/Olympus"),
])
def test_what_robfig_refuses_is_refused_naming_the_part(schedule: str, message: str) -> None:
    with pytest.raises(CronScheduleError) as refused:
        CronSchedule.parse(schedule)
    assert message in str(refused.value)


def test_what_scheduler_cannot_run_is_refused_with_its_reason() -> None:
    with pytest.raises(CronScheduleError, match="whole minutes only"):
        CronSchedule.parse("@every 30s").scheduler_expressions()
    with pytest.raises(CronScheduleError, match="whole minutes only"):
        CronSchedule.parse("@every 90s").scheduler_expressions()
    # Lists no range or step can say, longer together than Scheduler's 256 characters
    minutes = ",".join(str(m) for m in range(60) if m not in (7, 31))
    days = ",".join(str(d) for d in range(1, 32) if d not in (2, 30))
    with pytest.raises(CronScheduleError, match="longer than EventBridge Scheduler's 256 characters"):
        CronSchedule.parse(f"{minutes} * {days} * *").scheduler_expressions()

def test_next_fire_times_follow_the_fields() -> None:
    weekdays = CronSchedule.parse("*/15 9-17 * * MON-FRI")
    assert iso(weekdays.next_after(at("2026-11-27 17:50"))) == "2026-11-30 09:00 Mon"  # Friday evening → Monday
    assert iso(weekdays.next_after(at("2026-11-30 09:00"))) == "2026-11-30 09:15 Mon"  # strictly after
    every_minute = CronSchedule.parse("* * * * *")
    assert every_minute.next_after(at("2026-11-28 23:00") + 59.9) == at("2026-11-28 23:01")
    leap = CronSchedule.parse("0 0 29 2 *")
    assert iso(leap.next_after(at("2026-03-01 00:00"))) == "2028-02-29 00:00 Tue"
    either = CronSchedule.parse("0 0 1 * MON")  # the 1st, and every Monday
    assert iso(either.next_after(at("2026-11-28 00:00"))) == "2026-11-30 00:00 Mon"
    assert iso(either.next_after(at("2026-11-30 00:00"))) == "2026-12-01 00:00 Tue"
    both = CronSchedule.parse("0 0 */2 * MON")  # a step clears the star: either, again
    assert iso(both.next_after(at("2026-11-30 00:00"))) == "2026-12-01 00:00 Tue"
    assert CronSchedule.parse("@every 5m").next_after(100.0) == 400.0


def test_fire_times_are_wall_times_of_the_time_zone() -> None:
    daily = CronSchedule.parse("30 2 * * *")
    assert daily.next_after(at("2026-11-28 00:00", "UTC"), "Asia/Shanghai") == at("2026-11-29 02:30", "Asia/Shanghai")
    prefixed = CronSchedule.parse("TZ=Asia/Shanghai 30 2 * * *")
    assert prefixed.next_after(at("2026-11-28 00:00")) == at("2026-11-29 02:30", "Asia/Shanghai")
    # 02:30 does not exist on the day clocks spring forward in New York: that day has no run
    skipped = daily.next_after(at("2027-03-14 00:00", "America/New_York"), "America/New_York")
    assert iso(skipped, "America/New_York") == "2027-03-15 02:30 Mon"


def test_the_due_run_is_the_latest_time_not_after_now() -> None:
    hourly = CronSchedule.parse("0 * * * *")
    assert hourly.latest_at_or_before(at("2026-11-28 10:59"), since=at("2026-11-28 07:30")) == at("2026-11-28 10:00")
    assert hourly.latest_at_or_before(at("2026-11-28 10:00"), since=at("2026-11-28 09:59")) == at("2026-11-28 10:00")
    assert hourly.latest_at_or_before(at("2026-11-28 10:30"), since=at("2026-11-28 10:00")) is None


@pytest.mark.parametrize(("zone", "problem"), [
    ("", "must be nil or a non-empty string"),
    ("Local", "must be an explicit time zone"),
    ("local", "must be an explicit time zone"),
    ("Europe/Nowhere", 'unknown time zone "Europe/Nowhere"'),
    ("../etc/passwd", 'unknown time zone "../etc/passwd"'),
])
def test_time_zones_kruise_refuses(zone: str, problem: str) -> None:
    assert problem in (time_zone_problem(zone) or "")


def test_iana_time_zones_are_accepted() -> None:
    assert time_zone_problem("Asia/Shanghai") is None
    assert time_zone_problem("UTC") is None
