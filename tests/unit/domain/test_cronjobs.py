"""Kruise's AdvancedCronJob with an image list template: its webhook's cases (pkg/webhook/advancedcronjob,
validating and mutating tests), its samples, and the rules of its controller (advancedcronjob_imagelistpulljob
_controller.go) as pure functions."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from prewarm.domain.cronjobs import (
    CRON_JOB_ANNOTATION,
    SCHEDULED_AT_ANNOTATION,
    ZONE_NOT_GIVEN,
    AdvancedCronJob,
    AdvancedCronJobSpec,
    CronRun,
    cron_status,
    expired_runs,
    plan_run,
    run_outcome,
)
from prewarm.domain.kubernetes import JobValidationError, parse_time
from prewarm.domain.manifests import parse_manifest, parse_manifests

Obj = dict[str, Any]
T0 = datetime(2026, 11, 28, 23, 0, tzinfo=UTC).timestamp()


def cron(**spec: Any) -> Obj:
    template = spec.pop("template", {"imageListPullJobTemplate": {"spec": {
        "images": ["busybox:latest", "alpine:latest"], "selector": {"names": ["node1"]},
        "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 100}}}})
    return {"apiVersion": "apps.kruise.io/v1beta1", "kind": "AdvancedCronJob",
            "metadata": {"name": "test-acj-v1beta1", "namespace": "default"},
            "spec": {"schedule": "0 0 * * *", "concurrencyPolicy": "Replace", "template": template, **spec}}


def template_spec(**spec: Any) -> Obj:
    return {"imageListPullJobTemplate": {"spec": {"images": ["busybox:latest"], **spec}}}


def errors(doc: Obj) -> list[tuple[str, str]]:
    try:
        parse_manifest(copy.deepcopy(doc))
    except JobValidationError as e:
        return [(error.path, error.message) for error in e.errors]
    return []


TEMPLATE = "spec.template.imageListPullJobTemplate.spec"
# Kruise's webhook tests (validating/advancedcronjob_create_update_handler_test.go) and what each refuses.
REFUSED = {
    "empty schedule": (cron(schedule=""), "spec.schedule", "schedule cannot be empty"),
    "invalid schedule": (cron(schedule="invalid-cron"), "spec.schedule", "invalid cron schedule"),
    "broken time zone": (cron(timeZone="broken"), "spec.timeZone", 'unknown time zone "broken"'),
    "Local time zone": (cron(timeZone="Local"), "spec.timeZone", "must be an explicit time zone"),
    "empty time zone": (cron(timeZone=""), "spec.timeZone", "must be nil or a non-empty string"),
    "TZ and timeZone": (cron(schedule="TZ=UTC 0 0 * * *", timeZone="UTC"), "spec.schedule",
                        "cannot use both timeZone field and TZ or CRON_TZ in schedule"),
    "no template": (cron(template={}), "spec.template", "spec must have one template"),
    "both templates": (cron(template={**template_spec(), "jobTemplate": {"spec": {}}}), "spec.template",
                       "spec can have only one template"),
    "a job template": (cron(template={"jobTemplate": {"spec": {}}}), "spec.template.jobTemplate",
                       "Prewarm runs only spec.template.imageListPullJobTemplate"),
    "Allow with an image list": (cron(concurrencyPolicy="Allow"), "spec.concurrencyPolicy",
                                 "concurrencyPolicy should be Replace or Forbid, but current value is: Allow"),
    "unknown concurrency policy": (cron(concurrencyPolicy="Sometimes"), "spec.concurrencyPolicy",
                                   '"Allow", "Forbid", "Replace"'),
    "negative starting deadline": (cron(startingDeadlineSeconds=-1), "spec.startingDeadlineSeconds",
                                   "greater than or equal to 0"),
    "negative successful history": (cron(successfulJobsHistoryLimit=-1), "spec.successfulJobsHistoryLimit",
                                    "greater than or equal to 0"),
    "negative failed history": (cron(failedJobsHistoryLimit=-1), "spec.failedJobsHistoryLimit",
                                "greater than or equal to 0"),
    "ttlSecondsAfterFinished": (cron(template=template_spec(completionPolicy={"type": "Always",
                                                                              "ttlSecondsAfterFinished": 100})),
                                f"{TEMPLATE}.completionPolicy.ttlSecondsAfterFinished",
                                "not supported in advancedCronJob"),
    "deadline over a day": (cron(template=template_spec(completionPolicy={"type": "Always",
                                                                          "activeDeadlineSeconds": 86_401})),
                            f"{TEMPLATE}.completionPolicy.activeDeadlineSeconds", "must be less than 86400"),
    "deadline below a set timeout": (cron(template=template_spec(completionPolicy={"activeDeadlineSeconds": 100},
                                                                 pullPolicy={"timeoutSeconds": 300})),
                                     f"{TEMPLATE}.completionPolicy.activeDeadlineSeconds",
                                     "must be greater than pullPolicy.timeoutSeconds(300)"),
    # No type: Kruise's defaulting fills in the 600 s timeout, which the deadline is then below.
    "deadline below the defaulted timeout": (
        cron(template=template_spec(completionPolicy={"activeDeadlineSeconds": 100})),
        f"{TEMPLATE}.completionPolicy.activeDeadlineSeconds", "must be greater than pullPolicy.timeoutSeconds(600)"),
    "Never": (cron(template=template_spec(completionPolicy={"type": "Never"})),
              f"{TEMPLATE}.completionPolicy.type", "completionPolicy should be Always, but current value is: Never"),
    "names and labels": (cron(template=template_spec(selector={"names": ["n1"], "matchLabels": {"a": "b"}})),
                         f"{TEMPLATE}.selector", "names cannot be combined with matchLabels"),
    "selector and podSelector": (cron(template=template_spec(selector={"names": ["n1"]},
                                                             podSelector={"matchLabels": {"a": "b"}})),
                                 f"{TEMPLATE}.podSelector", "cannot be combined with"),
    "duplicate node names": (cron(template=template_spec(selector={"names": ["n1", "n1"]})),
                             f"{TEMPLATE}.selector.names[1]", 'duplicate node name "n1"'),
    "no images": (cron(template={"imageListPullJobTemplate": {"spec": {"images": []}}}), f"{TEMPLATE}.images",
                  "must list at least one image"),
    "duplicate images": (cron(template=template_spec(images=["busybox:latest", "busybox:latest"])),
                         f"{TEMPLATE}.images[1]", "duplicate image"),
    "invalid image": (cron(template=template_spec(images=["Busy Box"])), f"{TEMPLATE}.images[0]", ""),
    "name with a dot": ({**cron(), "metadata": {"name": "nightly.pull"}}, "metadata.name",
                        "must consist of alphanumeric characters or '-'"),
    "name over 63": ({**cron(), "metadata": {"name": "a" * 64}}, "metadata.name", "no more than 63 characters"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_kruises_webhook_refuses_is_refused_naming_the_field(name: str) -> None:
    doc, path, message = REFUSED[name]
    found = errors(doc)
    assert any(p == path and message in m for p, m in found), found


def test_kruises_valid_cases_are_accepted() -> None:
    # "create v1beta1 AdvancedCronJob ImageListPullJobTemplate": Always with a 100 s deadline, no pull policy
    assert errors(cron()) == []
    # "update ... ImageListPullJobTemplate": a time zone, a starting deadline, Forbid
    assert errors(cron(schedule="1 0 * * *", timeZone="Asia/Shanghai", startingDeadlineSeconds=100,
                       concurrencyPolicy="Forbid")) == []
    assert errors(cron(timeZone="America/New_York")) == []


def test_v1alpha1_is_refused_as_kruise_has_no_image_list_template_there() -> None:
    found = errors({**cron(), "apiVersion": "apps.kruise.io/v1alpha1"})
    assert found == [("apiVersion", "apps.kruise.io/v1alpha1 AdvancedCronJob has no spec.template.imageListPullJob"
                                    "Template (Kruise added it in v1beta1): use apps.kruise.io/v1beta1")]


# PR #2207's sample, verbatim.
PR_2207_SAMPLE = """
apiVersion: apps.kruise.io/v1beta1
kind: AdvancedCronJob
metadata:
  name: acj-test
