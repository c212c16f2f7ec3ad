"""The bake state machine (prewarm.domain.bakes) against a changed spec and after a publish: an image
declared or dropped since the current snapshot owes a bake, and the clean-up a publish leaves is recorded,
never of a snapshot kept."""

from __future__ import annotations

from prewarm.domain import bakes
from prewarm.domain.bakes import CleanUp, SnapshotState

REF = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/trainer:v1"
BUSYBOX = "docker.io/library/busybox:1"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


def baked(state: SnapshotState, digests: dict[str, str], now: float, snapshot: str, *, keep: int = 2,
          fsr_zones: tuple[str, ...] = ()) -> SnapshotState:
    """A whole successful bake of the current image set, the builder reporting `digests`."""
    state = bakes.start(state, "gpu", now)
    assert state.bake is not None
    bake_id = state.bake.id
    state = bakes.launched(state, bake_id, "i-1", "vol-1", now + 1)
    state = bakes.pulled(state, bake_id, digests, 100, now + 2)
    state = bakes.snapshot_started(state, bake_id, snapshot)
    state = bakes.snapshot_completed(state, snapshot, now + 3)
    return bakes.published(state, snapshot, keep, now + 4, fsr_zones)[0]


def test_an_image_declared_after_the_current_snapshot_makes_it_stale_and_owes_a_bake() -> None:
    state = baked(bakes.with_push(SnapshotState(), REF, D1, 0.0, ["ml"]), {REF: D1}, 1.0, "snap-1")
    assert not state.stale and not bakes.next_bake_owed(state)

    added = bakes.with_declared(state, [BUSYBOX], ["ml"])

    assert added.stale and bakes.next_bake_owed(added) and added.not_baked == [BUSYBOX]
    assert "Stale: docker.io/library/busybox:1 declared but not baked" in added.message()
    # Baked with its digest as the builder resolves it: nothing more is owed
    both = baked(added, {REF: D1, BUSYBOX: D3}, 10.0, "snap-2")
    assert not both.stale and not bakes.next_bake_owed(both)


def test_an_image_no_longer_declared_owes_a_bake_that_drops_it_unless_nothing_is_left() -> None:
    state = bakes.with_declared(bakes.with_push(SnapshotState(), REF, D1, 0.0, ["ml"]), [BUSYBOX], ["ml"])
    state = baked(state, {REF: D1, BUSYBOX: D3}, 1.0, "snap-1")

    dropped = bakes.with_declared(state, [], ["ml"])

    assert dropped.stale and bakes.next_bake_owed(dropped) and dropped.no_longer_declared == [BUSYBOX]
    assert "Stale: docker.io/library/busybox:1 no longer declared but in the snapshot" in dropped.message()
    # A snapshot of nothing is never owed: the class keeps the one it has
    assert not bakes.next_bake_owed(bakes.with_declared(dropped, [], ["web"]))


def test_a_publish_records_the_clean_up_it_owes_and_a_kept_snapshot_is_never_deleted() -> None:
    state = baked(bakes.with_push(SnapshotState(), REF, D1, 0.0), {REF: D1}, 1.0, "snap-1", fsr_zones=("az-a",))
    state = baked(bakes.with_push(state, REF, D2, 10.0), {REF: D2}, 11.0, "snap-2", fsr_zones=("az-a",))
    assert state.clean_up == CleanUp(fsr_off={"snap-1": ("az-a",)})
    state = baked(bakes.with_push(state, REF, D3, 20.0), {REF: D3}, 21.0, "snap-3", fsr_zones=("az-a",))
    # snap-1 went beyond keep: deleted (EBS drops its FSR with it); snap-2, now previous, loses FSR
    assert state.clean_up == CleanUp(fsr_off={"snap-2": ("az-a",)}, delete=("snap-1",))
    assert bakes.owe_clean_up(state, delete=["snap-3", "snap-2"]) == state

    failed = bakes.cleaned(state, [], ["snap-1"], "Fast Snapshot Restore of snap-2 not disabled: throttled")
    assert failed.clean_up == CleanUp(fsr_off={"snap-2": ("az-a",)}, error=failed.clean_up.error)
    assert "clean-up owed (the sweep retries): Fast Snapshot Restore of snap-2" in failed.message()
    assert SnapshotState.from_dict(failed.to_dict()) == failed
    assert not bakes.cleaned(failed, ["snap-2"], [], "").clean_up.owed
