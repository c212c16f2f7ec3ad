"""The ETA and what bounds it: node throughput, the registry budget, node disk."""

from __future__ import annotations

import pytest

from prewarm.domain.eta import Bottleneck, BudgetShare, Estimate, duration, estimate, node_rate
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord

MB = 1_000_000


def pulling(node: str, done: int, *, total: int = 100 * MB, started: float = 0.0, now: float = 10.0) -> NodeTaskRecord:
    return NodeTaskRecord(node, 0, NodePhase.PULLING, dispatched_at=started, started_at=started, updated_at=now,
                          bytes_done=done, bytes_total=total)


def succeeded(node: str, *, seconds: float, total: int = 100 * MB) -> NodeTaskRecord:
    return NodeTaskRecord(node, 0, NodePhase.SUCCEEDED, dispatched_at=0, started_at=0, finished_at=seconds,
                          updated_at=seconds, bytes_done=total, bytes_total=total)


def waiting(node: str) -> NodeTaskRecord:
    return NodeTaskRecord(node, 0)


def test_node_throughput_bounds_a_job_whose_nodes_pull_slower_than_the_budget_starts_them() -> None:
    # 10 MB/s a node (the median of 10, 10 and 5): the nodes in flight need 5 s more, then two batches of 10 s.
    tasks = [pulling("a", 50 * MB, started=5), pulling("b", 50 * MB, started=5), succeeded("c", seconds=20),
             *(waiting(f"w{i}") for i in range(4))]
    assert node_rate(tasks) == pytest.approx(10 * MB)
    assert node_rate(tasks[2:]) == pytest.approx(5 * MB)
    budget = BudgetShare(pull_seconds=0.5, backlog=0, requests_per_second=24, requests=12)
    got = estimate(tasks, parallelism=2, now=10, budget=budget)
    assert (got.seconds, got.bottleneck) == (pytest.approx(25.0), Bottleneck.NODE_THROUGHPUT)
    assert str(got) == "25s left, bound by node throughput: 10.0 MB/s a node, 100.0 MB an image, 4 waiting for 2 slots"


def test_the_registry_budget_bounds_a_job_whose_starts_it_paces_and_counts_what_others_reserved() -> None:
    tasks = [pulling("a", 90 * MB), *(waiting(f"w{i}") for i in range(100))]  # 9 MB/s: 100 MB in 11.1 s
    budget = BudgetShare(pull_seconds=12 / 20, backlog=30, requests_per_second=20, requests=12)
    got = estimate(tasks, parallelism=100, now=10, budget=budget)
    # 30 s reserved ahead by other jobs, 100 starts at 0.6 s each, and the last one's pull.
    assert got.bottleneck is Bottleneck.REGISTRY_BUDGET
    assert got.seconds == pytest.approx(30 + 60 + 100 / 9)
    assert str(got) == ("1m41s left, bound by registry budget: 1.67 pull starts/s (12 requests a pull at 20/s), "
                        "100 waiting, 30s of it reserved ahead")


def test_a_byte_budget_that_bounds_the_pull_is_the_cost_named() -> None:
    tasks = [pulling("a", 90 * MB), *(waiting(f"w{i}") for i in range(10))]
    # 3 GB a pull at 1 GB/s: 3 s a start, against 12 requests at 20/s (0.6 s); and a byte budget alone
    for rate in (20.0, 0.0):
        budget = BudgetShare(pull_seconds=3.0, backlog=0, requests_per_second=rate, requests=12,
                             bytes_per_second=1e9, size_bytes=3_000_000_000)
        got = estimate(tasks, parallelism=10, now=10, budget=budget)
        assert got.bottleneck is Bottleneck.REGISTRY_BUDGET
        assert "0.333 pull starts/s (3.0 GB a pull at 1.0 GB/s), 10 waiting" in str(got), str(got)


