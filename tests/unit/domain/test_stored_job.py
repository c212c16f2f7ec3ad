"""The stored job's own rules (`domain/job.py`): its plan, whether it is a running `Never` job, its
deadline, when it completes or has finished its round, the pull task a node is sent, and how a new
spec changes its round."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from prewarm.domain.job import UNPLANNED_RETRIGGER_SECONDS, ApiKind, EarlierImage, JobRound, StoredJob
from prewarm.domain.jobs import PIN_ANNOTATION, CompletionType, JobState
from prewarm.domain.placement import Platform
from prewarm.domain.sources import SOURCE_ANNOTATION, Source
from prewarm.domain.status import COMPLETED_MESSAGE, Counters, NodeTaskRecord

T0 = 1_000.0


def pull_manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "nginx:1.25", **spec}}


def list_manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
            "metadata": {"name": "base", "namespace": "shop"},
            "spec": {"images": ["nginx:1.25", "redis:7"], **spec}}


def pull_job(*, planned: bool = True, **fields: Any) -> StoredJob:
    manifest = fields.pop("manifest", pull_manifest())
    job = StoredJob(namespace="shop", name="web", uid="u1", api_kind=ApiKind.IMAGE_PULL_JOB, manifest=manifest,
                    spec_hash="h1", start_time=T0, created_at=T0, **fields)
    return replace(job, planned=job.plan_id) if planned else job


def never_job(**fields: Any) -> StoredJob:
    return pull_job(manifest=pull_manifest(completionPolicy={"type": "Never"}), **fields)


def list_job(**fields: Any) -> StoredJob:
    return StoredJob(namespace="shop", name="base", uid="u2", api_kind=ApiKind.IMAGE_LIST_PULL_JOB,
                     manifest=fields.pop("manifest", list_manifest()), spec_hash="h2", **fields)


# --- identity and plan -----------------------------------------------------------------------------


def test_a_job_round_names_the_job_its_round_and_at_least_one_shard() -> None:
    job = pull_job(round=3, generation=2)
    assert job.key == "shop/web"
    assert job.ref == JobRound("shop/web", "u1", 3, 1)
    assert replace(job, shards=4).ref == JobRound("shop/web", "u1", 3, 4)


def test_a_job_of_a_registered_cluster_and_its_children_are_keyed_by_that_cluster() -> None:
    own, prod = list_job(), list_job(cluster="prod-eu")
    assert (own.key, own.sibling("base-1")) == ("shop/base", "shop/base-1")
    assert (prod.key, prod.sibling("base-1")) == ("prod-eu:shop/base", "prod-eu:shop/base-1")
    assert pull_job(cluster="prod-eu").ref == JobRound("prod-eu:shop/web", "u1", 0, 1)


def test_a_job_is_planned_when_its_last_plan_is_the_one_its_generation_and_round_need() -> None:
    job = pull_job(planned=False, generation=2, round=1)
    assert job.plan_id == "2.1" and not job.is_planned
    assert replace(job, planned="2.1").is_planned
    assert not replace(job, planned="1.1").is_planned


def test_a_keys_parts_are_the_jobs_own_not_parsed_from_its_text() -> None:
    key = pull_job(cluster="prod-eu").key
    assert (key.cluster, key.namespace, key.name) == ("prod-eu", "shop", "web")
    assert list_job().sibling("base-1").name == "base-1" and list_job(cluster="x").sibling("c").cluster == "x"


def test_the_plan_round_is_the_round_of_the_last_plan_made() -> None:
    job = pull_job(planned=False, generation=3, round=2)
    assert job.plan_round is None and not job.round_is_planned
    # A plan of an earlier generation of the same round: the round is planned (a new spec re-plans it)
    assert replace(job, planned="2.2").plan_round == 2 and replace(job, planned="2.2").round_is_planned
    assert replace(job, planned="2.1").plan_round == 1 and not replace(job, planned="2.1").round_is_planned
    assert replace(job, planned="12.10").plan_round == 10
    assert list_job(planned="list").plan_round is None


def test_only_a_running_planned_image_pull_job_is_dispatching() -> None:
    assert pull_job().is_dispatching
    assert not pull_job(planned=False).is_dispatching
    assert not pull_job(state=JobState.COMPLETED).is_dispatching
    list_planned = list_job()
    assert not replace(list_planned, planned=list_planned.plan_id).is_dispatching
    assert pull_job().is_pull_job and not pull_job().is_list_job
    assert list_job().is_list_job and not list_job().is_pull_job


def test_the_stream_asks_for_a_plan_only_for_a_running_image_pull_job_not_yet_planned() -> None:
    unplanned = pull_job(planned=False)
    assert unplanned.needs_planning()
    assert not pull_job().needs_planning()
    assert not replace(unplanned, state=JobState.DELETING).needs_planning()
    assert not list_job().needs_planning()


def test_the_stream_skips_a_change_that_leaves_generation_round_plan_and_state_as_they_were() -> None:
    unplanned = pull_job(planned=False)
    # Reports moved the counters only: the record that asked for the plan retries it
    assert not unplanned.needs_planning(replace(unplanned, counters=Counters(desired=3)))
    # Each of the four, changed, asks again
    assert unplanned.needs_planning(replace(unplanned, generation=0))
    assert unplanned.needs_planning(replace(unplanned, round=1))
    assert unplanned.needs_planning(replace(unplanned, planned="0.0"))
    assert unplanned.needs_planning(replace(unplanned, state=JobState.COMPLETED))


def test_deletion_is_requested_once_when_a_job_enters_deleting() -> None:
    deleting = pull_job(state=JobState.DELETING)
    assert deleting.deletion_requested()
    assert deleting.deletion_requested(pull_job())
    assert not deleting.deletion_requested(deleting)
    assert not pull_job().deletion_requested()


# --- spec --------------------------------------------------------------------------------------------


def test_the_completion_type_is_kruises_default_always_unless_never_is_applied() -> None:
    assert pull_job().completion_type is CompletionType.ALWAYS
    assert pull_job(manifest=pull_manifest(completionPolicy={})).completion_type is CompletionType.ALWAYS
    assert never_job().completion_type is CompletionType.NEVER
    assert never_job().is_never and not pull_job().is_never


def test_a_running_never_job_is_one_that_is_planned_and_running() -> None:
    assert never_job().is_running_never
    assert not never_job(planned=False).is_running_never
    assert not never_job(state=JobState.DELETING).is_running_never
    assert not pull_job().is_running_never


def test_a_list_job_is_never_a_never_job_nor_an_image_pull_job() -> None:
    never_list = list_job(manifest=list_manifest(completionPolicy={"type": "Never"}))
    assert not never_list.is_never
    with pytest.raises(TypeError, match="job shop/base is a ImageListPullJob, not an ImagePullJob"):
        _ = never_list.pull_job


def test_pull_secrets_are_read_as_applied() -> None:
    job = pull_job(manifest=pull_manifest(pullSecrets=["regcred", "other"], pullSecretsOnly=True))
    assert job.pull_secret_names == ["regcred", "other"] and job.pull_secrets_only
    assert pull_job().pull_secret_names == [] and not pull_job().pull_secrets_only
    # A stored manifest with no spec at all (an old item) has none
    bare = pull_job(manifest={"kind": "ImagePullJob"})
    assert bare.pull_secret_names == [] and not bare.pull_secrets_only
    assert bare.completion_type is CompletionType.ALWAYS


def test_the_image_pull_reference_and_source_are_read_as_applied() -> None:
    digest = "sha256:" + "a" * 64
    job = pull_job(manifest=pull_manifest(image=f"nginx:1.25@{digest}"))
    assert job.image == f"nginx:1.25@{digest}"
    assert job.pull_reference == f"docker.io/library/nginx@{digest}"
    assert pull_job().pull_reference == "docker.io/library/nginx:1.25"
    assert list_job().images == ["nginx:1.25", "redis:7"] and list_job().image == ""
    assert pull_job().images == []
    # A manifest with no spec, or a spec of another shape, has neither
    assert pull_job(manifest={"kind": "ImagePullJob"}).image == ""
    assert pull_job(manifest={"kind": "ImagePullJob", "spec": ["image"]}).image == ""
    assert pull_job(manifest={"kind": "ImagePullJob", "spec": {"image": 3, "images": ["a", 4]}}).image == ""
    assert list_job(manifest={"kind": "ImageListPullJob", "spec": {"images": ["a", 4]}}).images == ["a"]
    assert pull_job().parallelism == 1 and pull_job(manifest=pull_manifest(parallelism="5")).parallelism == "5"
    assert list_job(manifest=list_manifest(parallelism=0)).parallelism == 0
    assert pull_job().source is Source.CLI
    resource = {**pull_manifest(), "metadata": {"name": "web", "namespace": "shop",
                                                "annotations": {SOURCE_ANNOTATION: "resource"}}}
    assert pull_job(manifest=resource).source is Source.RESOURCE


def test_a_cancel_names_the_job_its_cluster_the_round_and_why() -> None:
    cancel = pull_job(cluster="prod-eu", round=4).cancel_task("n1", round=3, reason="job deleted")
    assert (cancel.job, cancel.job_uid, cancel.round, cancel.node, cancel.cluster, cancel.reason) == (
        "prod-eu:shop/web", "u1", 3, "n1", "prod-eu", "job deleted")


def test_the_image_platforms_are_known_only_from_a_pushed_index() -> None:
    assert pull_job().image_platforms() is None
    job = pull_job(platforms=[{"os": "linux", "architecture": "arm64", "variant": "v8"},
                              {"os": "linux", "architecture": "amd64"}])
    assert job.image_platforms() == [Platform("linux", "arm64", "v8"), Platform("linux", "amd64", None)]


# --- time --------------------------------------------------------------------------------------------


def test_the_deadline_counts_from_the_rounds_start() -> None:
    job = pull_job(manifest=pull_manifest(completionPolicy={"activeDeadlineSeconds": 600}))
    assert job.deadline == T0 + 600
    assert not job.is_past_deadline(T0 + 600) and job.is_past_deadline(T0 + 600.5)
    assert replace(job, start_time=None).deadline is None
    assert pull_job().deadline is None and not pull_job().is_past_deadline(T0 + 10**9)


def test_a_job_unplanned_long_after_it_was_stored_lost_its_stream_record() -> None:
    unplanned = pull_job(planned=False)
    assert not unplanned.is_unplanned_for_long(T0 + UNPLANNED_RETRIGGER_SECONDS)
    assert unplanned.is_unplanned_for_long(T0 + UNPLANNED_RETRIGGER_SECONDS + 1)
    assert not pull_job().is_unplanned_for_long(T0 + 10**6)
    assert not replace(unplanned, state=JobState.COMPLETED).is_unplanned_for_long(T0 + 10**6)
    # An item without a creation time is taken as just stored
    assert not replace(unplanned, created_at=None).is_unplanned_for_long(T0 + 10**6)


def test_a_parked_job_awaits_its_plan_whatever_its_age_and_a_later_plan_is_not_parked() -> None:
    unplanned = pull_job(planned=False)
    parked = replace(unplanned, parked=unplanned.plan_id)
    # Parked: its current plan waits for its cluster, from the first second
    assert parked.is_parked and parked.awaits_plan(T0)
    # Not parked: unplanned but fresh, a later round's plan, planned, finished, or not an ImagePullJob
    assert not unplanned.is_parked and not unplanned.awaits_plan(T0)
    assert unplanned.awaits_plan(T0 + UNPLANNED_RETRIGGER_SECONDS + 1)
    later = replace(parked, round=parked.round + 1)
    assert not later.is_parked and not later.awaits_plan(T0)
    planned = pull_job()
    assert not replace(planned, parked=planned.plan_id).is_parked
    assert not replace(parked, state=JobState.COMPLETED).is_parked
    assert not replace(parked, state=JobState.COMPLETED).awaits_plan(T0 + 10**6)
    listed = list_job(parked="x")
    assert not listed.awaits_plan(T0 + 10**6)


def test_the_plan_after_a_parked_one_is_asked_again_after_park_and_no_other() -> None:
    parked = replace(pull_job(planned=False, generation=2), parked="2.0")
    # Asked to plan again (its cluster answered): the plan before this one was parked
    assert parked.replanned().asked_again_after_park and not parked.asked_again_after_park
    # A new round, a plan two generations on, or a job never parked: not
    assert not replace(parked.replanned(), round=1).asked_again_after_park
    assert not parked.replanned().replanned().asked_again_after_park
    assert not pull_job(planned=False, generation=3).asked_again_after_park


def test_a_job_is_settled_when_it_is_not_dispatching_or_holds_no_node_waiting_or_in_flight() -> None:
    assert pull_job(counters=Counters(desired=3, succeeded=3)).is_settled
    assert not pull_job(counters=Counters(desired=3, waiting=1, succeeded=2)).is_settled
    assert not pull_job(counters=Counters(desired=3, active=1, succeeded=2)).is_settled
    assert pull_job(planned=False, counters=Counters(desired=3, active=1)).is_settled
    assert pull_job(state=JobState.COMPLETED, counters=Counters(desired=3, waiting=1)).is_settled


# --- finishing ---------------------------------------------------------------------------------------


def test_finishing_sets_state_time_message_and_the_ttl_the_spec_asks_for() -> None:
    assert pull_job().finish_fields(JobState.FAILED, at=T0) == {"state": JobState.FAILED, "completion_time": T0}
    ttl = pull_job(manifest=pull_manifest(completionPolicy={"ttlSecondsAfterFinished": 300}))
    assert ttl.finish_fields(JobState.COMPLETED, at=T0 + 0.7, message="done") == {
        "state": JobState.COMPLETED, "completion_time": T0 + 0.7, "message": "done", "ttl": int(T0) + 300,
    }


def test_an_always_job_completes_when_every_node_has_finished() -> None:
    running = pull_job(counters=Counters(desired=3, active=1, succeeded=1, failed=1))
    assert running.completion(T0 + 5) is None
    done = pull_job(counters=Counters(desired=3, succeeded=2, failed=1))
    assert done.completion(T0 + 5) == {"state": JobState.COMPLETED, "completion_time": T0 + 5,
                                       "message": COMPLETED_MESSAGE}
    # A job with no node at all is done at once
    assert pull_job(counters=Counters()).completion(T0) is not None


def test_a_never_job_or_one_not_dispatching_does_not_complete() -> None:
    finished = Counters(desired=1, succeeded=1)
    assert never_job(counters=finished).completion(T0) is None
    assert pull_job(planned=False, counters=finished).completion(T0) is None
    assert pull_job(state=JobState.FAILED, counters=finished).completion(T0) is None


def test_a_list_job_completes_when_all_its_images_jobs_have_and_expires_after_the_last() -> None:
    job = list_job(manifest=list_manifest(completionPolicy={"ttlSecondsAfterFinished": 60}))
    child_done = replace(pull_job(), state=JobState.COMPLETED, completion_time=T0 + 10)
    child_failed = replace(pull_job(), state=JobState.FAILED, completion_time=T0 + 30)
    assert job.list_completion([child_done, child_failed], now=T0 + 100) == {
        "state": JobState.COMPLETED, "completion_time": T0 + 30, "ttl": int(T0 + 30) + 60}
    # A child gone counts as finished; a child finished without a time, as finished now
    assert job.list_completion([None, replace(child_done, completion_time=None)], now=T0 + 100) == {
        "state": JobState.COMPLETED, "completion_time": T0 + 100, "ttl": int(T0 + 100) + 60}
    assert job.list_completion([None], now=T0 + 100)["completion_time"] == T0 + 100  # type: ignore[index]


def test_a_list_job_with_a_running_child_no_children_or_already_finished_does_not_complete() -> None:
    job = list_job()
    child_done = replace(pull_job(), state=JobState.COMPLETED, completion_time=T0)
    assert job.list_completion([child_done, pull_job()], now=T0) is None
    assert job.list_completion([], now=T0) is None
    assert replace(job, state=JobState.COMPLETED).list_completion([child_done], now=T0) is None


def test_a_job_has_finished_its_round_when_it_completed_or_a_never_jobs_nodes_all_finished() -> None:
    assert pull_job(state=JobState.COMPLETED).has_finished_round()
    assert pull_job(completion_time=T0).has_finished_round()
    assert not pull_job(counters=Counters(desired=1, succeeded=1)).has_finished_round()
    assert never_job(counters=Counters(desired=2, succeeded=1, failed=1)).has_finished_round()
    assert not never_job(counters=Counters(desired=2, waiting=1, succeeded=1)).has_finished_round()
    assert not never_job(counters=Counters(desired=2, active=1, succeeded=1)).has_finished_round()
    assert not never_job(counters=Counters(desired=3, waiting=1, active=1, succeeded=1)).has_finished_round()
    assert not never_job(planned=False, counters=Counters()).has_finished_round()


# --- tasks -------------------------------------------------------------------------------------------


def test_a_pull_task_carries_the_jobs_image_policies_deadline_sandbox_and_secrets() -> None:
    job = pull_job(
        round=2, pull_secret_arns=["arn:aws:secretsmanager:us-east-1:1:secret:a"],
        manifest=pull_manifest(
            image="nginx:1.25", imagePullPolicy="Always", pullPolicy={"timeoutSeconds": 60, "backoffLimit": 1},
            completionPolicy={"activeDeadlineSeconds": 900}, pullSecretsOnly=True, pullSecrets=["regcred"],
            sandboxConfig={"labels": {"team": "web"}, "annotations": {"note": "x"}},
        ),
    )
    job = replace(job, planned=job.plan_id)
    task = job.pull_task("n1")
    assert (task.job, task.job_uid, task.round, task.node, task.cluster) == ("shop/web", "u1", 2, "n1", "")
    assert replace(job, cluster="prod-eu").pull_task("n1").cluster == "prod-eu"
    assert (task.image, task.image_pull_policy) == ("docker.io/library/nginx:1.25", "Always")
    assert (task.timeout_seconds, task.backoff_limit, task.deadline) == (60, 1, T0 + 900)
    assert (task.sandbox_labels, task.sandbox_annotations) == ({"team": "web"}, {"note": "x"})
    assert task.pull_secret_arns == ["arn:aws:secretsmanager:us-east-1:1:secret:a"] and task.pull_secrets_only
    assert not task.pin


def test_a_task_sent_again_keeps_the_start_its_node_item_recorded_and_says_where_that_item_is() -> None:
    job = replace(pull_job(), shards=4)
    tasks = [NodeTaskRecord("n1", 0, dispatched_at=T0, starts_at=T0 + 600), NodeTaskRecord("n2", 0, dispatched_at=T0)]

    resent = job.resend_tasks(tasks)

    assert [(t.node, t.reserved_start, t.shards) for t in resent] == [("n1", T0 + 600, 4), ("n2", None, 4)]
    assert job.pull_task("n1").shards == 4 and replace(job, shards=0).pull_task("n1").shards == 1
    assert "reserved_start" not in resent[0].model_dump() and "shards" not in resent[0].model_dump()


def test_a_pull_task_without_a_sandbox_config_has_empty_sandbox_fields() -> None:
    task = pull_job(manifest=pull_manifest(sandboxConfig={"labels": {"a": "b"}})).pull_task("n1")
    assert (task.sandbox_labels, task.sandbox_annotations) == ({"a": "b"}, {})
    plain = pull_job().pull_task("n1")
    assert (plain.sandbox_labels, plain.sandbox_annotations, plain.deadline) == ({}, {}, None)
    assert not plain.pin and not plain.pull_secrets_only


def test_a_pinned_jobs_pull_task_asks_the_agent_to_pin_the_image() -> None:
    manifest = {**pull_manifest(), "metadata": {"name": "web", "namespace": "shop",
                                                "annotations": {"prewarm.dev/pin": "true"}}}
    assert pull_job(manifest=manifest).pull_task("n1").pin
    assert [t.node for t in pull_job().pull_tasks(["a", "b"])] == ["a", "b"]


# --- applying a new spec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"image": "nginx:1.26"}, {"imagePullPolicy": "Always"}, {"pullPolicy": {"backoffLimit": 1}},
     {"pullSecrets": ["regcred"]}, {"pullSecretsOnly": True}, {"sandboxConfig": {"labels": {"a": "b"}}}],
)
def test_a_change_of_what_is_pulled_starts_a_new_round(change: dict[str, Any]) -> None:
    job = pull_job(round=1, generation=3)
    changed = job.respecified(pull_manifest(**change), "h2", now=T0 + 50, platforms=None)
    assert (changed.round, changed.generation, changed.spec_hash) == (2, 4, "h2")
    assert changed.manifest == pull_manifest(**change) and not changed.is_planned


def test_any_other_change_replans_the_current_round_and_keeps_or_replaces_the_platforms() -> None:
    job = pull_job(round=1, generation=3, platforms=[{"os": "linux", "architecture": "amd64"}])
    changed = job.respecified(pull_manifest(parallelism=5), "h2", now=T0 + 50, platforms=None)
    assert (changed.round, changed.generation) == (1, 4)
    assert changed.platforms == [{"os": "linux", "architecture": "amd64"}]
    arm = [{"os": "linux", "architecture": "arm64"}]
    assert job.respecified(pull_manifest(parallelism=5), "h2", now=T0, platforms=arm).platforms == arm
    assert job.respecified(pull_manifest(parallelism=5), "h2", now=T0, platforms=[]).platforms == []


def test_a_new_spec_keeps_the_image_s_layer_count_unless_a_push_gives_one() -> None:
    job = pull_job(round=1, layers=12)
    assert job.respecified(pull_manifest(parallelism=5), "h2", now=T0, platforms=None).layers == 12
    assert job.respecified(pull_manifest(parallelism=5), "h2", now=T0, platforms=None, layers=30).layers == 30
    assert job.respecified(pull_manifest(parallelism=5), "h2", now=T0, platforms=None, layers=0).layers == 0
    assert pull_job(round=1).respecified(pull_manifest(), "h2", now=T0, platforms=None).layers is None


def test_a_task_carries_the_image_s_layer_count_for_its_registry_s_budget() -> None:
    assert pull_job(layers=12).pull_task("n1").layers == 12
    assert pull_job().pull_task("n1").layers is None


def test_a_running_job_respecified_keeps_its_state_and_times() -> None:
    job = pull_job(message="job is running, progress 50.0%")
    changed = job.respecified(pull_manifest(image="nginx:1.26"), "h2", now=T0 + 50, platforms=None)
    assert (changed.state, changed.start_time, changed.message) == (JobState.RUNNING, T0, job.message)


def test_a_finished_job_respecified_runs_again_from_now_on_a_new_round() -> None:
    done = pull_job(state=JobState.COMPLETED, completion_time=T0 + 10, message=COMPLETED_MESSAGE, ttl=99)
    again = done.respecified(pull_manifest(image="nginx:1.26"), "h2", now=T0 + 50, platforms=None)
    assert (again.state, again.completion_time, again.message, again.ttl) == (JobState.RUNNING, None, "", None)
    assert again.start_time == T0 + 50
    # Re-planned in the same round, it keeps the round's start (its deadline runs on)
    replanned = done.respecified(pull_manifest(parallelism=2), "h2", now=T0 + 50, platforms=None)
    assert replanned.state is JobState.RUNNING and replanned.start_time == T0


def test_a_new_image_leaves_the_planned_rounds_image_as_the_earlier_one() -> None:
    pinned = pull_manifest()
    pinned["metadata"]["annotations"] = {"prewarm.dev/pin": "true"}
    job = pull_job(round=1, generation=3, manifest=pinned)
    changed = job.respecified(pull_manifest(image="nginx:1.26"), "h2", now=T0, platforms=None)
    assert changed.earlier == EarlierImage(1, "docker.io/library/nginx:1.25", pinned=True)
    # the node items of round 1 hold nginx:1.25; those of round 2 (and later) the current spec's image
    assert changed.image_of_round(1) == changed.earlier
    assert changed.image_of_round(2) == EarlierImage(2, "docker.io/library/nginx:1.26", pinned=False)
    assert job.image_of_round(1) == EarlierImage(1, "docker.io/library/nginx:1.25", pinned=True)
    # another new image before round 2's plan: round 1's items still hold nginx:1.25
    again = changed.respecified(pull_manifest(image="nginx:1.27"), "h3", now=T0, platforms=None)
    assert again.earlier == changed.earlier and again.round == 3


def test_no_earlier_image_without_a_change_of_image_or_before_any_plan() -> None:
    job = pull_job(round=1)
    assert job.respecified(pull_manifest(imagePullPolicy="Always"), "h2", now=T0, platforms=None).earlier is None
    assert job.respecified(pull_manifest(parallelism=3), "h2", now=T0, platforms=None).earlier is None
    unplanned = pull_job(round=1, planned=False)
    assert unplanned.respecified(pull_manifest(image="nginx:1.26"), "h2", now=T0, platforms=None).earlier is None
    assert pull_job().image_of_round(0) == EarlierImage(0, "docker.io/library/nginx:1.25")


def test_the_earlier_image_is_stored_as_json_and_read_back() -> None:
    earlier = EarlierImage(4, "reg.io/app:v1", pinned=True)
    assert EarlierImage.from_json(earlier.to_json()) == earlier
    assert EarlierImage.from_json(None) is None and EarlierImage.from_json("") is None


def test_a_replanned_job_is_the_same_spec_at_the_next_generation() -> None:
    job = pull_job(generation=4, round=2)
    again = job.replanned()
    assert (again.generation, again.round, again.manifest) == (5, 2, job.manifest) and not again.is_planned


def test_a_new_job_has_no_seeds_and_no_first_estimate_until_its_plan_and_progress_give_them() -> None:
    job = pull_job(planned=False)
    assert (job.seeds, job.first_estimate) == ([], "")
    assert not job.seeds and not job.first_estimate


def pinned(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "annotations": {PIN_ANNOTATION: "true"}}}


def test_a_dropped_pin_is_remembered_for_the_round_whose_tasks_went_out_pinned() -> None:
    job = pull_job(manifest=pinned(pull_manifest()), round=2)
    # A pin dropped from a planned round: that round's pulls may still pin
    dropped = job.respecified(pull_manifest(), "h2", now=T0, platforms=None)
    assert dropped.pinned_until == 2 and dropped.pinned_in(2) and not dropped.image_of_round(2).pinned
    # kept through later changes and rounds: a late pull of round 2 may have pinned a node of any later round
    later = replace(dropped, planned=dropped.plan_id).respecified(pull_manifest(imagePullPolicy="Always"), "h3",
                                                                   now=T0, platforms=None)
    assert later.pinned_until == 2 and later.round == 3 and later.pinned_in(3)
    assert not pull_job(round=3).pinned_in(3)
    # the pin applied again: the spec pins, nothing to remember
    assert dropped.respecified(pinned(pull_manifest()), "h4", now=T0, platforms=None).pinned_until is None
    # a round never planned sent no pinned task
    unplanned = pull_job(manifest=pinned(pull_manifest()), planned=False)
    assert unplanned.respecified(pull_manifest(), "h2", now=T0, platforms=None).pinned_until is None
    # and through a second new round: still the round that went out pinned, not the one before the change
    latest = replace(later, planned=later.plan_id).respecified(pull_manifest(imagePullPolicy="IfNotPresent"),
                                                               "h5", now=T0, platforms=None)
    assert (latest.round, latest.pinned_until) == (4, 2)


def test_a_round_is_pinned_as_its_own_image_was_when_no_pin_was_dropped() -> None:
    # Given an unpinned image pulled in round 1, then another image pinned from round 2
    job = pull_job(round=1).respecified(pinned(pull_manifest(image="nginx:1.26")), "h2", now=T0, platforms=None)
    assert job.pinned_until is None and job.earlier == EarlierImage(1, "docker.io/library/nginx:1.25", False)
    # Then round 1's nodes hold it unpinned, round 2's pinned
    assert not job.pinned_in(1) and job.pinned_in(2)


def test_a_task_carries_the_image_bytes_its_plan_read_and_a_new_image_forgets_them() -> None:
    job = pull_job(image_bytes=7_000_000)
    assert job.pull_task("n1").size_bytes == 7_000_000
    assert pull_job().pull_task("n1").size_bytes is None
    # the same image under another pull policy keeps its size; another image's size is read again
    assert job.respecified(pull_manifest(imagePullPolicy="Always"), "h2", now=T0, platforms=None).image_bytes \
        == 7_000_000
    assert job.respecified(pull_manifest(image="nginx:1.26"), "h2", now=T0, platforms=None).image_bytes is None
