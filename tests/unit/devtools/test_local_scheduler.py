"""The local stack's Scheduler (`sam.scheduler.LocalScheduler`): a slow target does not hold up the next
schedule due (EventBridge Scheduler does not wait for its targets either), and a schedule is read again only
once it changed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from prewarm_devtools.sam.scheduler import LocalScheduler

T0 = 1_800_000_000.0  # a whole minute


class Schedules:
    """moto's Scheduler as the local scheduler reads it: one schedule a minute, counted from `T0`."""

    def __init__(self) -> None:
        self.gets = 0

    def list_schedules(self) -> dict[str, Any]:
        return {"Schedules": [{"Name": "every-minute", "Arn": "arn:schedule/every-minute", "State": "ENABLED",
                               "LastModificationDate": datetime.fromtimestamp(T0, UTC)}]}

    def get_schedule(self, Name: str, GroupName: str) -> dict[str, Any]:
        self.gets += 1
        return {"Name": Name, "Arn": "arn:schedule/every-minute", "ScheduleExpression": "rate(1 minute)",
                "Target": {"Arn": "arn:function", "Input": "{}"}}


def test_a_slow_target_does_not_hold_up_the_next_due_schedule_and_join_waits_for_it() -> None:
    release, invoked = threading.Event(), []
    now = [T0 + 61]

    def invoke(arn: str, event: dict[str, Any]) -> None:
        invoked.append(event)
        release.wait(5)

    client = Schedules()
    scheduler = LocalScheduler(client, invoke, clock=lambda: now[0])
    # The first minute's run still inside its target: the pump returns at once, and the next minute fires
    assert scheduler.pump(wait=False) == 1
    now[0] += 60
    assert scheduler.pump(wait=False) == 1
    assert not scheduler.join(0.1)
    release.set()
    assert scheduler.join(5) and len(invoked) == 2
    # Read once: the schedule did not change between the pumps
    assert client.gets == 1


def test_waiting_pump_returns_once_its_targets_end() -> None:
    done = []
    scheduler = LocalScheduler(Schedules(), lambda arn, event: done.append(arn), clock=lambda: T0 + 61)
    assert scheduler.pump() == 1 and done == ["arn:function"]
