"""Bakes as the events drive them (prewarm.services.bakes), on the in-memory store with fakes of EC2 and
the node classes: each fault ends with a clear reason and the node class untouched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from prewarm.domain.bakes import BakeStep, SnapshotState
from prewarm.domain.launch_sources import Architecture
from prewarm.domain.messages import Baked
from prewarm.domain.push import ImagePush
from prewarm.services import bakes
from prewarm.services.bakes import BakeContext
from prewarm_cli.snapshot_output import status_word
from tests.support.bakes import (
    D1,
    D2,
    D3,
    HOST,
    REF,
    FakeEc2,
    FakeNodeClasses,
    builder_reports,
    context,
    declare,
    manifest,
    push,
    state,
)


def test_a_push_bakes_and_the_snapshot_event_points_the_node_class_at_it() -> None:
    ctx, ec2, classes = context(fastSnapshotRestore={"availabilityZones": ["us-west-2a"]})
    push(ctx, D1, 10.0)
    assert ec2.instances == {"i-gpu-1": "running"}
    builder_reports(ctx, D1, 20.0)
    assert ec2.instances["i-gpu-1"] == "stopped" and state(ctx).bake.snapshot_id == "snap-1"  # type: ignore[union-attr]
    assert bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0) == "gpu"
    assert classes.pointed["gpu"] == "snap-1"
    assert ec2.calls[-3:] == [f"tag snap-1 {{'{REF}': '{D1}'}}", "fsr snap-1 ['us-west-2a']", "terminate i-gpu-1"]
    done = state(ctx)
    assert done.bake is not None and done.bake.step is BakeStep.SUCCEEDED and not done.stale
    assert bakes.on_snapshot_event(ctx, "snap-1", True, "", 31.0) == "gpu"  # repeated: nothing more
    assert state(ctx) == done
    push(ctx, D2, 40.0)
    builder_reports(ctx, D2, 50.0)
    bakes.on_snapshot_event(ctx, "snap-2", True, "", 60.0)
    assert "no fsr snap-1" in ec2.calls and classes.pointed["gpu"] == "snap-2"


def test_a_push_during_a_bake_is_coalesced_into_the_next_bake_of_the_newest_set() -> None:
    ctx, ec2, _classes = context()
    push(ctx, D1, 10.0)
    push(ctx, D2, 11.0)
    push(ctx, D3, 12.0)
    assert [c for c in ec2.calls if c.startswith("launch")] == ["launch gpu-1"]
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    bakes.advance(ctx, "gpu", 31.0)  # the stream's record of the write above
    after = state(ctx)
    assert after.current is not None and after.current.digests == {REF: D1} and after.stale
    assert after.bake is not None and after.bake.id == "gpu-2" and after.bake.images == {REF: D3}
    assert [c for c in ec2.calls if c.startswith("launch")] == ["launch gpu-1", "launch gpu-2"]


def test_a_node_class_that_does_not_exist_fails_the_bake_before_any_builder() -> None:
    ctx, ec2, classes = context(nodeClass={"ec2NodeClass": "missing"})
    push(ctx, D1, 10.0)
    bake = state(ctx).bake
    assert bake is not None and bake.step is BakeStep.FAILED and bake.reason == "EC2NodeClass missing does not exist"
    assert ec2.instances == {} and classes.pointed == {"gpu": ""}


def test_a_builder_refused_by_ecr_ends_the_bake_and_terminates_it() -> None:
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0, ok=False, message=f"{REF}: 403 Forbidden")
    bake = state(ctx).bake
    assert bake is not None and bake.step is BakeStep.FAILED
    assert bake.reason == f"the builder failed: {REF}: 403 Forbidden"
    assert ec2.instances["i-gpu-1"] == "terminated" and classes.pointed["gpu"] == "" and ec2.snapshots == {}


def test_a_failed_snapshot_keeps_the_node_class_on_its_last_good_one() -> None:
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    push(ctx, D2, 40.0)
    builder_reports(ctx, D2, 50.0)
    bakes.on_snapshot_event(ctx, "snap-2", False, "IncorrectState", 60.0)
    after = state(ctx)
    assert after.bake is not None and after.bake.reason == "snapshot snap-2 failed: IncorrectState"
    assert classes.pointed["gpu"] == "snap-1" and after.current is not None and after.current.id == "snap-1"
    assert "snap-2" not in ec2.snapshots and ec2.instances["i-gpu-2"] == "terminated"


def test_a_bake_interrupted_after_its_snapshot_completed_is_resumed_by_the_sweep() -> None:
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    ec2.snapshots["snap-1"] = ("gpu", "gpu-1", "completed")  # its event was lost
    assert bakes.sweep(ctx, 30.0) == ["gpu: bake gpu-1 resumed at its completed snapshot snap-1"]
    assert classes.pointed["gpu"] == "snap-1" and state(ctx).bake.step is BakeStep.SUCCEEDED  # type: ignore[union-attr]


def test_a_launch_interrupted_before_it_was_recorded_is_launched_again_once() -> None:
    ctx, ec2, _classes = context()
    ec2.refuse = "InsufficientInstanceCapacity"
    push(ctx, D1, 10.0)
    assert state(ctx).bake.reason.endswith("InsufficientInstanceCapacity")  # type: ignore[union-attr]
    ec2.refuse = ""
    push(ctx, D2, 20.0)
    assert bakes.sweep(ctx, 21.0) == []  # nothing left to do: the new bake launched on the push
    assert ec2.instances == {"i-gpu-2": "running"}
    # RunInstances answered but its record was lost: the bake is still Launching, and goes on with the same
    # bake id (RunInstances' client token), not a second builder.
    found = ctx.store.get_warm_snapshot("gpu")
    assert found is not None
    recorded = SnapshotState.from_dict(found[1])
    assert recorded.bake is not None and recorded.bake.step is BakeStep.PULLING
    lost = replace(recorded.bake, steps=recorded.bake.steps[:1], instance_id="", volume_id="")
    ctx.store.save_snapshot_state("gpu", replace(recorded, bake=lost).to_dict(), found[2])
    assert bakes.sweep(ctx, 22.0) == ["gpu: bake gpu-2 launched"]
    assert [c for c in ec2.calls if c.startswith("launch")] == ["launch gpu-2", "launch gpu-2"]
    assert ec2.instances == {"i-gpu-2": "running"}
    relaunched = state(ctx).bake
    assert relaunched is not None and relaunched.step is BakeStep.PULLING and relaunched.instance_id == "i-gpu-2"


def test_the_sweep_fails_a_bake_past_its_budget_and_terminates_builders_no_bake_owns() -> None:
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    ec2.instances["i-old-7"] = "running"
    ec2.launched_at["i-old-7"] = 0.0
    done = bakes.sweep(ctx, 700.0)
    assert done[0] == "gpu: bake gpu-1 failed at Pulling, past its 600 s budget"
    assert "terminated builder i-old-7 of old-7: past its time budget" in done
    assert ec2.instances == {"i-gpu-1": "terminated", "i-old-7": "terminated"}
    assert classes.pointed["gpu"] == ""


def test_an_image_dropped_from_the_spec_is_not_baked_again() -> None:
    busybox = "docker.io/library/busybox:1"
    ctx, _ec2, _classes = context(images=[busybox])
    push(ctx, D1, 10.0)
    assert state(ctx).images == {REF: D1, busybox: None}
    found = ctx.store.get_warm_snapshot("gpu")
    assert found is not None
    manifest = {**found[0], "spec": {**found[0]["spec"], "images": []}}
    ctx.store.put_warm_snapshot("gpu", manifest, "h2")
    bakes.advance(ctx, "gpu", 11.0)
    assert state(ctx).images == {REF: D1}
    # The running bake bakes what it started with; the next one leaves busybox out.
    bakes.record_baked(ctx.store, Baked(warm_snapshot="gpu", bake="gpu-1", ok=True, image_bytes=1,
                                        digests={REF: D1, busybox: D3}), 20.0)
    bakes.advance(ctx, "gpu", 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    assert state(ctx).current.digests == {REF: D1, busybox: D3}  # type: ignore[union-attr]
    push(ctx, D2, 40.0)
    assert state(ctx).bake.images == {REF: D2}  # type: ignore[union-attr]


def test_a_push_without_a_tag_starts_no_bake_unless_the_spec_pins_that_digest() -> None:
    pinned = f"{HOST}/ml/trainer@{D2}"
    ctx, ec2, _classes = context(images=[pinned])
    untagged = ImagePush("123456789012", "us-west-2", "ml/trainer", D1, None)
    assert bakes.record_push(ctx.store, untagged, ["ml"], 10.0) == []
    assert state(ctx).images == {}
    pinned_push = ImagePush("123456789012", "us-west-2", "ml/trainer", D2, None)
    assert bakes.record_push(ctx.store, pinned_push, ["ml"], 11.0) == ["gpu"]
    assert state(ctx).images == {pinned: D2}
    bakes.advance(ctx, "gpu", 11.0)
    assert state(ctx).bake.images == {pinned: D2} and ec2.instances == {"i-gpu-1": "running"}  # type: ignore[union-attr]


def test_the_builder_launches_from_the_node_classs_ami_and_subnets_unless_the_spec_overrides_them() -> None:
    ctx, ec2, _classes = context(builder={"timeBudgetSeconds": 600})
    push(ctx, D1, 10.0)
    assert ec2.sources["gpu-1"] == ("resolve:ssm:/aws/service/Bottlerocket", "subnet-0000000000000000a")
    ctx, ec2, classes = context(builder={"imageId": "ami-0123456789abcdef0"})
    classes.amis["ami-0123456789abcdef0"] = Architecture.X86_64
    push(ctx, D1, 10.0)
    assert ec2.sources["gpu-1"] == ("ami-0123456789abcdef0", "subnet-0000000000000000a")
    ctx, ec2, classes = context(builder={"imageId": "ami-0123456789abcdef0", "subnetIds": ["subnet-0123456789abcdef0"]})
    classes.unreadable = "not read: the spec names both"
    classes.amis["ami-0123456789abcdef0"] = Architecture.X86_64
    push(ctx, D1, 10.0)
    assert ec2.sources["gpu-1"] == ("ami-0123456789abcdef0", "subnet-0123456789abcdef0")


def test_a_node_class_whose_launch_source_cannot_be_read_fails_the_bake_before_any_builder() -> None:
    ctx, ec2, classes = context(builder={})
    classes.unreadable = "EC2NodeClass gpu: its subnetSelectorTerms select no subnet"
    push(ctx, D1, 10.0)
    bake = state(ctx).bake
    assert bake is not None and bake.step is BakeStep.FAILED and ec2.instances == {}
    assert bake.reason == ("the builder could not be launched: EC2NodeClass gpu: its subnetSelectorTerms select "
                           "no subnet")


def test_a_builder_killed_before_its_report_fails_the_bake_at_the_next_sweep_not_its_budget() -> None:
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    push(ctx, D2, 40.0)
    assert bakes.sweep(ctx, 41.0) == []  # running: nothing to do
    ec2.instances["i-gpu-2"] = "terminated"  # killed (a spot reclaim, an operator)
    assert bakes.sweep(ctx, 50.0) == ["gpu: bake gpu-2 failed: its builder is terminated"]
    failed = state(ctx)
    assert failed.bake is not None and failed.bake.step is BakeStep.FAILED
    assert failed.bake.reason == "builder i-gpu-2 was terminated before it reported its images"
    assert classes.pointed["gpu"] == "snap-1" and failed.current is not None and failed.current.id == "snap-1"
    assert bakes.sweep(ctx, 60.0) == []  # the same set is not retried ...
    push(ctx, D3, 70.0)  # ... the next push is
    assert state(ctx).bake.id == "gpu-3" and ec2.instances["i-gpu-3"] == "running"  # type: ignore[union-attr]


def test_an_arm64_node_classs_builder_runs_on_graviton_and_a_spec_type_of_another_architecture_fails_the_bake(
) -> None:
    # Given a node class whose AMI is arm64 (the spec names no AMI: the node class's is taken)
    ctx, ec2, classes = context(builder={"subnetIds": ["subnet-0123456789abcdef0"]})
    classes.architecture = Architecture.ARM64

    # When a push bakes it, the builder is a Graviton instance
    push(ctx, D1, 10.0)
    assert ec2.instance_types == ["m7g.large"]

    # And a spec naming an x86_64 instance type fails its bake before any builder, saying why
    ctx, ec2, classes = context(builder={"subnetIds": ["subnet-0123456789abcdef0"], "instanceType": "m6i.xlarge"})
    classes.architecture = Architecture.ARM64
    push(ctx, D1, 10.0)
    bake = state(ctx).bake
    assert bake is not None and bake.step is BakeStep.FAILED and ec2.instance_types == []
    assert bake.reason == ('the builder could not be launched: spec.builder.instanceType "m6i.xlarge" runs x86_64, '
                           "but the node class's AMI is arm64: name a Graviton arm64 type or leave it out")


@pytest.mark.parametrize(("instance_type", "launched"), [(None, "m7g.large"), ("m7g.xlarge", "m7g.xlarge")])
def test_a_builder_on_the_specs_own_arm64_ami_runs_on_graviton_without_reading_the_node_class(
        instance_type: str | None, launched: str) -> None:
    # Given a spec naming an arm64 AMI and the subnets (the node class, x86_64 here, is not read)
    builder = {"imageId": "ami-0123456789abcdef0", "subnetIds": ["subnet-0123456789abcdef0"]}
    ctx, ec2, classes = context(builder={**builder, **({"instanceType": instance_type} if instance_type else {})})
    classes.unreadable = "not read: the spec names both"
    classes.amis["ami-0123456789abcdef0"] = Architecture.ARM64

    # When a push bakes it, Then the builder is a Graviton instance on that AMI
    push(ctx, D1, 10.0)
    assert ec2.instance_types == [launched] and ec2.sources["gpu-1"][0] == "ami-0123456789abcdef0"

    # And an x86_64 type for it fails the bake before any builder, naming whose AMI it is
    ctx, ec2, classes = context(builder={**builder, "instanceType": "m6i.large"})
    classes.amis["ami-0123456789abcdef0"] = Architecture.ARM64
    push(ctx, D1, 10.0)
    assert ec2.instance_types == [] and state(ctx).bake.reason == (  # type: ignore[union-attr]
        'the builder could not be launched: spec.builder.instanceType "m6i.large" runs x86_64, but '
        "spec.builder.imageId's AMI is arm64: name a Graviton arm64 type or leave it out")


def published_twice(**spec: Any) -> tuple[BakeContext, FakeEc2, FakeNodeClasses]:
    """snap-1 baked and published, then snap-2 baked: its snapshot event is next."""
    ctx, ec2, classes = context(**spec)
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    push(ctx, D2, 40.0)
    builder_reports(ctx, D2, 50.0)
    return ctx, ec2, classes


@pytest.mark.parametrize(("spec", "fault", "error", "done"), [
    ({"fastSnapshotRestore": {"availabilityZones": ["us-west-2a"]}}, "no fsr snap-1",
     "Fast Snapshot Restore of snap-1 not disabled: UnauthorizedOperation",
     "Fast Snapshot Restore of snap-1 disabled"),
    ({"keep": 1}, "delete snap-1", "snap-1 not deleted: UnauthorizedOperation", "snap-1 deleted"),
], ids=["fsr-disable", "delete-beyond-keep"])
def test_a_clean_up_that_fails_after_the_publish_is_recorded_and_retried_by_the_sweep_never_undoing_it(
        spec: dict[str, Any], fault: str, error: str, done: str) -> None:
    # Given a second bake whose clean-up of snap-1 EC2 refuses
    ctx, ec2, classes = published_twice(**spec)
    ec2.faults[fault] = "UnauthorizedOperation"

    # When its snapshot completes, Then the publish is recorded: the node class and the record agree on snap-2
    bakes.on_snapshot_event(ctx, "snap-2", True, "", 60.0)
    bakes.advance(ctx, "gpu", 60.0)  # the stream's record of it: the sweep's to retry, not the stream's
    after = state(ctx)
    assert classes.pointed == {"gpu": "snap-2"} and after.current is not None and after.current.id == "snap-2"
    assert after.bake is not None and after.bake.step is BakeStep.SUCCEEDED and ec2.instances["i-gpu-2"] == "terminated"
    # And the failed step is said, where the bake's errors are
    assert after.clean_up.error == error and f"clean-up owed (the sweep retries): {error}" in after.message()
    assert ec2.calls.count(fault) == 0 and "snap-2" in ec2.snapshots

    # When the sweeps run past the bake's budget while EC2 still refuses, Then snap-2 stays, the class on it
    assert bakes.sweep(ctx, 1000.0) == []
    assert classes.pointed == {"gpu": "snap-2"} and "snap-2" in ec2.snapshots and state(ctx).current == after.current

    # And once EC2 accepts, the next sweep cleans up, once
    del ec2.faults[fault]
    assert bakes.sweep(ctx, 1060.0) == [f"gpu: clean-up: {done}"]
    cleaned = state(ctx)
    assert not cleaned.clean_up.owed and cleaned.clean_up.error == "" and "clean-up" not in cleaned.message()
    assert bakes.sweep(ctx, 1120.0) == [] and ec2.calls.count(fault) == 1


def test_a_bake_past_its_budget_never_deletes_the_snapshot_its_node_class_boots_from() -> None:
    # Given a bake whose publish pointed the node class at its snapshot, but whose record of it was lost
    ctx, ec2, classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    classes.pointed["gpu"] = "snap-1"

    # When the sweep fails it past its budget, Then snap-1 is kept, and why it is not deleted is said
    assert bakes.sweep(ctx, 700.0) == ["gpu: bake gpu-1 failed at Snapshotting, past its 600 s budget"]
    failed = state(ctx)
    assert "snap-1" in ec2.snapshots and failed.bake is not None and failed.bake.step is BakeStep.FAILED
    assert failed.clean_up.delete == ("snap-1",)
    assert failed.clean_up.error == "snap-1 not deleted: EC2NodeClass/gpu boots from it"

    # And once the class is on another snapshot, the failed bake's snapshot is deleted
    classes.pointed["gpu"] = "snap-0"
    assert bakes.sweep(ctx, 760.0) == ["gpu: clean-up: snap-1 deleted"]
    assert "snap-1" not in ec2.snapshots and not state(ctx).clean_up.owed


def test_one_warm_snapshot_that_cannot_be_swept_stops_neither_the_others_nor_the_orphan_builders() -> None:
    # Given two warm snapshots baking, the first (cpu) one whose builder EC2 cannot describe now
    ctx, ec2, classes = context()
    ctx.store.put_warm_snapshot("cpu", manifest("cpu"), "h")
    classes.pointed["cpu"] = ""
    push(ctx, D1, 10.0)
    bakes.advance(ctx, "cpu", 10.0)
    ec2.faults["state i-cpu-1"] = "RequestLimitExceeded"
    # And gpu's builder killed, and a builder no bake owns, long past any budget
    ec2.instances["i-gpu-1"] = "terminated"
    ec2.instances["i-old-7"], ec2.launched_at["i-old-7"] = "running", -1000.0

    # When the sweep runs, Then cpu's error is said and the rest is swept
    assert bakes.sweep(ctx, 50.0) == ["cpu: not swept: RequestLimitExceeded",
                                      "gpu: bake gpu-1 failed: its builder is terminated",
                                      "terminated builder i-old-7 of old-7: past its time budget"]
    assert ec2.instances == {"i-cpu-1": "running", "i-gpu-1": "terminated", "i-old-7": "terminated"}

    # And a builder EC2 will not terminate is said, not raised
    ec2.instances["i-old-8"], ec2.launched_at["i-old-8"] = "running", -1000.0
    ec2.faults["terminate i-old-8"] = "IncorrectInstanceState"
    assert bakes.sweep(ctx, 60.0)[-1] == "builder i-old-8 of old-8 not terminated: IncorrectInstanceState"


def test_an_image_declared_after_a_bake_is_baked_at_once_and_one_removed_is_baked_out() -> None:
    busybox = "docker.io/library/busybox:1"
    ctx, ec2, _classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
    assert status_word(state(ctx)) == "Current"

    # When the spec names another image, Then the snapshot is Stale and a bake of both starts, the new
    # image's digest left to the builder, as in a first bake
    declare(ctx, images=[busybox])
    added = state(ctx)
    assert status_word(added) == "Stale" and f"Stale: {busybox} declared but not baked" in added.message()
    assert added.bake is not None and added.bake.id == "gpu-2" and added.bake.images == {REF: D1, busybox: None}
    bakes.record_baked(ctx.store, Baked(warm_snapshot="gpu", bake="gpu-2", ok=True, image_bytes=1,
                                        digests={REF: D1, busybox: D3}), 40.0)
    bakes.advance(ctx, "gpu", 40.0)
    bakes.on_snapshot_event(ctx, "snap-2", True, "", 50.0)
    baked = state(ctx)
    assert baked.current is not None and baked.current.digests == {REF: D1, busybox: D3}
    assert status_word(baked) == "Current" and bakes.advance(ctx, "gpu", 51.0) == []  # nothing more owed

    # When the spec no longer names it, Then a bake without it starts
    declare(ctx)
    dropped = state(ctx)
    assert dropped.stale and f"Stale: {busybox} no longer declared but in the snapshot" in dropped.message()
    assert dropped.bake is not None and dropped.bake.id == "gpu-3" and dropped.bake.images == {REF: D1}
    assert [c for c in ec2.calls if c.startswith("launch")] == ["launch gpu-1", "launch gpu-2", "launch gpu-3"]


def test_a_rules_push_of_a_new_tag_bakes_it_in_place_of_the_tag_it_pushed_before() -> None:
    # Given v1 baked, brought by the rule
    ctx, _ec2, _classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)

    # When the rule's next push is v2 of that repository, Then the next bake holds v2 alone
    push(ctx, D2, 40.0, tag="v2")
    assert state(ctx).bake.images == {f"{HOST}/ml/trainer:v2": D2}  # type: ignore[union-attr]
