"""Every writer treats a write refused for now (DynamoDB's TransactionConflict while another writer's
transaction holds the item, throttling past botocore's retries: `StoreRetryableError`) as retryable:
it tries again after a backoff, and what is still refused goes back to its event source, never failing
more than its own input."""

from __future__ import annotations

import random
from typing import Any

import pytest

from prewarm.domain.messages import Hello, StatusReport
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import StoreRetryableError
from prewarm.services.reports import record_reports, register_node
from prewarm.services.schedules import SweepSettings, repull_daily, sweep
from prewarm.services.status_batches import record_status
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc
from tests.unit.services.test_control_plane import cluster_of, plan, report, tasks_sent


def refused(times: int, real: Any, calls: list[str]) -> Any:
    """`real`, refused for now its first `times` calls, as a transaction in flight on its item refuses them."""

    def write(*args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(real, "__name__", "write"))
        if len(calls) <= times:
            raise StoreRetryableError("held: TransactionConflictException")
        return real(*args, **kwargs)

    return write


def test_a_batch_whose_completion_is_refused_returns_its_final_report_and_the_redelivery_finishes_the_job(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a one-node job pulling, and finish_job refused for now (a claim holds the job item) beyond
    # the store's own tries
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(), now=plane.now())
    plan(plane)
    (task,) = [m[0] for m in tasks_sent(plane, nodes).values()]
    assert report(plane, task, "Pulling", seq=1).applied
    calls: list[str] = []
    monkeypatch.setattr(plane.store, "finish_job", refused(1, plane.store.finish_job, calls))
    final = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase="Succeeded",
                         seq=2)
    # When the batch with its final report is applied (before: StoreRetryableError failed the whole batch)
    first = record_status(plane.store, plane.queues, clusters_of(plane.store), [("m1", final)], now=plane.now())
    # Then the node is counted, the job not finished yet, and only the final report goes back to the queue
    assert first.retry_ids == ["m1"] and first.reports[0][1].applied
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert (view.succeeded, view.completion_time) == (1, None)
    # and its redelivery finds the node final and finishes the job, counting nothing twice
    again = record_status(plane.store, plane.queues, clusters_of(plane.store), [("m1", final)], now=plane.now())
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert again.retry_ids == [] and (view.succeeded, view.message) == (1, "job has completed")


def test_a_daily_round_refused_for_one_job_still_starts_the_others_and_the_retry_starts_it(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two planned Never jobs, and the first round write refused for now through every try
    cluster_of(plane, 1)
    for name in ("first", "second"):
        apply_manifest(plane.store, job_doc(name, completionPolicy={"type": "Never"}), now=plane.now())
        plan(plane, name)
    scheduled = plane.now()
    calls: list[str] = []
    monkeypatch.setattr(plane.store, "set_job_fields", refused(5, plane.store.set_job_fields, calls))
    # When the daily round runs (before: the first refusal ended it, the other job got no round)
    with pytest.raises(StoreRetryableError, match="daily round not started yet for default/") as raised:
        repull_daily(plane.store, scheduled_time=scheduled)
    # Then the other job got its round, and the scheduler's retry of the same invocation starts the first only
    rounds = {name: plane.store.get_job(f"default/{name}").round for name in ("first", "second")}  # type: ignore[union-attr]
    assert sorted(rounds.values()) == [0, 1] and len(calls) == 6
    refused_job = next(f"default/{n}" for n, r in rounds.items() if r == 0)
    assert refused_job in str(raised.value)
    assert repull_daily(plane.store, scheduled_time=scheduled) == [refused_job]


def test_the_sweep_failing_a_silent_node_meets_a_transaction_and_tries_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a node sent its task and never reporting, past its timeout and grace
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(pullPolicy={"timeoutSeconds": 60}), now=plane.now())
    plan(plane)
    tasks_sent(plane, nodes)
    calls: list[str] = []
    monkeypatch.setattr(plane.store, "apply_updates", refused(2, plane.store.apply_updates, calls))
    # When the sweep fails it and its transaction meets a report batch's on the job item twice
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now() + 400,
                   config=SweepSettings(prefix="pw"))
    # Then the sweep tried again (before: the sweep failed for every job) and the node is failed
    assert result.silent_nodes == [f"default/warm:{nodes[0]}"] and len(calls) == 3
    assert view_job(plane.store, "default", "warm", now=plane.now()).failed_nodes == nodes


def test_a_hello_joining_a_never_job_meets_a_transaction_on_the_job_item_and_tries_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running Never job, and the new node's add refused once (a claim holds the job item)
    cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(parallelism=5, completionPolicy={"type": "Never"}), now=plane.now())
    plan(plane)
    calls: list[str] = []
    monkeypatch.setattr(plane.store, "add_tasks", refused(1, plane.store.add_tasks, calls))
    from tests.support.cluster import make_node

    plane.cluster.nodes.append(make_node("node-new", pool="gpu"))
    plane.queues.ensure_queue("node-new")  # as its agent does before its hello
    # When its hello is applied (before: StoreRetryableError, the hello back to the queue for 180 s)
    outcome = register_node(plane.store, plane.queues, plane.cluster, Hello(node="node-new", labels={"pool": "gpu"}),
                            now=plane.now())
    # Then the node joined on the second try and got its task
    assert outcome.added_to == ["default/warm"] and len(calls) == 2
    assert [m.job for m in tasks_sent(plane, ["node-new"])["node-new"]] == ["default/warm"]


class Draws(random.Random):
    """A random source that draws halfway, keeping each range it was asked to draw from."""

    def __init__(self) -> None:
        super().__init__(0)
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return a + (b - a) / 2


def final_report_refused(plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, times: int,
                         calls: list[str]) -> StatusReport:
    """A node pulling, and its final report, whose transaction is refused `times` times (another writer's
    holds the job item)."""
    nodes = cluster_of(plane, 1)
    apply_manifest(plane.store, job_doc(), now=plane.now())
    plan(plane)
    (task,) = [m[0] for m in tasks_sent(plane, nodes).values()]
    assert report(plane, task, "Pulling", seq=1).applied
    monkeypatch.setattr(plane.store, "apply_updates", refused(times, plane.store.apply_updates, calls))
    return StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase="Succeeded",
                        seq=2)


def test_a_batch_refused_for_now_waits_a_full_jitter_draw_below_the_doubling_backoff_before_each_retry(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    final = final_report_refused(plane, monkeypatch, 3, calls)
    sleeps: list[float] = []
    draws = Draws()

    # When the report is applied
    batch = record_reports(plane.store, plane.queues, [final], now=plane.now(), sleep=sleeps.append, rng=draws)

    # Then each retry waited a draw from 0 up to 50 ms doubling (full jitter), not the ceiling itself
    assert batch.outcomes[0].applied and len(calls) == 4
    assert draws.ranges == [(0, 0.05), (0, 0.1), (0, 0.2)]
    assert sleeps == [0.025, 0.05, 0.1]


def test_without_a_random_source_given_the_waits_still_vary_below_the_ceiling(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    final = final_report_refused(plane, monkeypatch, 5, calls)
    sleeps: list[float] = []
    assert record_reports(plane.store, plane.queues, [final], now=plane.now(), sleep=sleeps.append).outcomes[0].applied
    ceilings = [0.05, 0.1, 0.2, 0.4, 0.8]
    assert len(sleeps) == 5 and all(0 <= s <= c for s, c in zip(sleeps, ceilings, strict=True))
    assert sleeps != ceilings
