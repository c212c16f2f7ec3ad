"""The bake state machine (prewarm.domain.bakes) on what a review found: each snapshot records the zones Fast
Snapshot Restore is enabled in, and the clean-up disables exactly those no snapshot nodes launch from needs;
a deleted WarmSnapshot owes FSR off on all of them; `stale` holds before the first snapshot too; and a rule
keeps the newest tag it pushed per repository."""

from __future__ import annotations

from dataclasses import replace

from prewarm.domain import bakes
from prewarm.domain.bakes import BakedSnapshot, BakeStep, SnapshotState

HOST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
V1, V2, V3 = (f"{HOST}/ml/trainer:{tag}" for tag in ("v1", "v2", "v3"))
SERVE = f"{HOST}/ml/serve:v1"
BUSYBOX = "docker.io/library/busybox:1"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def baked(state: SnapshotState, now: float, snapshot: str, zones: tuple[str, ...] = ()) -> SnapshotState:
    """A whole successful bake of the current image set, the builder reporting a digest for each image."""
    state = bakes.start(state, "gpu", now)
    assert state.bake is not None
    bake_id = state.bake.id
    state = bakes.launched(state, bake_id, "i-1", "vol-1", now + 1)
    state = bakes.pulled(state, bake_id, {ref: d or D3 for ref, d in state.images.items()}, 100, now + 2)
    state = bakes.snapshot_started(state, bake_id, snapshot)
    state = bakes.snapshot_completed(state, snapshot, now + 3)
    return bakes.published(state, snapshot, 2, now + 4, zones)[0]


def test_an_earlier_snapshot_loses_fsr_in_the_zones_it_had_not_those_the_spec_names_now() -> None:
    state = baked(bakes.with_push(SnapshotState(), V1, D1, 0.0), 0.0, "snap-1", ("az-a", "az-b"))
    assert state.current is not None and state.current.fsr_zones == ("az-a", "az-b")

    # FSR narrowed to az-a: az-b is owed off on the current snapshot, az-a kept
    narrowed = bakes.with_fsr_declared(state, ["az-a"])
    assert narrowed.clean_up.fsr_off == {"snap-1": ("az-b",)}
    # ... and named again before that was done, no longer owed
    assert bakes.with_fsr_declared(narrowed, ["az-a", "az-b"]).clean_up.fsr_off == {}

    # FSR removed, then a new snapshot without it: snap-1 owes off in both zones it has
    removed = bakes.with_fsr_declared(state, [])
    assert removed.clean_up.fsr_off == {"snap-1": ("az-a", "az-b")}
    after = baked(bakes.with_push(removed, V1, D2, 10.0), 10.0, "snap-2")
    assert after.clean_up.fsr_off == {"snap-1": ("az-a", "az-b")}
    assert [s.fsr_zones for s in after.snapshots] == [(), ("az-a", "az-b")]

    # Disabled: the snapshot no longer records it, nothing is owed, nothing is billed
    done = bakes.cleaned(after, ["snap-1"], [], "")
    assert [s.fsr_zones for s in done.snapshots] == [(), ()] and not done.clean_up.owed
    assert bakes.cost(done, 3600.0).fsr_hours == 0.0
    assert SnapshotState.from_dict(done.to_dict()) == done


def test_fsr_is_billed_for_the_zones_enabled_since_each_snapshots_publish() -> None:
    state = baked(bakes.with_push(SnapshotState(), V1, D1, 0.0), 0.0, "snap-1", ("az-a", "az-b"))  # at 4
    state = bakes.with_fsr_declared(state, [])  # owed off, still billed until EC2 disables it
    assert bakes.cost(state, 4.0 + 3600).fsr_hours == 2.0
    state = baked(bakes.with_push(state, V1, D2, 3600.0), 3600.0, "snap-2", ("az-c",))  # at 3604
    assert bakes.cost(state, 3604.0 + 3600).fsr_hours == 5.0  # snap-1: 2 zones x 2 h, snap-2: 1 x 1 h


