"""AdvancedCronJobs in the control plane: applied like any manifest, their schedules put and deleted from the
table stream's records, a run per due time as Kruise's controller decides it, deletion with their runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from prewarm.domain.cronjobs import SCHEDULED_AT_ANNOTATION, ScheduleState, StoredCronJob
from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.sources import SOURCE_ANNOTATION, Source, SourceConflictError
from prewarm.services.cron_jobs import (
    cron_job_status,
    cron_job_statuses,
    cron_runs,
    delete_cron_job,
    describe_cron_job,
    run_due,
    sync_schedules,
)
from prewarm.services.jobs import JobNotFoundError, apply_manifest
from prewarm.services.ports import SchedulesError
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane

T0 = 1_800_000_000.0 - 1_800_000_000.0 % 60 + 60  # a whole minute after the plane's clock starts
KEY = job_key("default", "nightly")


class RecordedSchedules:
    """`CronSchedules` that records what it was asked (the adapter is tested against moto's Scheduler)."""

    def __init__(self) -> None:
        self.schedules: dict[JobKey, tuple[list[str], str, bool]] = {}

    def put_schedules(self, key: JobKey, expressions: Sequence[str], *, zone: str, enabled: bool) -> None:
        self.schedules[key] = (list(expressions), zone, enabled)

    def delete_schedules(self, key: JobKey) -> None:
        self.schedules.pop(key, None)

    def get_schedules(self, key: JobKey) -> list[ScheduleState]:
        expressions, zone, enabled = self.schedules.get(key, ([], "", False))
        return [ScheduleState(f"s-{n}", expression, zone, enabled) for n, expression in enumerate(expressions)]


def cron(name: str = "nightly", **spec: Any) -> dict[str, Any]:
    # No retries: a failed pull fails its image at once
    template = {"imageListPullJobTemplate": {"spec": {"images": ["nginx:1.27", "redis:7"], "pullPolicy": {
        "backoffLimit": 0}, "selector": {"names": ["node-a"]}}}}
    return {"apiVersion": "apps.kruise.io/v1beta1", "kind": "AdvancedCronJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedule": "* * * * *", "template": template, **spec}}


def finish(plane: ControlPlane, run: str, phase: str = "Succeeded") -> None:
    """Every image job of list job `run` pulls on its node."""
    if not plane.cluster.nodes:
        plane.cluster.nodes.append(make_node("node-a"))
    plane.plan(run)
    record = plane.store.get_job(job_key("default", run))
    assert record is not None
    for child in record.children:
        plane.plan(child)
        plane.report(child, "node-a", "Pulling")
        plane.report(child, "node-a", phase, **({"message": "pull failed"} if phase == "Failed" else {}))


def test_applying_stores_it_and_says_what_changed(plane: ControlPlane) -> None:
    assert apply_manifest(plane.store, cron(), now=plane.now()).describe() == \
        "advancedcronjob.apps.kruise.io/nightly created"
    assert apply_manifest(plane.store, cron(), now=plane.now()).outcome == "unchanged"
    assert apply_manifest(plane.store, cron(paused=True), now=plane.now()).outcome == "configured"
    stored = plane.store.get_cron_job(KEY)
    assert stored is not None and stored.job.spec.paused
    assert plane.store.list_jobs() == []  # no run until one is due


def test_the_streams_record_puts_schedules_with_the_time_zone_and_deletes_them_with_the_item(
        plane: ControlPlane) -> None:
    schedules = RecordedSchedules()
    apply_manifest(plane.store, cron(schedule="0 0 1 * MON", timeZone="Asia/Shanghai"), now=plane.now())
    stored = plane.store.get_cron_job(KEY)
    assert sync_schedules(schedules, stored, None) == "scheduled"
    assert schedules.schedules[KEY] == (["cron(0 0 1 * ? *)", "cron(0 0 ? * 2 *)"], "Asia/Shanghai", True)
    paused = StoredCronJob(KEY, cron(paused=True))
    assert sync_schedules(schedules, paused, stored) == "paused"
    assert schedules.schedules[KEY] == (["cron(* * * * ? *)"], "UTC", False)
    assert sync_schedules(schedules, None, paused) == "deleted"
    assert schedules.schedules == {}