spec:
  schedule: "*/5 * * * *"
  template:
    imageListPullJobTemplate:
      spec:
          images:
                  - busybox:latest
                  - not-exist-img:latest
          parallelism: 10      # [optional] the maximal number of Nodes that pull this image at the same time
          selector:            # [optional] the names or label selector to assign Nodes
            names:
            - ci-testing-worker2
            - ci-testing-worker3
          pullPolicy:
            backoffLimit: 3
            timeoutSeconds: 300
"""
# Issue #2214's sample: ttlSecondsAfterFinished in the template, which Kruise refuses since.
ISSUE_2214_SAMPLE = """
apiVersion: apps.kruise.io/v1beta1
kind: AdvancedCronJob
metadata:
    name: acj-test
    namespace: default
spec:
    concurrencyPolicy: Replace
    paused: false
    schedule: "*/2 * * * *"
    successfulJobsHistoryLimit: 3
    failedJobsHistoryLimit: 5
    template:
      imageListPullJobTemplate:
        spec:
          completionPolicy:
            ttlSecondsAfterFinished: 30
            type: Always
          imagePullPolicy: IfNotPresent
          images:
          - busybox
          parallelism: 2
          pullPolicy:
            backoffLimit: 1
            timeoutSeconds: 300
"""


def test_the_pr_sample_gets_kruises_defaults() -> None:
    (job,) = parse_manifests(PR_2207_SAMPLE)
    assert isinstance(job, AdvancedCronJob)
    spec = job.to_manifest()["spec"]
    # SetDefaultsAdvancedCronJob: Replace for an image list, not paused, 3 and 1 runs kept
    assert {k: spec[k] for k in ("concurrencyPolicy", "paused", "successfulJobsHistoryLimit",
                                 "failedJobsHistoryLimit")} == {"concurrencyPolicy": "Replace", "paused": False,
                                                                "successfulJobsHistoryLimit": 3,
                                                                "failedJobsHistoryLimit": 1}
    template = spec["template"]["imageListPullJobTemplate"]["spec"]
    assert template["completionPolicy"] == {"type": "Always"}  # defaulted, not required
    assert template["pullPolicy"] == {"timeoutSeconds": 300, "backoffLimit": 3}
    assert template["imagePullPolicy"] == "IfNotPresent"


def test_the_issue_sample_with_a_ttl_is_refused() -> None:
    with pytest.raises(JobValidationError, match="ttlSecondsAfterFinished is not supported in advancedCronJob"):
        parse_manifests(ISSUE_2214_SAMPLE)


def test_a_run_is_an_image_list_pull_job_named_as_kruise_names_it() -> None:
    doc = cron()
    doc["spec"]["template"]["imageListPullJobTemplate"]["metadata"] = {"labels": {"app": "prefetch"},
                                                                     "annotations": {"team": "ml"}}
    job = AdvancedCronJob.from_manifest(doc)
    run = job.run(T0)
    assert run.kind == "ImageListPullJob"
    assert run.name == f"test-acj-v1beta1-{int(T0)}"
    assert run.namespace == "default"
    assert run.metadata.labels == {"app": "prefetch"}
    assert run.metadata.annotations == {"team": "ml", SCHEDULED_AT_ANNOTATION: "2026-11-28T23:00:00Z",
                                        CRON_JOB_ANNOTATION: "test-acj-v1beta1"}
    assert run.spec.images == ["busybox:latest", "alpine:latest"]
    # Kruise took the 100 s deadline with no pull timeout: no pull of the run outlasts it
    assert run.spec.completion_policy.active_deadline_seconds == 100
    assert run.spec.pull_policy.timeout_seconds == 100
    assert parse_time(run.metadata.annotations[SCHEDULED_AT_ANNOTATION]) == T0


def test_the_time_zone_is_time_zone_then_the_schedules_prefix_then_utc() -> None:
    assert AdvancedCronJob.from_manifest(cron(timeZone="Asia/Shanghai")).spec.zone == "Asia/Shanghai"
    assert AdvancedCronJob.from_manifest(cron(schedule="CRON_TZ=Europe/Paris 0 0 * * *")).spec.zone == "Europe/Paris"
    assert AdvancedCronJob.from_manifest(cron()).spec.zone == "UTC"


def test_a_cron_job_without_a_time_zone_is_warned_that_it_runs_in_utc() -> None:
    assert AdvancedCronJob.from_manifest(cron()).warnings() == [ZONE_NOT_GIVEN]
    assert "runs in UTC" in ZONE_NOT_GIVEN and "spec.timeZone" in ZONE_NOT_GIVEN
    assert AdvancedCronJob.from_manifest(cron(timeZone="Asia/Shanghai")).warnings() == []
    assert AdvancedCronJob.from_manifest(cron(schedule="TZ=Europe/Paris 0 0 * * *")).warnings() == []


def test_the_next_run_is_the_schedules_next_time_in_its_zone_and_none_while_paused() -> None:
    # 23:00 UTC on 2026-11-28 is 07:00 on the 29th in Shanghai: "0 8 * * *" there is 00:00 UTC the 29th
    assert spec(schedule="0 8 * * *", timeZone="Asia/Shanghai").next_run(T0) == T0 + 3600
    assert spec(schedule="0 8 * * *").next_run(T0) == T0 + 9 * 3600
    assert spec(schedule="0 8 * * *", paused=True).next_run(T0) is None
    assert spec(schedule="@every 5m").next_run(T0) == T0 + 300


# --- The controller's rules ---------------------------------------------------------------------------


def spec(**fields: Any) -> AdvancedCronJobSpec:
    return AdvancedCronJob.from_manifest(cron(**fields)).spec


def test_a_due_run_starts_and_replace_deletes_the_active_ones_first() -> None:
    runs = [CronRun("a-1", T0 - 60), CronRun("a-0", T0 - 120, succeeded=True)]
    unset = cron()
    del unset["spec"]["concurrencyPolicy"]  # Kruise's default for an image list: Replace
    assert plan_run(AdvancedCronJob.from_manifest(unset).spec, scheduled_at=T0, now=T0 + 1, runs=runs) == plan_run(
        spec(concurrencyPolicy="Replace"), scheduled_at=T0, now=T0 + 1, runs=runs)
    plan = plan_run(spec(), scheduled_at=T0, now=T0 + 1, runs=runs)
    assert (plan.create, plan.replace) == (True, ("a-1",))


def test_forbid_skips_the_run_while_another_is_active() -> None:
    active = [CronRun("a-1", T0 - 60)]
    plan = plan_run(spec(concurrencyPolicy="Forbid"), scheduled_at=T0, now=T0, runs=active)
    assert (plan.create, plan.reason) == (False, "concurrencyPolicy Forbid: a-1 still running")
    finished = [CronRun("a-1", T0 - 60, succeeded=False)]
    assert plan_run(spec(concurrencyPolicy="Forbid"), scheduled_at=T0, now=T0, runs=finished).create


def test_the_same_scheduled_time_fired_twice_neither_blocks_nor_replaces_its_own_run() -> None:
    own = [CronRun(f"a-{int(T0)}", T0)]
    assert plan_run(spec(concurrencyPolicy="Forbid"), scheduled_at=T0, now=T0, runs=own).create
    assert plan_run(spec(), scheduled_at=T0, now=T0, runs=own).replace == ()


def test_allow_leaves_active_runs_running() -> None:
    allowed = AdvancedCronJobSpec.model_construct(**{**spec().__dict__, "concurrency_policy": "Allow"})
    plan = plan_run(allowed, scheduled_at=T0, now=T0, runs=[CronRun("a-1", T0 - 60)])
    assert (plan.create, plan.replace) == (True, ())


def test_paused_stops_runs() -> None:
    plan = plan_run(spec(paused=True), scheduled_at=T0, now=T0, runs=[])
    assert (plan.create, plan.reason) == (False, "paused")


def test_a_run_later_than_its_starting_deadline_is_skipped() -> None:
    late = spec(startingDeadlineSeconds=30)
    assert plan_run(late, scheduled_at=T0, now=T0 + 30, runs=[]).create
    plan = plan_run(late, scheduled_at=T0, now=T0 + 31, runs=[])
    assert (plan.create, plan.reason) == (False, "missed its starting deadline (30 s after 2026-11-28T23:00:00Z)")
    assert plan_run(spec(), scheduled_at=T0, now=T0 + 86_400, runs=[]).create  # no deadline: always starts


def test_history_limits_delete_the_oldest_finished_runs() -> None:
    runs = [CronRun(f"ok-{i}", T0 + i, start_time=T0 + i, succeeded=True) for i in range(5)]
    runs += [CronRun(f"bad-{i}", T0 + i, start_time=T0 + i, succeeded=False) for i in range(3)]
    runs += [CronRun("unstarted", T0, succeeded=True), CronRun("running", T0 + 9)]
    assert expired_runs(spec(), runs) == ["unstarted", "ok-0", "ok-1", "bad-0", "bad-1"]
    assert expired_runs(spec(successfulJobsHistoryLimit=0, failedJobsHistoryLimit=5), runs) == [
        "unstarted", "ok-0", "ok-1", "ok-2", "ok-3", "ok-4"]


def test_a_run_succeeds_when_every_image_did() -> None:
    assert run_outcome(None, 0, 2) is None
    assert run_outcome("2026-11-28T23:01:00Z", 2, 2) is True
    assert run_outcome("2026-11-28T23:01:00Z", 1, 2) is False


def test_status_lists_active_runs_and_the_last_schedule_time() -> None:
    runs = [CronRun("a-2", T0 + 60), CronRun("a-1", T0, succeeded=True), CronRun("a-0", None)]
    assert cron_status(runs, "default") == {
        "type": "ImageListPullJob",
        "active": [{"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImageListPullJob", "name": "a-0",
                    "namespace": "default"},
                   {"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImageListPullJob", "name": "a-2",
                    "namespace": "default"}],
        "lastScheduleTime": "2026-11-28T23:01:00Z"}
    assert cron_status([], "default") == {"type": "ImageListPullJob"}
    assert parse_time("yesterday") is None
    assert parse_time("2026-11-28T23:00:00") is None
