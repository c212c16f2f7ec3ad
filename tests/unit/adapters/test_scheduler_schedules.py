"""The cron jobs' schedules on EventBridge Scheduler (moto in-process): one per expression, updated in
place, the extra one deleted when a spec needs fewer, all deleted with the cron job; Scheduler's errors
named with the schedule."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.scheduler import SchedulerCronSchedules, SchedulerError, schedule_name
from prewarm.domain.cronjobs import ScheduleState
from prewarm.domain.jobs import job_key
from tests.support.aws import serial_mock_aws

TARGET = "arn:aws:lambda:us-east-1:123456789012:function:run-cron-job"
ROLE = "arn:aws:iam::123456789012:role/cron-scheduler"
KEY = job_key("ml", "gpu-batch-images")


@pytest.fixture
def client() -> Iterator[Any]:
    with serial_mock_aws():
        yield boto3.client("scheduler", region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")


def listed(client: Any) -> dict[str, dict[str, Any]]:
    return {s["Name"]: client.get_schedule(Name=s["Name"]) for s in client.list_schedules()["Schedules"]}


def test_schedules_follow_the_cron_jobs_expressions_zone_and_pause(client: Any) -> None:
    schedules = SchedulerCronSchedules("stack-cron", TARGET, ROLE, client=client)
    schedules.put_schedules(KEY, ["cron(0 18 1 * ? *)", "cron(0 18 ? * 2 *)"], zone="Asia/Shanghai", enabled=True)
    made = listed(client)
    assert sorted(made) == [schedule_name("stack-cron", KEY, 0), schedule_name("stack-cron", KEY, 1)]
    first = made[schedule_name("stack-cron", KEY, 0)]
    assert first["Name"].startswith("stack-cron-") and len(first["Name"]) <= 64
    assert (first["ScheduleExpression"], first["ScheduleExpressionTimezone"], first["State"]) == (
        "cron(0 18 1 * ? *)", "Asia/Shanghai", "ENABLED")
    assert (first["Target"]["Arn"], first["Target"]["RoleArn"]) == (TARGET, ROLE)
    assert json.loads(first["Target"]["Input"]) == {"cronJob": "ml/gpu-batch-images",
                                                     "scheduledTime": "<aws.scheduler.scheduled-time>"}

    schedules.put_schedules(KEY, ["cron(0 18 ? * 2-6 *)"], zone="UTC", enabled=False)  # paused, one day field
    (only,) = listed(client).values()
    assert (only["ScheduleExpression"], only["ScheduleExpressionTimezone"], only["State"]) == (
        "cron(0 18 ? * 2-6 *)", "UTC", "DISABLED")

    schedules.delete_schedules(KEY)
    schedules.delete_schedules(KEY)  # gone already: nothing to do
    assert listed(client) == {}


def test_a_refused_call_names_the_schedule_and_the_code(client: Any) -> None:
    schedules = SchedulerCronSchedules("stack-cron", TARGET, ROLE, client=client)
    schedules.put_schedules(KEY, ["rate(5 minutes)"], zone="UTC", enabled=True)
    client.meta.events.register("before-call.scheduler.UpdateSchedule", _throttled)
    with pytest.raises(SchedulerError, match=r"update schedule stack-cron-[0-9a-f]{16}-0 of ml/gpu-batch-images: "
                                             r"ThrottlingException"):
        schedules.put_schedules(KEY, ["rate(10 minutes)"], zone="UTC", enabled=True)


def _throttled(**_: Any) -> Any:
    from botocore.exceptions import ClientError

    raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "UpdateSchedule")


def test_get_schedules_reads_each_schedule_of_the_cron_job_as_scheduler_holds_it(client: Any) -> None:
    schedules = SchedulerCronSchedules("stack-cron", TARGET, ROLE, client=client)
    assert schedules.get_schedules(KEY) == []  # none put yet
    schedules.put_schedules(KEY, ["cron(0 18 1 * ? *)", "cron(0 18 ? * 2 *)"], zone="Asia/Shanghai", enabled=False)
    assert schedules.get_schedules(KEY) == [
        ScheduleState(schedule_name("stack-cron", KEY, 0), "cron(0 18 1 * ? *)", "Asia/Shanghai", False),
        ScheduleState(schedule_name("stack-cron", KEY, 1), "cron(0 18 ? * 2 *)", "Asia/Shanghai", False)]
    client.meta.events.register("before-call.scheduler.GetSchedule", _throttled)
    with pytest.raises(SchedulerError, match=r"get schedule stack-cron-[0-9a-f]{16}-0 of ml/gpu-batch-images"):
        schedules.get_schedules(KEY)