def test_a_due_time_creates_the_run_named_after_it(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(), now=plane.now())
    outcome = run_due(plane.store, KEY, scheduled_at=T0, now=T0 + 0.5)
    assert outcome.run == f"nightly-{int(T0)}"
    run = plane.store.get_job(job_key("default", outcome.run))
    assert run is not None and run.is_list_job and len(run.children) == 2
    assert run.manifest["metadata"]["annotations"][SCHEDULED_AT_ANNOTATION] == "2027-01-15T08:01:00Z"
    # Delivered twice (Scheduler retries): still one run
    assert run_due(plane.store, KEY, scheduled_at=T0, now=T0 + 2).run == outcome.run
    assert [r.name for r in cron_runs(plane.store, KEY, now=T0 + 2)] == [outcome.run]


def test_forbid_skips_a_run_while_one_is_active(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(concurrencyPolicy="Forbid"), now=plane.now())
    first = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    skipped = run_due(plane.store, KEY, scheduled_at=T0 + 60, now=T0 + 60)
    assert (skipped.run, skipped.skipped) == ("", f"concurrencyPolicy Forbid: {first} still running")
    finish(plane, first)
    assert run_due(plane.store, KEY, scheduled_at=T0 + 120, now=T0 + 120).run == f"nightly-{int(T0 + 120)}"


def test_replace_deletes_the_active_run_for_the_new_one(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(), now=plane.now())  # Replace: Kruise's default for image lists
    first = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    second = run_due(plane.store, KEY, scheduled_at=T0 + 60, now=T0 + 60)
    assert second.replaced == [first] and second.run == f"nightly-{int(T0 + 60)}"
    record = plane.store.get_job(job_key("default", first))
    assert record is not None and record.state is JobState.DELETING
    assert [r.name for r in cron_runs(plane.store, KEY, now=T0 + 60)] == [second.run]


def test_paused_and_late_runs_are_skipped(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(paused=True), now=plane.now())
    assert run_due(plane.store, KEY, scheduled_at=T0, now=T0).skipped == "paused"
    apply_manifest(plane.store, cron(startingDeadlineSeconds=10), now=plane.now())
    assert run_due(plane.store, KEY, scheduled_at=T0, now=T0 + 11).skipped.startswith("missed its starting deadline")
    assert plane.store.list_jobs() == []
    assert run_due(plane.store, job_key("default", "gone"), scheduled_at=T0, now=T0).skipped == "the cron job is gone"


def test_finished_runs_beyond_the_history_limits_are_deleted(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(successfulJobsHistoryLimit=1, failedJobsHistoryLimit=0), now=plane.now())
    runs, expired = [], []
    for minute in range(3):
        outcome = run_due(plane.store, KEY, scheduled_at=T0 + 60 * minute, now=T0 + 60 * minute)
        runs.append(outcome.run)
        expired += outcome.expired
        finish(plane, runs[-1], "Failed" if minute == 1 else "Succeeded")
    assert expired == [runs[1]]  # the failed run went once the next was made (limit 0)
    outcome = run_due(plane.store, KEY, scheduled_at=T0 + 180, now=T0 + 180)
    assert outcome.expired == [runs[0]]  # the older of two successes (limit 1)
    status = cron_job_status(plane.store, plane.store.get_cron_job(KEY), now=T0 + 180)  # type: ignore[arg-type]
    assert status == {"type": "ImageListPullJob", "lastScheduleTime": "2027-01-15T08:04:00Z",
                      "active": [{"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImageListPullJob",
                                  "name": outcome.run, "namespace": "default"}]}


def test_deleting_it_deletes_its_runs(plane: ControlPlane) -> None:
    apply_manifest(plane.store, cron(), now=plane.now())
    run = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    assert delete_cron_job(plane.store, KEY, now=T0 + 1) == [run]
    assert plane.store.get_cron_job(KEY) is None
    assert plane.store.get_job(job_key("default", run)).state is JobState.DELETING  # type: ignore[union-attr]
    with pytest.raises(JobNotFoundError, match='advancedcronjob "nightly" not found in namespace "default"'):
        delete_cron_job(plane.store, KEY, now=T0 + 2)


def test_a_resources_cron_job_is_changed_and_deleted_by_the_resource_only(plane: ControlPlane) -> None:
    doc = cron()
    doc["metadata"]["annotations"] = {SOURCE_ANNOTATION: Source.RESOURCE}
    apply_manifest(plane.store, doc, now=plane.now(), from_resource=True)
    with pytest.raises(SourceConflictError, match="managed by its AdvancedCronJob resource"):
        apply_manifest(plane.store, cron(), now=plane.now())
    with pytest.raises(SourceConflictError, match="managed by its AdvancedCronJob resource"):
        delete_cron_job(plane.store, KEY, now=plane.now())
    assert delete_cron_job(plane.store, KEY, now=plane.now(), by=Source.RESOURCE) == []


