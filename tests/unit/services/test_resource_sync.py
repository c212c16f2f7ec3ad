"""`sync_resources`: prewarm.dev resources into the table and status back, writing only what changed.

The Kubernetes side is an in-memory API that keeps resourceVersion and generation as the API server
does for a custom resource with a status subresource (spec changes bump the generation, status writes
do not, a stale resourceVersion is a conflict); the embedded API server's own CRD support is tested
in tests/integration/kubeapi and end to end in tests/integration/control_plane/test_resource_jobs.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.sources import SOURCE_ANNOTATION, Source, SourceConflictError, source_of
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm.services.ports import ClusterConflictError
from prewarm.services.resources import sync_resources
from tests.support.control_plane import ControlPlane
from tests.support.resources import FakeResources

API = "prewarm.dev/v1alpha1"


@pytest.fixture
def api() -> FakeResources:
    return FakeResources()


def job_spec(image: str = "nginx:1.27", **extra: Any) -> dict[str, Any]:
    return {"image": image, "parallelism": 2, "selector": {"names": ["node-a", "node-b"]}, **extra}


def test_a_new_resource_becomes_a_job_of_the_resource_and_gets_kruises_status(plane: ControlPlane,
                                                                              api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())

    report = sync_resources(plane.store, api, now=10.0)

    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and source_of(record.manifest) is Source.RESOURCE
    assert report.applied == ["ImagePullJob default/web created"]
    status = api.get("ImagePullJob", "web")["status"]
    assert status["observedGeneration"] == 1
    assert status["nodes"] == {"waiting": 0, "pulling": 0, "succeeded": 0, "failed": 0}
    assert status["startTime"] == "1970-01-01T00:00:10Z"


def test_an_unchanged_resource_costs_no_table_write_and_no_status_write(plane: ControlPlane,
                                                                        api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    version = plane.store.get_job(job_key("default", "web")).version  # type: ignore[union-attr]
    api.calls.clear()

    report = sync_resources(plane.store, api, now=20.0)

    assert (report.unchanged, report.applied, report.statuses_written) == (1, [], 0)
    assert api.calls == ["list namespaces", "list prewarmrules", "list warmsnapshots", "list imagelistpulljobs",
                         "list imagepulljobs", "list advancedcronjobs"]
    assert plane.store.get_job(job_key("default", "web")).version == version  # type: ignore[union-attr]


def test_a_spec_change_reconfigures_the_job(plane: ControlPlane, api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    api.put("ImagePullJob", "web", job_spec(parallelism=5))

    report = sync_resources(plane.store, api, now=20.0)

    assert report.applied == ["ImagePullJob default/web configured"]
    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and record.manifest["spec"]["parallelism"] == 5
    assert api.get("ImagePullJob", "web")["status"]["observedGeneration"] == 2


def test_a_deleted_resource_marks_its_job_for_deletion(plane: ControlPlane, api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    api.delete_object(API, "imagepulljobs", "web", "default")

    report = sync_resources(plane.store, api, now=20.0)

    assert report.deleted == ["ImagePullJob default/web"]
    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and record.state == JobState.DELETING


def test_missing_crds_delete_nothing(plane: ControlPlane, api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    api.missing.add("imagepulljobs")

    report = sync_resources(plane.store, api, now=20.0)

    assert report.missing_kinds == ["imagepulljobs.prewarm.dev"] and report.deleted == []
    assert plane.store.get_job(job_key("default", "web")).state == JobState.RUNNING  # type: ignore[union-attr]


def test_a_cli_job_keeps_its_name_and_the_resource_is_told_why(plane: ControlPlane, api: FakeResources) -> None:
    cli_job = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
               "metadata": {"name": "web", "namespace": "default"}, "spec": job_spec("redis:7")}
    apply_manifest(plane.store, cli_job, now=1.0)
    api.put("ImagePullJob", "web", job_spec())

    report = sync_resources(plane.store, api, now=10.0)

    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and record.manifest["spec"]["image"] == "redis:7"
    assert len(report.refused) == 1
    message = api.get("ImagePullJob", "web")["status"]["message"]
    assert message.startswith("not applied: imagepulljob default/web was applied with the prewarm CLI")
    assert "observedGeneration" not in api.get("ImagePullJob", "web")["status"]


def test_the_cli_may_neither_apply_over_nor_delete_a_resources_job(plane: ControlPlane, api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    cli_job = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
               "metadata": {"name": "web", "namespace": "default"}, "spec": job_spec("redis:7")}

    with pytest.raises(SourceConflictError, match=r"managed by its ImagePullJob resource .* with kubectl"):
        apply_manifest(plane.store, cli_job, now=20.0)
    with pytest.raises(SourceConflictError, match="managed by its ImagePullJob resource"):
        request_deletion(plane.store, "default", "web", now=20.0)


def test_a_cli_manifest_may_not_claim_to_be_a_resources(plane: ControlPlane) -> None:
    from prewarm.domain.kubernetes import JobValidationError

    forged = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
              "metadata": {"name": "web", "annotations": {SOURCE_ANNOTATION: "resource"}}, "spec": job_spec()}

    with pytest.raises(JobValidationError, match=f"metadata.annotations.{SOURCE_ANNOTATION}: is set by the resource"):
        apply_manifest(plane.store, forged, now=1.0)


def test_an_invalid_resource_is_not_applied_and_its_status_names_the_field(plane: ControlPlane,
                                                                           api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec(image="nginx:1.27", completionPolicy={"type": "Never"},
                                            pullPolicy={"timeoutSeconds": 0}))

    report = sync_resources(plane.store, api, now=10.0)

    assert plane.store.get_job(job_key("default", "web")) is None and len(report.refused) == 1
    assert "spec.pullPolicy.timeoutSeconds" in api.get("ImagePullJob", "web")["status"]["message"]


def test_a_finished_job_removed_by_its_ttl_removes_its_resource_as_kruise_does(plane: ControlPlane,
                                                                              api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    sync_resources(plane.store, api, now=10.0)
    api.get("ImagePullJob", "web")["status"]["completionTime"] = "1970-01-01T00:01:00Z"
    plane.store.delete_job(job_key("default", "web"))  # what the sweep does once the TTL has passed

    report = sync_resources(plane.store, api, now=100.0)

    assert report.expired == ["ImagePullJob default/web"] and report.applied == []
    assert ("imagepulljobs", "default", "web") not in api.objects


def test_rules_come_and_go_with_their_resource(plane: ControlPlane, api: FakeResources) -> None:
    api.put("PrewarmRule", "team-a", {"repositories": ["team-a/*"]}, namespace=None)
    sync_resources(plane.store, api, now=10.0)
    (rule,) = plane.store.list_rules()
    assert source_of(rule) is Source.RESOURCE
    assert api.get("PrewarmRule", "team-a", None)["status"] == {"message": "rule is active", "observedGeneration": 1}

    api.delete_object(API, "prewarmrules", "team-a")
    report = sync_resources(plane.store, api, now=20.0)

    assert report.deleted == ["PrewarmRule team-a"] and plane.store.list_rules() == []


def test_a_list_job_resource_makes_its_image_pull_jobs_and_reports_their_count(plane: ControlPlane,
                                                                              api: FakeResources) -> None:
    api.put("ImageListPullJob", "base", {"images": ["redis:7", "nginx:1.27"], "selector": {"names": ["node-a"]}})

    sync_resources(plane.store, api, now=10.0)

    record = plane.store.get_job(job_key("default", "base"))
    assert record is not None and len(record.children) == 2
    assert api.get("ImageListPullJob", "base")["status"]["desired"] == 2


def test_a_status_changed_meanwhile_is_left_for_the_next_sync(plane: ControlPlane, api: FakeResources) -> None:
    api.put("ImagePullJob", "web", job_spec())
    original = api.replace_status

    def raced(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ClusterConflictError("the object has been modified")

    api.replace_status = raced  # type: ignore[method-assign]
    report = sync_resources(plane.store, api, now=10.0)
    api.replace_status = original  # type: ignore[method-assign]

    assert (report.status_conflicts, report.statuses_written) == (1, 0)
    assert sync_resources(plane.store, api, now=20.0).statuses_written == 1


def test_a_warm_snapshot_resource_is_applied_and_its_status_says_where_its_node_class_stands(
        plane: ControlPlane, api: FakeResources) -> None:
    spec = {"nodeClass": {"ec2NodeClass": "gpu"}, "amiFamily": "Bottlerocket", "rules": ["ml"],
            "builder": {"subnetIds": ["subnet-0123456789abcdef0"]}}
    api.put("WarmSnapshot", "gpu", spec, namespace=None)

    report = sync_resources(plane.store, api, now=10.0)

    assert report.applied == ["WarmSnapshot gpu created"]
    found = plane.store.get_warm_snapshot("gpu")
    assert found is not None and source_of(found[0]) is Source.RESOURCE
    assert api.get("WarmSnapshot", "gpu", namespace=None)["status"] == {
        "stale": False, "message": "no snapshot baked yet", "observedGeneration": 1}
    api.objects.clear()
    assert sync_resources(plane.store, api, now=20.0).deleted == ["WarmSnapshot gpu"]
    assert plane.store.get_warm_snapshot("gpu") is None
def cron_spec(**extra: Any) -> dict[str, Any]:
    return {"schedule": "* * * * *", "template": {"imageListPullJobTemplate": {"spec": {
        "images": ["nginx:1.27"], "parallelism": 0}}}, **extra}


def test_an_advanced_cron_job_resource_is_stored_reports_its_runs_and_goes_with_them(
        plane: ControlPlane, api: FakeResources) -> None:
    from prewarm.services.cron_jobs import run_due

    api.put("AdvancedCronJob", "nightly", cron_spec())
    report = sync_resources(plane.store, api, now=10.0)
    key = job_key("default", "nightly")
    stored = plane.store.get_cron_job(key)
    assert report.applied == ["AdvancedCronJob default/nightly created"]
    assert stored is not None and source_of(stored.manifest) is Source.RESOURCE
    assert api.get("AdvancedCronJob", "nightly")["status"] == {"type": "ImageListPullJob", "observedGeneration": 1}

    run = run_due(plane.store, key, scheduled_at=60.0, now=61.0, objects=lambda: api).run
    sync_resources(plane.store, api, now=62.0)
    assert api.get("AdvancedCronJob", "nightly")["status"] == {
        "type": "ImageListPullJob", "lastScheduleTime": "1970-01-01T00:01:00Z", "observedGeneration": 1,
        "active": [{"apiVersion": API, "kind": "ImageListPullJob", "name": run, "namespace": "default"}]}

    api.delete_object(API, "advancedcronjobs", "nightly", "default")
    report = sync_resources(plane.store, api, now=70.0)
    assert report.deleted == ["AdvancedCronJob default/nightly"]
    assert plane.store.get_cron_job(key) is None
    assert plane.store.get_job(job_key("default", run)).state is JobState.DELETING  # type: ignore[union-attr]
    # Its run's object, which no garbage collector removed here, goes at the next sync, not started again
    report = sync_resources(plane.store, api, now=80.0)
    assert report.deleted == [f"ImageListPullJob default/{run} (a run of a deleted AdvancedCronJob)"]
    assert report.applied == [] and ("imagelistpulljobs", "default", run) not in api.objects


def test_a_cron_job_resource_deleted_with_cascade_orphan_leaves_its_runs_running(
        plane: ControlPlane, api: FakeResources) -> None:
    from prewarm.services.cron_jobs import run_due

    # Given a cron job resource with a run
    api.put("AdvancedCronJob", "nightly", cron_spec())
    sync_resources(plane.store, api, now=10.0)
    run = run_due(plane.store, job_key("default", "nightly"), scheduled_at=60.0, now=61.0, objects=lambda: api).run
    assert run is not None

    # When it is deleted with --cascade=orphan: the garbage collector takes the owner reference off its run
    api.delete_object(API, "advancedcronjobs", "nightly", "default")
    del api.objects[("imagelistpulljobs", "default", run)]["metadata"]["ownerReferences"]
    report = sync_resources(plane.store, api, now=70.0)

    # Then the cron job goes, and its run stays: its object, and its job, running, its status written
    assert report.deleted == ["AdvancedCronJob default/nightly"]
    record = plane.store.get_job(job_key("default", run))
    assert record is not None and record.state is JobState.RUNNING
    report = sync_resources(plane.store, api, now=80.0)
    assert report.deleted == [] and ("imagelistpulljobs", "default", run) in api.objects
    assert api.get("ImageListPullJob", run)["status"]["desired"] == 1


@pytest.mark.parametrize("sync_between", [True, False], ids=["synced-between", "before-the-next-sync"])
def test_a_cron_job_applied_again_after_a_cascade_orphan_delete_does_not_count_the_runs_left_running(
        plane: ControlPlane, api: FakeResources, sync_between: bool) -> None:
    from prewarm.services.cron_jobs import cron_runs, run_due

    # Given a Forbid cron job resource whose run was left running by a delete with --cascade=orphan
    api.put("AdvancedCronJob", "nightly", cron_spec(concurrencyPolicy="Forbid"))
    sync_resources(plane.store, api, now=10.0)
    key = job_key("default", "nightly")
    orphan = run_due(plane.store, key, scheduled_at=60.0, now=61.0, objects=lambda: api).run
    api.delete_object(API, "advancedcronjobs", "nightly", "default")
    del api.objects[("imagelistpulljobs", "default", orphan)]["metadata"]["ownerReferences"]
    if sync_between:
        sync_resources(plane.store, api, now=70.0)
    # When a cron job of that name is applied again (a new object: a new uid, at the same generation), and
    # its first run is due
    api.put("AdvancedCronJob", "nightly", cron_spec(concurrencyPolicy="Forbid"), uid="uid-nightly-again")
    sync_resources(plane.store, api, now=80.0)
    assert cron_runs(plane.store, key, now=81.0) == []
    outcome = run_due(plane.store, key, scheduled_at=120.0, now=121.0, objects=lambda: api)
    # Then the run starts: the old cron job's run, still running, is not this one's (Kruise's controller
    # tells its runs by its owner's uid); and deleting the new one leaves the old run alone
    assert (outcome.run, outcome.skipped) == ("nightly-120", "")
    assert [r.name for r in cron_runs(plane.store, key, now=122.0)] == ["nightly-120"]
    api.delete_object(API, "advancedcronjobs", "nightly", "default")
    sync_resources(plane.store, api, now=130.0)
    kept = plane.store.get_job(job_key("default", orphan))
    assert kept is not None and kept.state is JobState.RUNNING


def test_a_cron_job_resources_runs_are_objects_it_owns_mirrored_and_deleted_as_kruise_does(
        plane: ControlPlane, api: FakeResources) -> None:
    from prewarm.services.cron_jobs import run_due

    api.put("AdvancedCronJob", "nightly", cron_spec(successfulJobsHistoryLimit=0))
    sync_resources(plane.store, api, now=10.0)
    key = job_key("default", "nightly")

    # A run is an ImageListPullJob object the cron job controls, and its job is that resource's
    first = run_due(plane.store, key, scheduled_at=60.0, now=61.0, objects=lambda: api).run
    obj = api.get("ImageListPullJob", first)
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": API, "kind": "AdvancedCronJob", "name": "nightly",
                                                   "uid": "uid-nightly", "controller": True,
                                                   "blockOwnerDeletion": True}]
    assert obj["metadata"]["annotations"]["apps.kruise.io/scheduled-at"] == "1970-01-01T00:01:00Z"
    assert obj["spec"]["images"] == ["nginx:1.27"]
    record = plane.store.get_job(job_key("default", first))
    assert record is not None and record.source is Source.RESOURCE
    # The same time delivered again finds its object: still one run
    assert run_due(plane.store, key, scheduled_at=60.0, now=62.0, objects=lambda: api).run == first

    # The sync finds it unchanged and mirrors its job's status onto it
    report = sync_resources(plane.store, api, now=63.0)
    assert report.applied == [] and "status imagelistpulljobs/" + first in api.calls
    assert api.get("ImageListPullJob", first)["status"]["desired"] == 1

    # Replace deletes the active run's object with its job; the new one is an object too
    second = run_due(plane.store, key, scheduled_at=120.0, now=121.0, objects=lambda: api)
    assert second.replaced == [first] and ("imagelistpulljobs", "default", first) not in api.objects
    assert api.get("ImageListPullJob", second.run)["metadata"]["ownerReferences"][0]["name"] == "nightly"
    assert sync_resources(plane.store, api, now=122.0).applied == []  # the replaced run is not applied again

    # A cron job resource whose object is gone makes no run; without a cluster API none either
    api.delete_object(API, "advancedcronjobs", "nightly", "default")
    assert run_due(plane.store, key, scheduled_at=180.0, now=181.0, objects=lambda: api).skipped == (
        "the cron job's resource is gone")
    assert run_due(plane.store, key, scheduled_at=180.0, now=181.0).skipped.startswith("a cron job resource's runs")


def test_an_advanced_cron_job_the_model_refuses_says_why_in_its_status(plane: ControlPlane,
                                                                       api: FakeResources) -> None:
    api.put("AdvancedCronJob", "zoned", cron_spec(timeZone="Mars/Olympus"))
    report = sync_resources(plane.store, api, now=10.0)
    assert plane.store.list_cron_jobs() == []
    assert report.refused and 'unknown time zone "Mars/Olympus"' in api.get("AdvancedCronJob", "zoned")["status"][
        "message"]
