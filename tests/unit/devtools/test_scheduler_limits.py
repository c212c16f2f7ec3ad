"""The local stage's EventBridge Scheduler refusals (`prewarm_devtools.aws_limits.scheduler`): a cron field
with a wildcard the cron expressions table of "Schedule types on EventBridge Scheduler" does not give it is
refused with a ValidationException, before moto stores the schedule."""

from __future__ import annotations

from typing import Any

import pytest
from moto.core.exceptions import JsonRESTError

from prewarm.domain.cron import CronSchedule
from prewarm_devtools.aws_limits.scheduler import SchedulerLimits, expression_problem


class Handler:
    """As much of moto's response handler as the guard reads."""

    def __init__(self, expression: str) -> None:
        self.uri = "/schedules/stack-cron-a-0"
        self.params = {"ScheduleExpression": expression}

    def _get_param(self, name: str) -> Any:
        return self.params.get(name)


@pytest.mark.parametrize(("expression", "refused"), [
    ("cron(0 9 ? * 2/2 *)", "day-of-week does not take /"),
    ("cron(0 0 ? * 1/2 *)", "day-of-week does not take /"),
    ("cron(0 0 ? * MON/2 *)", "day-of-week does not take /"),
    ("cron(0 0 ? * 2W *)", "day-of-week does not take W"),
    ("cron(0 0 1#2 * ? *)", "day-of-month does not take #"),
    ("cron(0 L * * ? *)", "hours does not take L"),
    ("cron(? 0 * * ? *)", "minutes does not take ?"),
    ("cron(0 0 * 1? ? *)", "month does not take ?"),
    ("cron(0 0 * * ? 2027L)", "year does not take L"),
])
def test_a_wildcard_its_field_does_not_take_is_refused(expression: str, refused: str) -> None:
    assert expression_problem(expression) == f"Invalid Schedule Expression {expression}: {refused}"


@pytest.mark.parametrize("expression", [
    "cron(0/15 9-17 ? * 2-6 *)", "cron(0 9 ? * 2,4,6 *)", "cron(0 0 ? * MON-FRI *)", "cron(0 0 1/2 * ? *)",
    "cron(0 0 L * ? *)", "cron(0 0 15W * ? *)", "cron(0 0 ? * 6L *)", "cron(0 0 ? * 3#2 *)",
    "cron(0 0 ? JAN-MAR,jul/2 SUN 2026-2030/2)",
])
def test_the_wildcards_of_the_table_are_taken(expression: str) -> None:
    assert expression_problem(expression) is None


def test_the_guard_answers_a_step_in_day_of_week_with_a_validation_exception() -> None:
    def run() -> None:
        raise AssertionError("moto must not store a schedule Scheduler refuses")

    with pytest.raises(JsonRESTError) as refused:
        SchedulerLimits().guard("create_schedule", Handler("cron(0 9 ? * 2/2 *)"), run)
    assert refused.value.error_type == "ValidationException"
    assert "day-of-week does not take /" in refused.value.message
    assert SchedulerLimits().guard("create_schedule", Handler("cron(0 9 ? * 2,4,6 *)"), lambda: "stored") == "stored"


@pytest.mark.parametrize("schedule", ["0 9 * * MON,WED,FRI", "0 0 * * */2", "0 0 * * 1-5", "0 0 * * SUN,SAT",
                                      "0 12 1 * */2", "*/15 9-17 * JAN,jul */3", "5-20/5 */6 */2 * *"])
def test_what_the_product_writes_for_a_cron_job_is_taken(schedule: str) -> None:
    for expression in CronSchedule.parse(schedule).scheduler_expressions():
        assert expression_problem(expression) is None, expression