def test_runs_show_their_source_and_the_cli_may_delete_one(plane: ControlPlane) -> None:
    from prewarm.services.jobs import request_deletion

    apply_manifest(plane.store, cron(), now=plane.now())
    run = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    record = plane.store.get_job(job_key("default", run))
    assert record is not None and record.source is Source.CRON
    request_deletion(plane.store, "default", run, now=T0 + 1)
    assert cron_runs(plane.store, KEY, now=T0 + 1) == []


def test_a_due_time_and_the_statuses_read_the_job_items_once(plane: ControlPlane,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    apply_manifest(plane.store, cron(), now=plane.now())
    apply_manifest(plane.store, cron("hourly"), now=plane.now())
    first = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    reads: list[int] = []
    list_jobs = plane.store.list_jobs
    monkeypatch.setattr(plane.store, "list_jobs", lambda: reads.append(1) or list_jobs())
    assert run_due(plane.store, KEY, scheduled_at=T0 + 60, now=T0 + 60).replaced == [first]
    assert len(reads) == 1
    statuses = cron_job_statuses(plane.store, plane.store.list_cron_jobs(), now=T0 + 60)
    assert len(reads) == 2
    assert [[a["name"] for a in s.get("active", [])] for s in statuses] == [[], [f"nightly-{int(T0 + 60)}"]]


def test_describe_gives_the_spec_runs_next_time_and_the_schedules_on_aws_against_the_spec(
        plane: ControlPlane) -> None:
    schedules = RecordedSchedules()
    apply_manifest(plane.store, cron(timeZone="Europe/Paris"), now=plane.now())
    sync_schedules(schedules, plane.store.get_cron_job(KEY), None)
    first = run_due(plane.store, KEY, scheduled_at=T0, now=T0).run
    finish(plane, first)
    second = run_due(plane.store, KEY, scheduled_at=T0 + 60, now=T0 + 60).run

    described = describe_cron_job(plane.store, schedules, KEY, now=T0 + 61)
    assert described.stored.key == KEY and described.stored.job.spec.zone == "Europe/Paris"
    assert [(r.name, r.succeeded) for r in described.runs] == [(first, True), (second, None)]
    assert described.status["lastScheduleTime"] == cron_job_status(plane.store, described.stored,
                                                                    now=T0 + 61)["lastScheduleTime"]
    assert [a["name"] for a in described.status["active"]] == [second]  # type: ignore[union-attr]
    assert described.next_run == T0 + 120
    assert [(s.expression, s.zone, s.enabled) for s in described.schedules] == [("cron(* * * * ? *)", "Europe/Paris",
                                                                                 True)]
    assert described.drift == "" and described.schedules_error == ""

    # Paused in the table, its schedule not put again yet: the difference is named
    apply_manifest(plane.store, cron(timeZone="Europe/Paris", paused=True), now=plane.now())
    paused = describe_cron_job(plane.store, schedules, KEY, now=T0 + 61)
    assert (paused.next_run, paused.drift) == (None, "enabled while paused")
    schedules.delete_schedules(KEY)
    assert describe_cron_job(plane.store, schedules, KEY, now=T0).drift.startswith("no schedule on AWS")


def test_describe_without_schedules_or_when_they_fail_says_why_and_a_missing_cron_job_is_not_found(
        plane: ControlPlane) -> None:
    class Refusing:
        def get_schedules(self, key: JobKey) -> list[ScheduleState]:
            raise SchedulesError("get schedule x of default/nightly: AccessDeniedException: no")

    apply_manifest(plane.store, cron(), now=plane.now())
    assert describe_cron_job(plane.store, None, KEY, now=T0).schedules_error.startswith("not read: the stack names no")
    assert describe_cron_job(plane.store, Refusing(), KEY, now=T0).schedules_error == (
        "not read: get schedule x of default/nightly: AccessDeniedException: no")
    with pytest.raises(JobNotFoundError, match='advancedcronjob "gone" not found in namespace "default"'):
        describe_cron_job(plane.store, None, job_key("default", "gone"), now=T0)
