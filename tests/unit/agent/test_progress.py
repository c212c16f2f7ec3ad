"""Mapping containerd's in-flight downloads to one pull's byte progress."""

from __future__ import annotations

import pytest

from prewarm_agent.progress import Progress, ProgressTracker, layer_digest
from tests.support.agent import Ingest

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
C = "sha256:" + "c" * 64


def layer(digest: str, offset: int, total: int) -> Ingest:
    return Ingest(f"layer-{digest}", offset, total)


@pytest.mark.parametrize(
    ("ref", "digest"),
    [
        (f"layer-{A}", A),
        (f"manifest-{A}", None),
        (f"config-{A}", None),
        ("layer-", None),
        ("layer-nodigest", None),
    ],
)
def test_layer_digest_is_read_from_containerds_ref_names(ref: str, digest: str | None) -> None:
    assert layer_digest(ref) == digest


def test_known_layers_count_their_offsets_against_the_manifest_total() -> None:
    tracker = ProgressTracker()
    tracker.expect({A: 100, B: 300})

    progress = tracker.observe([layer(A, 40, 100), layer(C, 999, 1000)], exclusive=False)

    # C belongs to another pull; B has not started
    assert progress == Progress(bytes_done=40, bytes_total=400)


def test_a_layer_that_disappears_after_being_seen_counts_as_complete() -> None:
    tracker = ProgressTracker()
    tracker.expect({A: 100, B: 300})
    tracker.observe([layer(A, 40, 100), layer(B, 10, 300)], exclusive=False)

    progress = tracker.observe([layer(B, 200, 300)], exclusive=False)

    assert progress == Progress(bytes_done=100 + 200, bytes_total=400)


def test_offsets_never_go_backwards_between_samples() -> None:
    tracker = ProgressTracker()
    tracker.expect({A: 100})
    tracker.observe([layer(A, 60, 100)], exclusive=True)

    assert tracker.observe([layer(A, 50, 100)], exclusive=True) == Progress(60, 100)


def test_without_a_manifest_an_exclusive_pull_takes_every_layer_being_downloaded() -> None:
    tracker = ProgressTracker()

    progress = tracker.observe([layer(A, 10, 100), layer(B, 5, 50), Ingest(f"config-{C}", 1, 2)], exclusive=True)

    assert progress == Progress(bytes_done=15, bytes_total=150)


def test_without_a_manifest_progress_is_unknown_while_other_pulls_run() -> None:
    tracker = ProgressTracker()

    assert tracker.observe([layer(A, 10, 100)], exclusive=False) is None


def test_layers_taken_while_exclusive_stay_followed_when_another_pull_starts() -> None:
    tracker = ProgressTracker()
    tracker.observe([layer(A, 10, 100)], exclusive=True)

    progress = tracker.observe([layer(A, 70, 100), layer(B, 5, 50)], exclusive=False)

    assert progress == Progress(bytes_done=70, bytes_total=100)


def test_the_manifest_arriving_later_drops_layers_that_are_not_this_pulls() -> None:
    tracker = ProgressTracker()
    tracker.observe([layer(A, 10, 100), layer(C, 20, 200)], exclusive=True)

    tracker.expect({A: 100, B: 300})

    assert tracker.observe([layer(A, 30, 100)], exclusive=False) == Progress(bytes_done=30, bytes_total=400)


def test_a_finished_pull_has_all_its_bytes() -> None:
    tracker = ProgressTracker()
    tracker.expect({A: 100, B: 300})
    tracker.observe([layer(A, 10, 100)], exclusive=False)

    assert tracker.finished() == Progress(bytes_done=400, bytes_total=400)


def test_a_finished_pull_without_any_sample_has_no_progress() -> None:
    assert ProgressTracker().finished() is None
