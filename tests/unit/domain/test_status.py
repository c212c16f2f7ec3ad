"""Node phases, report ordering, Kruise's job status and the retry delays."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from prewarm.domain.jobs import PullPolicy
from prewarm.domain.messages import NodePhase, StatusReport
from prewarm.domain.status import (
    Attempt,
    Counters,
    JobStatus,
    NodeTaskRecord,
    ReportKey,
    RetryPolicy,
    applied,
    can_transition,
    is_newer,
    job_bytes,
    merged,
    progress_message,
    removal_deltas,
    report_change,
)

W, P, S, F, C = (NodePhase.WAITING, NodePhase.PULLING, NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED)
START = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


# --- Phases and transitions -----------------------------------------------------------------------


def test_terminal_phases() -> None:
    assert {phase for phase in NodePhase if phase.is_terminal} == {S, F, C}


@pytest.mark.parametrize(
    ("current", "new"),
    [(W, P), (W, S), (W, F), (W, C), (P, S), (P, F), (P, C), (C, F), (C, S), (F, S), (W, W), (P, P), (S, S)],
)
def test_forward_and_repeated_moves_are_allowed(current: NodePhase, new: NodePhase) -> None:
    assert can_transition(current, new)


@pytest.mark.parametrize(("current", "new"), [(P, W), (S, P), (S, W), (F, P), (C, W), (S, F), (S, C), (F, C)])
def test_backward_moves_are_rejected(current: NodePhase, new: NodePhase) -> None:
    assert not can_transition(current, new)


# --- Report ordering ------------------------------------------------------------------------------


def test_report_keys_order_by_round_then_sequence() -> None:
    assert is_newer(ReportKey(1, 0, 0), ReportKey(0, 9, 9))
    # A restarted agent's run: attempt 1 again, its seq started from the clock above the old run's
    assert is_newer(ReportKey(0, 1, 1_700_000_000_001), ReportKey(0, 3, 40))
    assert not is_newer(ReportKey(0, 3, 39), ReportKey(0, 1, 40))
    assert is_newer(ReportKey(0, 1, 8), ReportKey(0, 1, 7))
    assert not is_newer(ReportKey(0, 1, 7), ReportKey(0, 1, 7))
    assert not is_newer(ReportKey(0, 1, 6), ReportKey(0, 1, 7))


def report(phase: NodePhase, attempt: int = 1, seq: int = 0, round: int = 0, **fields: Any) -> StatusReport:
    return StatusReport(job="default/web", job_uid="u1", round=round, node="n1", phase=phase, attempt=attempt,
                        seq=seq, **fields)


def task(phase: NodePhase = W, *, dispatched: bool = True, attempt: int = 0, seq: int = 0) -> NodeTaskRecord:
    return NodeTaskRecord(node="n1", round=0, phase=phase, dispatched_at=100.0 if dispatched else None,
                          attempt=attempt, seq=seq, started_at=100.0 if phase is not W else None)


def test_a_delayed_pulling_report_does_not_undo_success() -> None:
    # Given a node that already reported success
    done = task(S, attempt=1, seq=5)
    # When an earlier progress report arrives late, even with a higher sequence from a retry
    change = report_change(done, report(P, attempt=2, seq=9), now=200)
    # Then it changes nothing
    assert change is None


def test_progress_reports_are_ordered_by_seq_across_attempts_and_agent_restarts() -> None:
    # A run's seq grows across its attempts; a restarted agent's run starts it above the old run's
    assert report_change(task(P, attempt=1, seq=3), report(P, attempt=2, seq=4), now=200) is not None
    assert report_change(task(P, attempt=3, seq=40), report(P, attempt=1, seq=1_700_000_000_001), now=200) is not None
    assert report_change(task(P, attempt=2, seq=4), report(P, attempt=1, seq=3), now=200) is None


def test_a_late_success_corrects_a_failure_declared_by_the_sweep() -> None:
    swept = task(F, attempt=1, seq=10)
    change = report_change(swept, report(S, attempt=1, seq=4), now=200)
    assert change is not None and change.deltas == {"failed": -1, "succeeded": 1}
    assert not change.finished  # the node had already finished: no slot is freed twice
    assert report_change(task(S, attempt=1, seq=4), report(F, attempt=1, seq=10), now=200) is None


def test_a_final_report_repeated_is_a_duplicate() -> None:
    assert report_change(task(S, attempt=1, seq=4), report(S, attempt=1, seq=4), now=200) is None


# --- What a report does to the counters --------------------------------------------------------------


def test_pulling_of_a_dispatched_node_writes_no_counter() -> None:
    # A dispatched node is already active: only its node item changes, the job item is not written.
    change = report_change(task(W), report(P, seq=1, bytes_done=10, bytes_total=100), now=200)
    assert change is not None and not change.counts
    assert change.fields["phase"] == "Pulling" and change.fields["bytes_done"] == 10


def test_a_node_never_dispatched_moves_from_waiting_to_active() -> None:
    change = report_change(task(W, dispatched=False), report(P, seq=1), now=200)
    assert change is not None and change.deltas == {"waiting": -1, "active": 1}
    assert change.fields["dispatched_at"] == 200


@pytest.mark.parametrize(("final", "counter"), [(S, "succeeded"), (F, "failed"), (C, "failed")])
def test_a_final_report_frees_a_slot_and_counts_once(final: NodePhase, counter: str) -> None:
    change = report_change(task(P, attempt=1, seq=3), report(final, seq=4, finished_at=160.0), now=200)
    assert change is not None and change.finished
    assert change.deltas == {"active": -1, "done": 1, counter: 1}
    assert change.seconds == 60.0


def test_a_final_report_clears_the_bytes_it_omits_and_a_quick_success_keeps_its_size() -> None:
    change = report_change(task(P, attempt=1, seq=3), report(F, seq=4), now=200)
    assert change is not None and change.fields["bytes_done"] is None and change.fields["bytes_total"] is None
    quick = report_change(task(W), report(S, seq=1, size_bytes=500), now=200)
    assert quick is not None and quick.fields["bytes_done"] == quick.fields["bytes_total"] == 500


def test_removing_a_node_takes_it_out_of_its_counter() -> None:
    assert removal_deltas(task(W, dispatched=False)) == {"desired": -1, "waiting": -1}
    assert removal_deltas(task(P)) == {"desired": -1, "active": -1}
    assert removal_deltas(task(C)) == {"desired": -1, "failed": -1, "done": -1}


def test_successive_reports_of_a_batch_merge_into_one_write() -> None:
    # Given a waiting node's Pulling and Succeeded reports in one batch
    first = report_change(task(W, dispatched=False), report(P, seq=1), now=200)
    assert first is not None
    second = report_change(applied(task(W, dispatched=False), first), report(S, seq=2), now=201)
    assert second is not None
    # When they are merged
    both = merged([first, second])
    # Then one write carries the last fields and the summed deltas
    assert both.fields["phase"] == "Succeeded" and both.finished
    assert both.deltas == {"waiting": -1, "done": 1, "succeeded": 1}


def test_counters_of_node_items() -> None:
    tasks = [task(W, dispatched=False), task(P), task(S), task(C)]
    c = Counters.of(tasks)
    assert (c.desired, c.waiting, c.active, c.succeeded, c.failed, c.done) == (4, 1, 1, 1, 1, 2)


def test_job_bytes_are_summed_over_its_nodes_when_viewed() -> None:
    a = NodeTaskRecord(node="a", round=0, bytes_done=10, bytes_total=100)
    b = NodeTaskRecord(node="b", round=0, bytes_done=100, bytes_total=100)
    assert job_bytes([a, b, NodeTaskRecord(node="c", round=0)]) == (110, 200)


def test_progress_message_follows_kruise() -> None:
    assert progress_message(4, 1, 1, completed=False) == "job is running, progress 50.0%"
    assert progress_message(3, 1, 0, completed=False) == "job is running, progress 33.3%"
    assert progress_message(0, 0, 0, completed=False) == "job is running, no progress"
    assert progress_message(2, 2, 0, completed=True) == "job has completed"


def test_status_serialises_as_kruise_omitting_empty_optional_fields() -> None:
    status = JobStatus(desired=1, active=1, start_time=START, message="job is running, progress 0.0%")
    assert status.to_dict() == {
        "desired": 1,
        "active": 1,
        "succeeded": 0,
        "failed": 0,
        "startTime": "2024-05-01T10:00:00Z",
        "message": "job is running, progress 0.0%",
    }
    assert JobStatus(desired=1, failed=1, failed_nodes=["a"]).to_dict()["failedNodes"] == ["a"]


# --- Retries --------------------------------------------------------------------------------------


def test_default_pull_plan_is_four_attempts_with_doubling_sleeps() -> None:
    assert RetryPolicy(3, 600).plan() == [
        Attempt(1, 600, 1),
        Attempt(2, 600, 2),
        Attempt(3, 600, 4),
        Attempt(4, 600, 8),
    ]


def test_sleeps_are_capped_at_thirty_seconds() -> None:
    sleeps = [attempt.backoff_seconds for attempt in RetryPolicy(7, 60).plan()]
    assert sleeps == [1, 2, 4, 8, 16, 30, 30, 30]
    assert RetryPolicy(backoff_limit=10_000).backoff_seconds(10_000) == 30


def test_backoff_limit_zero_means_one_attempt() -> None:
    assert RetryPolicy(0, 600).plan() == [Attempt(1, 600, 1)]


def test_attempts_are_cut_to_the_remaining_deadline() -> None:
    # Given 1000 s left: 600 s, then 1 s sleep, leaves 399 s for the second attempt
    plan = RetryPolicy(3, 600).plan(1000)
    # Then the second attempt is cut short and no third one starts
    assert plan == [Attempt(1, 600, 1), Attempt(2, 399, 2)]


def test_no_attempt_starts_after_the_deadline() -> None:
    assert RetryPolicy(3, 600).plan(0) == []
    assert RetryPolicy().attempt(1, deadline_remaining=-5) is None


def test_attempts_beyond_the_backoff_limit_are_refused() -> None:
    policy = RetryPolicy.from_pull_policy(PullPolicy(backoff_limit=1, timeout_seconds=30))
    assert policy.max_attempts == 2
    assert policy.attempt(2) == Attempt(2, 30, 2)
    assert policy.attempt(3) is None


def test_invalid_retry_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="backoff_limit must be >= 0"):
        RetryPolicy(backoff_limit=-1)
    with pytest.raises(ValueError, match="timeout_seconds must be > 0"):
        RetryPolicy(timeout_seconds=0)
    with pytest.raises(ValueError, match="attempt numbers start at 1"):
        RetryPolicy().attempt(0)


def test_a_task_is_due_at_its_paced_start_else_at_its_claim() -> None:
    assert NodeTaskRecord("n", 0).due_at is None  # not sent
    assert NodeTaskRecord("n", 0, dispatched_at=10.0).due_at == 10.0
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, starts_at=610.0).due_at == 610.0
    # a start reserved before a later claim (a round's task claimed again) counts from the claim
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, starts_at=5.0).due_at == 10.0


def test_a_task_held_back_by_the_budget_counts_as_unanswered_from_its_last_hold() -> None:
    assert NodeTaskRecord("n", 0).unclaimed_since is None
    assert NodeTaskRecord("n", 0, dispatched_at=10.0).unclaimed_since == 10.0
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, held_at=700.0).unclaimed_since == 700.0
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, held_at=5.0).unclaimed_since == 10.0
    # held, then given a start: counted from that start
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, held_at=700.0, starts_at=1500.0).unclaimed_since == 1500.0
    assert NodeTaskRecord("n", 0, dispatched_at=10.0, held_at=700.0, starts_at=650.0).unclaimed_since == 650.0
