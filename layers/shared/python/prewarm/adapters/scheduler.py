"""The cron jobs' schedules on EventBridge Scheduler (`CronSchedules`): one schedule per expression of a cron
job (`prewarm.domain.cron`: two when both day fields restrict), in the default group, named
`<prefix>-<16 hex of the job's key>-<n>`, so the functions' grant is scoped to the prefix. Each invokes the
run function with the job's key and the time it was scheduled for (Scheduler's context attribute)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.domain.cronjobs import ScheduleState
from prewarm.domain.keys import JobKey
from prewarm.services.ports import SchedulesError

# At most two expressions per cron job (`CronSchedule.scheduler_expressions`).
MAX_SCHEDULES_PER_JOB = 2
GROUP = "default"
# Late deliveries are still useful up to the job's startingDeadlineSeconds, which the run function checks.
_RETRY_POLICY = {"MaximumRetryAttempts": 5, "MaximumEventAgeInSeconds": 3600}


class SchedulerError(SchedulesError):
    """EventBridge Scheduler refused or failed a call; the message names the schedule and the error code."""


def schedule_name(prefix: str, key: JobKey, index: int) -> str:
    return f"{prefix}-{hashlib.sha256(str(key).encode()).hexdigest()[:16]}-{index}"


def run_input(key: JobKey) -> str:
    """The target's input: the cron job and the time the run is for, which Scheduler fills in."""
    return json.dumps({"cronJob": str(key), "scheduledTime": "<aws.scheduler.scheduled-time>"})


class SchedulerCronSchedules:
    """`CronSchedules` on EventBridge Scheduler. Give it a boto3 `scheduler` client, or it builds one on first
    use; `target_arn` is the run function, `role_arn` the role Scheduler invokes it as."""

    def __init__(self, prefix: str, target_arn: str, role_arn: str, client: Any = None) -> None:
        self.prefix, self.target_arn, self.role_arn = prefix, target_arn, role_arn
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("scheduler")
        return self._client

    def put_schedules(self, key: JobKey, expressions: Sequence[str], *, zone: str, enabled: bool) -> None:
        """Creates or updates one schedule per expression and deletes any left from a former spec."""
        for index, expression in enumerate(expressions):
            name = schedule_name(self.prefix, key, index)
            fields = {
                "Name": name, "GroupName": GROUP, "ScheduleExpression": expression,
                "ScheduleExpressionTimezone": zone, "State": "ENABLED" if enabled else "DISABLED",
                "Description": f"AdvancedCronJob {key}", "FlexibleTimeWindow": {"Mode": "OFF"},
                "Target": {"Arn": self.target_arn, "RoleArn": self.role_arn, "Input": run_input(key),
                           "RetryPolicy": _RETRY_POLICY},
            }
            try:
                self.client.update_schedule(**fields)
            except ClientError as e:
                if _code(e) != "ResourceNotFoundException":
                    raise _error(e, f"update schedule {name} of {key}") from e
                self._create(fields, key)
        for index in range(len(expressions), MAX_SCHEDULES_PER_JOB):
            self._delete(key, index)

    def _create(self, fields: dict[str, Any], key: JobKey) -> None:
        try:
            self.client.create_schedule(**fields)
        except ClientError as e:
            raise _error(e, f"create schedule {fields['Name']} of {key}") from e

    def get_schedules(self, key: JobKey) -> list[ScheduleState]:
        """The cron job's schedules as Scheduler holds them (those that exist)."""
        found = []
        for index in range(MAX_SCHEDULES_PER_JOB):
            name = schedule_name(self.prefix, key, index)
            try:
                got = self.client.get_schedule(Name=name, GroupName=GROUP)
            except ClientError as e:
                if _code(e) != "ResourceNotFoundException":
                    raise _error(e, f"get schedule {name} of {key}") from e
                continue
            except BotoCoreError as e:  # no credentials, no endpoint: said as Scheduler's failure
                raise SchedulerError(f"get schedule {name} of {key}: {e}") from e
            found.append(ScheduleState(name, str(got.get("ScheduleExpression", "")),
                                       str(got.get("ScheduleExpressionTimezone") or "UTC"),
                                       got.get("State") != "DISABLED"))
        return found

    def delete_schedules(self, key: JobKey) -> None:
        for index in range(MAX_SCHEDULES_PER_JOB):
            self._delete(key, index)

    def _delete(self, key: JobKey, index: int) -> None:
        name = schedule_name(self.prefix, key, index)
        try:
            self.client.delete_schedule(Name=name, GroupName=GROUP)
        except ClientError as e:
            if _code(e) != "ResourceNotFoundException":
                raise _error(e, f"delete schedule {name} of {key}") from e


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _error(e: ClientError, what: str) -> SchedulerError:
    return SchedulerError(f"{what}: {_code(e)}: {e.response.get('Error', {}).get('Message', '')}")
