"""Fast Snapshot Restore is billed per snapshot and AZ-hour while enabled: every zone a bake enabled is
disabled once no snapshot nodes launch from needs it there (an earlier snapshot, a zone the spec dropped,
FSR removed, the WarmSnapshot deleted), and `describe` bills what is enabled, not what the spec says."""

from __future__ import annotations

from typing import Any

from prewarm.services import bakes
from prewarm.services.bakes import BakeContext, BakeSettings
from prewarm.services.resources import sync_resources
from prewarm_cli.snapshot_output import describe_snapshot, status_word
from tests.support.bakes import D1, D2, FakeEc2, FakeNodeClasses, builder_reports, declare, push, state
from tests.support.bakes import context as bake_context
from tests.support.memory_store import MemoryJobStore
from tests.support.resources import FakeResources

A, B = "us-west-2a", "us-west-2b"
BUILDER = {"subnetIds": ["subnet-0123456789abcdef0"], "timeBudgetSeconds": 600}


def fsr(*zones: str) -> dict[str, Any]:
    return {"fastSnapshotRestore": {"availabilityZones": list(zones)}}


def baked(ctx: BakeContext, digest: str, now: float) -> None:
    """A push baked and published (its snapshot's event at `now + 20`)."""
    push(ctx, digest, now)
    builder_reports(ctx, digest, now + 10)
    snapshot = state(ctx).bake.snapshot_id  # type: ignore[union-attr]
    bakes.on_snapshot_event(ctx, snapshot, True, "", now + 20)


def test_fsr_removed_from_the_spec_is_disabled_on_the_current_snapshot() -> None:
    # Given snap-1 published with FSR in two zones
    ctx, ec2, _classes = bake_context(**fsr(A, B))
    baked(ctx, D1, 10.0)
    assert ec2.billed_fsr() == {"snap-1": {A, B}}

    # When the spec no longer asks for FSR, Then the current snapshot's is disabled in both zones
    declare(ctx, now=100.0)
    assert ec2.billed_fsr() == {} and not state(ctx).clean_up.owed
    assert state(ctx).current.fsr_zones == ()  # type: ignore[union-attr]

    # And the next bake enables none, nor leaves any on the earlier snapshot (keep 2 retains it)
    baked(ctx, D2, 200.0)
    assert ec2.billed_fsr() == {} and [s.id for s in state(ctx).snapshots] == ["snap-2", "snap-1"]


def test_a_zone_dropped_from_the_spec_is_disabled_there_and_earlier_snapshots_in_their_own_zones() -> None:
    # Given snap-1 with FSR in two zones
    ctx, ec2, _classes = bake_context(**fsr(A, B))
    baked(ctx, D1, 10.0)

    # When the spec narrows to one zone, Then the other is disabled on the current snapshot at once
    declare(ctx, now=100.0, **fsr(A))
    assert ec2.billed_fsr() == {"snap-1": {A}}

    # When snap-2 is published, Then snap-1 loses FSR where it had it, snap-2 has it in the zone declared
    baked(ctx, D2, 200.0)
    assert ec2.billed_fsr() == {"snap-2": {A}}


def test_fsr_removed_while_ec2_refuses_is_disabled_by_the_sweep_even_after_the_next_publish() -> None:
    # Given snap-1 with FSR, EC2 refusing to disable it, and the spec dropping FSR
    ctx, ec2, _classes = bake_context(**fsr(A, B))
    baked(ctx, D1, 10.0)
    ec2.faults["no fsr snap-1"] = "UnauthorizedOperation"
    declare(ctx, now=100.0)
    assert state(ctx).clean_up.fsr_off == {"snap-1": (A, B)}

    # When snap-2 is published meanwhile, Then snap-1 is still owed FSR off, in the zones it has it
    baked(ctx, D2, 200.0)
    assert state(ctx).clean_up.fsr_off == {"snap-1": (A, B)}

    # And once EC2 accepts, the sweep disables it
    del ec2.faults["no fsr snap-1"]
    assert bakes.sweep(ctx, 300.0) == ["gpu: clean-up: Fast Snapshot Restore of snap-1 disabled"]
    assert ec2.billed_fsr() == {}


def test_describe_bills_the_fsr_enabled_from_its_publish_not_the_zones_the_spec_names() -> None:
    # Given snap-1 published at 30 with FSR in two zones, the spec dropping FSR and EC2 refusing to disable it
    ctx, ec2, _classes = bake_context(**fsr(A, B))
    baked(ctx, D1, 10.0)
    ec2.faults["no fsr snap-1"] = "UnauthorizedOperation"
    declare(ctx, now=100.0)
    record = ctx.store.get_warm_snapshot("gpu")
    assert record is not None

    # When described an hour after the publish, Then both zones are billed since the publish
    shown = describe_snapshot(record, [], now=30.0 + 3600)
    assert f"Fast Snapshot Restore: {A}, {B} on snap-1, $1.50 an hour ($0.75 per AZ-hour)" in shown, shown
    assert f"  being disabled: {A}, {B} on snap-1" in shown
    assert "FSR 2.0 AZ-hours ($1.50)" in shown


