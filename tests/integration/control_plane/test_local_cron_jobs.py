"""AdvancedCronJobs on the local stack: template.yaml on a moto server. Applying one writes its item; the
table stream's record reaches dispatch_job, which puts its EventBridge Scheduler schedule (moto's); the local
stack fires that schedule at its times (`LocalScheduler`, here on a test clock), and run_cron_job makes the
run. Changing the item changes the schedule; deleting it deletes the schedule."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from typing import Any

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.jobs import JobState, job_key
from prewarm.services.cron_jobs import delete_cron_job
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.scheduler import LocalScheduler, schedule_of
from prewarm_devtools.sam.stack import LocalStack
from prewarm_devtools.sam.template import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_from_file(ROOT / "samplefiles" / "cluster.yaml")
        stack = LocalStack(aws.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        stack.prime_streams()
        yield {"stack": stack, "scheduler": aws.client("scheduler"),
               "store": DynamoJobStore(stack.env()["TABLE_NAME"], client=aws.client("dynamodb"))}


def cron(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1beta1", "kind": "AdvancedCronJob",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"schedule": "* * * * *", **spec, "template": {"imageListPullJobTemplate": {"spec": {
                "images": ["nginx:1.27"], "parallelism": 0}}}}}


def schedules(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    client = env["scheduler"]
    return {s["Name"]: client.get_schedule(Name=s["Name"]) for s in client.list_schedules()["Schedules"]}


def test_a_cron_job_is_a_schedule_fired_at_its_times_into_runs(env: dict[str, Any]) -> None:
    stack, store = env["stack"], env["store"]
    apply_manifest(store, cron("every-minute", timeZone="Asia/Shanghai"), now=time.time())
    stack.run_until_idle()

    (made,) = schedules(env).values()
    assert made["Name"].startswith("prewarm-cron-local-") and made["State"] == "ENABLED"
    assert (made["ScheduleExpression"], made["ScheduleExpressionTimezone"]) == ("cron(* * * * ? *)", "Asia/Shanghai")
    assert made["Target"]["Arn"] == stack.physical["RunCronJobFunction"].attrs["Arn"]
    assert made["Target"]["RoleArn"] == stack.physical["CronSchedulerRole"].attrs["Arn"]

    # Two minutes later on the local scheduler's clock: the last time due is fired once, with its time
    created = made["LastModificationDate"].timestamp()
    later = created - created % 60 + 120
    local = LocalScheduler(env["scheduler"], stack.invoke_arn, clock=lambda: later)
    assert local.pump() == 1
    assert local.pump() == 0  # nothing more is due at the same time
    record = store.get_job(job_key("ml", f"every-minute-{int(later)}"))
    assert record is not None and record.is_list_job
    annotations = record.manifest["metadata"]["annotations"]
    assert calendar.timegm(time.strptime(annotations["apps.kruise.io/scheduled-at"], "%Y-%m-%dT%H:%M:%SZ")) == later

    # Paused: the schedule is disabled; deleted: the schedule goes, and the runs with the cron job
    apply_manifest(store, cron("every-minute", timeZone="Asia/Shanghai", paused=True), now=time.time())
    stack.run_until_idle()
    assert [s["State"] for s in schedules(env).values()] == ["DISABLED"]
    assert delete_cron_job(store, job_key("ml", "every-minute"), now=time.time()) == [record.name]
    stack.run_until_idle()
    assert schedules(env) == {}
    assert store.get_job(record.key) is None or store.get_job(record.key).state is JobState.DELETING  # type: ignore[union-attr]


def test_scheduler_expressions_read_back_as_the_cron_they_came_from() -> None:
    start = calendar.timegm((2026, 11, 28, 0, 0, 0))
    for expression, first in (("cron(0/15 9-17 ? * 2-6 *)", (2026, 11, 30, 9, 0)),  # Saturday → Monday 09:00
                              ("cron(30 2 * * ? *)", (2026, 11, 28, 2, 30)),
                              ("cron(0 0 ? * 1 *)", (2026, 11, 29, 0, 0)),  # Sunday is 1
                              ("rate(5 minutes)", (2026, 11, 28, 0, 5))):
        assert schedule_of(expression).next_after(start) == calendar.timegm((*first, 0)), expression
