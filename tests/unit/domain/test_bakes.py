"""The bake state machine (prewarm.domain.bakes): one bake at a time, the newest image set wins, late and
repeated events change nothing, and a failure keeps the current snapshot."""

from __future__ import annotations

import pytest

from prewarm.domain import bakes
from prewarm.domain.bakes import BakeStep, BakeTransitionError, SnapshotState

REF = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/trainer:v1"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def baked(state: SnapshotState, digest: str, now: float, *, keep: int = 2, snapshot: str = "snap-1"
          ) -> tuple[SnapshotState, list[str]]:
    """A whole successful bake of the current image set, from start to published."""
    state = bakes.start(state, "gpu", now)
    assert state.bake is not None
    bake_id = state.bake.id
    state = bakes.launched(state, bake_id, "i-1", "vol-1", now + 1)
    state = bakes.pulled(state, bake_id, {REF: digest}, 100, now + 2)
    state = bakes.snapshot_started(state, bake_id, snapshot)
    state = bakes.snapshot_completed(state, snapshot, now + 3)
    return bakes.published(state, snapshot, keep, now + 4)


def test_a_push_makes_a_bake_owed_and_a_published_bake_makes_its_snapshot_current() -> None:
    state = bakes.with_push(SnapshotState(), REF, D1, 10.0)
    assert state.stale and bakes.next_bake_owed(state)
    state, deleted = baked(state, D1, 20.0)
    assert deleted == []
    assert state.current is not None and state.current.digests == {REF: D1} and state.current.id == "snap-1"
    assert state.bake is not None and [s.step for s in state.bake.steps] == [
        BakeStep.LAUNCHING, BakeStep.PULLING, BakeStep.SNAPSHOTTING, BakeStep.PUBLISHING, BakeStep.SUCCEEDED]
    assert not state.stale and not bakes.next_bake_owed(state)
    assert state.bake.builder_seconds(100.0) == 3.0  # launched at 21, ended at 24


def test_pushes_during_a_bake_coalesce_and_the_newest_set_is_baked_next() -> None:
    state = bakes.start(bakes.with_push(SnapshotState(), REF, D1, 0.0), "gpu", 0.0)
    state = bakes.with_push(bakes.with_push(state, REF, D2, 1.0), REF, D3, 2.0)
    with pytest.raises(BakeTransitionError, match="still Launching"):
        bakes.start(state, "gpu", 3.0)
    assert not bakes.next_bake_owed(state) and state.pending
    state = bakes.fail(state, "gpu-1", "interrupted", 4.0)
    assert bakes.next_bake_owed(state)
    state = bakes.start(state, "gpu", 5.0)
    assert state.bake is not None and state.bake.id == "gpu-2" and state.bake.images == {REF: D3}


def test_a_failed_bake_keeps_the_current_snapshot_and_is_not_retried_on_the_same_set() -> None:
    state, _ = baked(bakes.with_push(SnapshotState(), REF, D1, 0.0), D1, 1.0)
    state = bakes.start(bakes.with_push(state, REF, D2, 10.0), "gpu", 11.0)
    state = bakes.fail(state, "gpu-2", "the builder failed: 403", 12.0)
    assert state.current is not None and state.current.digests == {REF: D1}
    assert state.stale and not bakes.next_bake_owed(state)
    assert state.bake is not None and state.bake.reason == "the builder failed: 403"
    assert "Stale" in state.message() and "gpu-2 Failed: the builder failed: 403" in state.message()
    assert bakes.next_bake_owed(bakes.with_push(state, REF, D3, 13.0))  # the next push tries again


def test_late_repeated_and_foreign_events_change_nothing() -> None:
    state = bakes.start(bakes.with_push(SnapshotState(), REF, D1, 0.0), "gpu", 0.0)
    launched = bakes.launched(state, "gpu-1", "i-1", "vol-1", 1.0)
    assert bakes.launched(launched, "gpu-1", "i-2", "vol-2", 2.0) == launched
    assert bakes.pulled(launched, "other-1", {REF: D1}, 1, 2.0) == launched
    assert bakes.snapshot_completed(launched, "snap-9", 3.0) == launched
    assert bakes.published(launched, "snap-9", 2, 3.0) == (launched, [])
    done = bakes.fail(launched, "gpu-1", "x", 4.0)
    assert bakes.fail(done, "gpu-1", "y", 5.0) == done


def test_a_builder_that_misses_an_image_fails_the_bake_naming_it() -> None:
    state = bakes.with_declared(bakes.with_push(SnapshotState(), REF, D1, 0.0, ["ml"]),
                                ["docker.io/library/busybox:1"], ["ml"])
    state = bakes.launched(bakes.start(state, "gpu", 0.0), "gpu-1", "i-1", "vol-1", 1.0)
    state = bakes.pulled(state, "gpu-1", {REF: D1}, 1, 2.0)
    assert state.bake is not None and state.bake.step is BakeStep.FAILED
    assert state.bake.reason == "the builder did not report docker.io/library/busybox:1"


def test_snapshots_beyond_keep_are_deleted_newest_first_kept() -> None:
    state = bakes.with_push(SnapshotState(), REF, D1, 0.0)
    state, _ = baked(state, D1, 1.0, snapshot="snap-1")
    state, _ = baked(bakes.with_push(state, REF, D2, 10.0), D2, 11.0, snapshot="snap-2")
    state, deleted = baked(bakes.with_push(state, REF, D3, 20.0), D3, 21.0, snapshot="snap-3")
    assert [s.id for s in state.snapshots] == ["snap-3", "snap-2"] and deleted == ["snap-1"]


def test_a_bake_past_its_budget_is_expired_and_the_state_round_trips() -> None:
    state = bakes.launched(bakes.start(bakes.with_push(SnapshotState(), REF, D1, 0.0), "gpu", 0.0),
                           "gpu-1", "i-1", "vol-1", 1.0)
    assert not bakes.expired(state, 600.0, 600) and bakes.expired(state, 601.0, 600)
    assert SnapshotState.from_dict(state.to_dict()) == state
    assert SnapshotState.from_dict(None) == SnapshotState()
    assert state.resource_status() == {"stale": True, "message": "no snapshot baked yet; Stale: a newer digest is "
                                                                 "pushed but not baked; bake gpu-1 Pulling"}


def test_an_image_the_spec_no_longer_names_nor_brings_by_a_rule_leaves_the_image_set() -> None:
    busybox = "docker.io/library/busybox:1"
    state = bakes.with_declared(bakes.with_push(SnapshotState(), REF, D1, 0.0, ["ml"]), [busybox], ["ml"])
    assert state.images == {REF: D1, busybox: None}
    state, _ = baked(state, D1, 1.0)
    dropped = bakes.with_declared(state, [], ["ml"])  # busybox no longer named: the set is REF alone
    assert dropped.images == {REF: D1}
    assert bakes.with_declared(dropped, [], ["ml"]) is dropped
    # The rule that brought REF in dropped too: nothing is left, and nothing is stale.
    empty = bakes.with_declared(dropped, [], ["web"])
    assert empty.images == {} and empty.image_rules == {} and not empty.stale
    # Named by the spec, it stays whatever rule brought it.
    assert bakes.with_declared(dropped, [REF], []).images == {REF: D1}
    assert SnapshotState.from_dict(dropped.to_dict()) == dropped
