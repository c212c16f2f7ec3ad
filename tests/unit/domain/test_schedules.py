"""How often each recorded schedule runs, from its EventBridge Scheduler expression."""

from __future__ import annotations

import pytest

from prewarm.domain.schedules import DEFAULT_EXPRESSIONS, SWEEP, ScheduleExpressionError, schedule_period


@pytest.mark.parametrize(("expression", "seconds"), [
    ("rate(1 minute)", 60.0), ("rate(5 minutes)", 300.0), ("rate(2 hours)", 7200.0), ("rate(1 day)", 86400.0),
    ("cron(0 3 * * ? *)", 86400.0), (" rate(10 minutes) ", 600.0),
])
def test_rates_give_their_period_and_cron_counts_as_daily(expression: str, seconds: float) -> None:
    assert schedule_period(expression) == seconds


def test_the_sweep_runs_every_minute_by_default() -> None:
    assert schedule_period(DEFAULT_EXPRESSIONS[SWEEP]) == 60.0


@pytest.mark.parametrize("expression", [
    "", "every minute", "rate(1 fortnight)", "rate(-1 minutes)", "at(2025-01-01T00:00:00)",
])
def test_other_expressions_are_refused(expression: str) -> None:
    with pytest.raises(ScheduleExpressionError, match="neither rate"):
        schedule_period(expression)