def sync_context() -> tuple[BakeContext, FakeEc2, FakeResources, MemoryJobStore]:
    store, ec2, api = MemoryJobStore(), FakeEc2(), FakeResources()
    ctx = BakeContext(store, ec2, FakeNodeClasses(), BakeSettings("https://sqs/status", "us-west-2", "agent:1"))
    api.put("WarmSnapshot", "gpu", {"nodeClass": {"ec2NodeClass": "gpu"}, "amiFamily": "Bottlerocket",
                                    "rules": ["ml"], "builder": BUILDER, **fsr(A, B)}, namespace=None)
    assert sync_resources(store, api, now=1.0).applied == ["WarmSnapshot gpu created"]
    return ctx, ec2, api, store


def test_a_deleted_warm_snapshot_disables_fsr_on_its_snapshots_keeps_them_and_then_its_record_goes() -> None:
    # Given a WarmSnapshot resource with two snapshots published, the current one with FSR
    ctx, ec2, api, store = sync_context()
    baked(ctx, D1, 10.0)
    baked(ctx, D2, 100.0)
    assert ec2.billed_fsr() == {"snap-2": {A, B}}

    # When its resource is deleted, Then the sync marks the record (it may not call EC2) ...
    api.objects.clear()
    assert sync_resources(store, api, now=200.0).deleted == []
    assert status_word(state(ctx)) == "Deleting"
    # ... the bakes' stream disables FSR, keeping the snapshots: nodes may boot from them ...
    bakes.advance(ctx, "gpu", 201.0)
    assert ec2.billed_fsr() == {} and set(ec2.snapshots) == {"snap-1", "snap-2"}
    assert not any(c.startswith("delete") for c in ec2.calls)
    # ... and the next sync drops the record
    assert sync_resources(store, api, now=260.0).deleted == ["WarmSnapshot gpu"]
    assert store.get_warm_snapshot("gpu") is None


def test_a_warm_snapshot_deleted_while_baking_ends_its_bake_and_created_again_bakes_again() -> None:
    # Given a bake running when the resource is deleted
    ctx, ec2, api, store = sync_context()
    push(ctx, D1, 10.0)
    spec = api.get("WarmSnapshot", "gpu", namespace=None)["spec"]
    api.objects.clear()
    sync_resources(store, api, now=20.0)
    bakes.advance(ctx, "gpu", 20.0)

    # Then its builder is terminated, and a push bakes nothing
    ended = state(ctx)
    assert ended.bake is not None and ended.bake.reason == "its WarmSnapshot was deleted"
    assert ec2.instances == {"i-gpu-1": "terminated"}
    push(ctx, D2, 30.0)
    assert state(ctx).bake.id == "gpu-1"  # type: ignore[union-attr]

    # When the resource is created again before the record went, Then it is applied and bakes again
    api.put("WarmSnapshot", "gpu", spec, namespace=None)
    assert sync_resources(store, api, now=40.0).applied == ["WarmSnapshot gpu configured"]
    assert state(ctx).deleted_at is None
    push(ctx, D2, 50.0)
    assert state(ctx).bake.id == "gpu-2"  # type: ignore[union-attr]


def test_a_cli_applied_warm_snapshot_deleted_with_the_cli_turns_fsr_off_and_the_sync_then_drops_it() -> None:
    # Given a warm snapshot applied with the CLI (no resource), snap-1 published with FSR
    ctx, ec2, _classes = bake_context(**fsr(A, B))
    baked(ctx, D1, 10.0)
    api = FakeResources()
    assert sync_resources(ctx.store, api, now=50.0).deleted == []  # not the sync's to delete: no resource made it

    # When `prewarm delete snapshot` marks it deleted, Then FSR is owed off first
    assert not bakes.delete_warm_snapshot(ctx.store, "gpu", 100.0)
    assert status_word(state(ctx)) == "Deleting"
    # ... the bakes' stream turns it off, keeping the snapshot, and the next sync drops the record
    bakes.advance(ctx, "gpu", 101.0)
    assert ec2.billed_fsr() == {} and "snap-1" in ec2.snapshots
    assert sync_resources(ctx.store, api, now=160.0).deleted == ["WarmSnapshot gpu"]
    assert ctx.store.get_warm_snapshot("gpu") is None


def test_a_warm_snapshot_deleted_while_its_publish_points_the_class_keeps_that_snapshot_and_turns_its_fsr_off(
) -> None:
    # Given a bake whose publish points the node class at snap-1 while its WarmSnapshot is deleted meanwhile
    ctx, ec2, classes = bake_context(**fsr(A))
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    snapshot = state(ctx).bake.snapshot_id  # type: ignore[union-attr]
    pointing = classes.point_at

    def point_and_delete(kind: str, name: str, device_name: str, snapshot_id: str) -> None:
        pointing(kind, name, device_name, snapshot_id)
        bakes.delete_warm_snapshot(ctx.store, "gpu", 25.0)

    classes.point_at = point_and_delete  # type: ignore[method-assign]
    bakes.on_snapshot_event(ctx, snapshot, True, "", 30.0)
    assert classes.pointed == {"gpu": snapshot}

    # When the sweeps go on, Then the snapshot the class boots from is kept, its FSR turned off, and the
    # deletion finishes (before, it stayed Deleting for good, FSR billed)
    for minute in range(1, 4):
        bakes.sweep(ctx, 30.0 + 60 * minute)
    assert snapshot in ec2.snapshots and ec2.billed_fsr() == {}
    assert state(ctx).deletion_done
    assert bakes.delete_warm_snapshot(ctx.store, "gpu", 300.0)