def test_before_any_byte_progress_only_the_budget_gives_a_bound_and_without_it_the_eta_is_unknown() -> None:
    tasks = [NodeTaskRecord("a", 0, NodePhase.PULLING, dispatched_at=0), waiting("b"), waiting("c")]
    budget = BudgetShare(pull_seconds=2, backlog=1, requests_per_second=6, requests=12)
    got = estimate(tasks, parallelism=1, now=0, budget=budget)
    assert (got.seconds, got.bottleneck) == (5, Bottleneck.REGISTRY_BUDGET)
    unknown = estimate(tasks, parallelism=1, now=0)
    assert unknown.seconds is None and str(unknown) == "unknown: no node has reported byte progress yet"


def test_node_disk_is_named_when_an_agent_refused_the_image_for_want_of_room() -> None:
    refusal = ("disk guard: imagefs 80% used, threshold 85%; the image needs 100000000 bytes, 20000000 are free "
               "below the threshold")
    tasks = [NodeTaskRecord("z", 0, NodePhase.FAILED, dispatched_at=0, message=refusal),
             NodeTaskRecord("y", 0, NodePhase.FAILED, dispatched_at=0, message=refusal),
             pulling("a", 50 * MB), waiting("b")]
    got = estimate(tasks, parallelism=1, now=10)
    assert got.bottleneck is Bottleneck.NODE_DISK and got.seconds == pytest.approx(30.0)
    assert str(got).startswith("30s left, bound by node disk: 2 nodes cannot hold the image "
                               "(y has 20.0 MB free for 100.0 MB and 1 more); the rest 5.0 MB/s a node")
    # A failure for another reason is not the disk's.
    tasks[0] = NodeTaskRecord("z", 0, NodePhase.FAILED, dispatched_at=0, message="401 Unauthorized")
    tasks[1] = NodeTaskRecord("y", 0, NodePhase.CANCELLED, dispatched_at=0, message=refusal)
    assert estimate(tasks, parallelism=1, now=10).bottleneck is Bottleneck.NODE_THROUGHPUT
    done = [NodeTaskRecord("y", 0, NodePhase.FAILED, dispatched_at=0, message=refusal), succeeded("a", seconds=5)]
    assert str(estimate(done, parallelism=1, now=10)) == ("0s left, bound by node disk: 1 node cannot hold the "
                                                          "image (y has 20.0 MB free for 100.0 MB)")


def test_a_finished_round_has_nothing_left() -> None:
    got = estimate([succeeded("a", seconds=3)], parallelism=1, now=10)
    assert (got.seconds, got.bottleneck, str(got)) == (0, None, "nothing left to pull")


def test_the_first_estimate_round_trips_and_reads_against_the_outcome() -> None:
    first = Estimate(90.0, Bottleneck.REGISTRY_BUDGET, "x", at=100.0)
    assert Estimate.from_item(first.to_item()) == first
    assert first.against(finished_at=220.0) == "estimated 1m30s (registry budget), took 2m00s"
    unknown = Estimate(None, None, "no node has reported byte progress yet", at=100.0)
    assert Estimate.from_item(unknown.to_item()) == unknown
    assert unknown.against(finished_at=105.0) == "took 5s; no estimate was made"


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (3599, "59m59s"),
                                               (3600, "1h00m"), (7260, "2h01m"), (-3, "0s")])
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_paused_job_has_no_eta_and_says_why_and_its_pulls_in_flight_still_count() -> None:
    # parallelism 0 with nodes waiting: they start only once it is raised
    tasks = [pulling("a", 50 * MB, started=5), succeeded("c", seconds=20), waiting("w1"), waiting("w2")]
    got = estimate(tasks, parallelism=0, now=10)
    assert (got.seconds, got.bottleneck) == (None, None)
    assert got.detail == "parallelism 0: 2 nodes wait until it is raised"
    # lowered to 0 with none waiting: the pull in flight finishes at the nodes' rate (50 MB at 7.5 MB/s)
    flying = estimate(tasks[:2], parallelism=0, now=10)
    assert (flying.seconds, flying.bottleneck) == (pytest.approx(50 / 7.5), Bottleneck.NODE_THROUGHPUT)