def test_a_snapshot_recorded_before_its_zones_were_takes_the_spec_zones_if_current() -> None:
    legacy = SnapshotState.from_dict({"images": {V1: D1}, "snapshots": [
        {"id": "snap-2", "digests": {V1: D1}, "created_at": 5.0, "bake_id": "gpu-2"},
        {"id": "snap-1", "digests": {V1: D1}, "created_at": 1.0, "bake_id": "gpu-1"}]})
    assert [s.fsr_zones for s in legacy.snapshots] == [None, None]
    assert [s.fsr_zones for s in bakes.with_fsr_declared(legacy, ["az-a"]).snapshots] == [("az-a",), ()]


def test_a_deleted_warm_snapshot_owes_fsr_off_on_every_snapshot_ends_its_bake_and_keeps_its_snapshots() -> None:
    state = baked(bakes.with_push(SnapshotState(), V1, D1, 0.0), 0.0, "snap-1", ("az-a",))
    state = baked(bakes.with_push(state, V1, D2, 10.0), 10.0, "snap-2", ("az-a", "az-b"))
    state = bakes.launched(bakes.start(bakes.with_push(state, V1, D3, 20.0), "gpu", 20.0), "gpu-3", "i-3", "v", 21.0)

    gone = bakes.deleted(state, 30.0)

    assert gone.clean_up.fsr_off == {"snap-1": ("az-a",), "snap-2": ("az-a", "az-b")} and gone.clean_up.delete == ()
    assert gone.bake is not None and gone.bake.step is BakeStep.FAILED and not bakes.next_bake_owed(gone)
    assert bakes.deleted(gone, 40.0) is gone and not gone.deletion_done  # its builder is still to terminate
    ended = bakes.cleaned(gone, ["snap-1", "snap-2"], [], "")
    assert ended.bake is not None
    ended = replace(ended, bake=replace(ended.bake, builder_terminated=True))
    assert ended.deletion_done and [s.id for s in ended.snapshots] == ["snap-2", "snap-1"]
    assert bakes.undeleted(ended).deleted_at is None


def test_images_declared_and_never_baked_are_stale_and_nothing_to_bake_is_not() -> None:
    declared = bakes.with_declared(SnapshotState(), [BUSYBOX], [])
    assert declared.stale and declared.resource_status()["stale"] is True
    failed = bakes.fail(bakes.start(declared, "gpu", 0.0), "gpu-1", "the builder failed: 403", 1.0)
    assert failed.stale and failed.last_bake_failed and not bakes.next_bake_owed(failed)
    assert not SnapshotState().stale and not bakes.with_declared(SnapshotState(), [], ["ml"]).stale


def test_a_rule_keeps_the_newest_tag_it_pushed_per_repository() -> None:
    state = bakes.with_push(SnapshotState(), V1, D1, 0.0, ["ml"])
    state = bakes.with_push(state, SERVE, D1, 1.0, ["ml"])
    state = bakes.with_push(state, V2, D2, 2.0, ["ml"])
    assert state.images == {SERVE: D1, V2: D2} and state.image_rules == {SERVE: ["ml"], V2: ["ml"]}


def test_an_older_tag_another_rule_or_the_spec_still_brings_stays() -> None:
    state = bakes.with_push(SnapshotState(), V1, D1, 0.0, ["ml", "pinned"])
    state = bakes.with_push(state, V3, D1, 0.0, ["ml"])
    state = bakes.with_push(state, V2, D2, 1.0, ["ml"], named=[V3])
    assert state.images == {V1: D1, V2: D2, V3: D1}
    assert state.image_rules == {V1: ["pinned"], V2: ["ml"]}
    # A tag pushed again at the same digest changes nothing
    assert bakes.with_push(state, V2, D2, 2.0, ["ml"], named=[V3]) is state


def test_baked_snapshot_without_fsr_round_trips() -> None:
    made = BakedSnapshot("snap-1", {V1: D1}, 1.0, "gpu-1", 10, ())
    state = SnapshotState(images={V1: D1}, snapshots=(made,))
    assert SnapshotState.from_dict(state.to_dict()) == state
