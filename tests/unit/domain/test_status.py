"""Node phases, report ordering, Kruise's job status and the retry delays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from prewarm.domain.jobs import CompletionPolicy, ImageListPullJob, ImagePullJob, PullPolicy
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import (
    Attempt,
    FailedImageStatus,
    InvalidTransitionError,
    JobStatus,
    NodeReport,
    ReportKey,
    RetryPolicy,
    aggregate_list_status,
    apply_report,
    can_transition,
    compute_job_status,
    deadline,
    expiry,
    fold_reports,
    is_newer,
    kruise_attempt_plan,
    kubelet_image_backoff,
    transition,
)

W, P, S, F, C = (NodePhase.WAITING, NodePhase.PULLING, NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED)
START = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
ALWAYS = CompletionPolicy()
NEVER = CompletionPolicy(type="Never")


def later(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def status_of(phases: dict[str, NodePhase], policy: CompletionPolicy = ALWAYS, now: float = 30) -> JobStatus:
    return compute_job_status(policy, phases, START, later(now))


# --- Phases and transitions -----------------------------------------------------------------------


def test_terminal_phases() -> None:
    assert {phase for phase in NodePhase if phase.is_terminal} == {S, F, C}


@pytest.mark.parametrize(
    ("current", "new"),
    [(W, P), (W, S), (W, F), (W, C), (P, S), (P, F), (P, C), (C, F), (C, S), (F, S), (W, W), (P, P), (S, S)],
)
def test_forward_and_repeated_moves_are_allowed(current: NodePhase, new: NodePhase) -> None:
    assert can_transition(current, new)
    assert transition(current, new) is new


@pytest.mark.parametrize(("current", "new"), [(P, W), (S, P), (S, W), (F, P), (C, W), (S, F), (S, C), (F, C)])
def test_backward_moves_are_rejected(current: NodePhase, new: NodePhase) -> None:
    assert not can_transition(current, new)
    with pytest.raises(InvalidTransitionError):
        transition(current, new)


def test_rejected_transition_says_why() -> None:
    with pytest.raises(
        InvalidTransitionError, match="cannot move a node from Succeeded to Pulling: Succeeded is final"
    ):
        transition(S, P)
    with pytest.raises(InvalidTransitionError, match="cannot move a node from Pulling to Waiting: phases only move"):
        transition(P, W)


# --- Report ordering ------------------------------------------------------------------------------


def test_report_keys_order_by_round_then_attempt_then_sequence() -> None:
    assert is_newer(ReportKey(1, 0, 0), ReportKey(0, 9, 9))
    assert is_newer(ReportKey(0, 2, 0), ReportKey(0, 1, 7))
    assert is_newer(ReportKey(0, 1, 8), ReportKey(0, 1, 7))
    assert not is_newer(ReportKey(0, 1, 7), ReportKey(0, 1, 7))
    assert not is_newer(ReportKey(0, 1, 6), ReportKey(0, 1, 7))


def test_a_delayed_pulling_report_does_not_undo_success() -> None:
    # Given a node that already reported success
    done = NodeReport("n1", S, ReportKey(0, 1, 5))
    # When an earlier progress report arrives late, even with a higher sequence from a retry
    kept = apply_report(done, NodeReport("n1", P, ReportKey(0, 2, 9)))
    # Then the success stands
    assert kept is done


def test_progress_reports_of_a_later_attempt_replace_earlier_ones() -> None:
    first = NodeReport("n1", P, ReportKey(0, 1, 3), "pulling 10%")
    second = NodeReport("n1", P, ReportKey(0, 2, 1), "retrying")
    assert apply_report(first, second) is second
    assert apply_report(second, first) is second


def test_a_new_round_restarts_a_finished_node() -> None:
    finished = NodeReport("n1", S, ReportKey(0, 1, 4))
    restarted = NodeReport("n1", W, ReportKey(1, 0, 0))
    assert apply_report(finished, restarted) is restarted


def test_a_late_success_corrects_a_failure_declared_by_the_sweep() -> None:
    swept = NodeReport("n1", F, ReportKey(0, 1, 10), "no report for 900 s")
    pulled = NodeReport("n1", S, ReportKey(0, 1, 4))
    assert apply_report(swept, pulled) is pulled
    assert apply_report(pulled, swept) is pulled


def test_reports_of_another_node_are_refused() -> None:
    with pytest.raises(ValueError, match="report for node 'n2' cannot update node 'n1'"):
        apply_report(NodeReport("n1", W, ReportKey(0, 0, 0)), NodeReport("n2", P, ReportKey(0, 1, 0)))


def test_fold_keeps_one_report_per_node() -> None:
    reports = [
        NodeReport("n1", P, ReportKey(0, 1, 1)),
        NodeReport("n2", F, ReportKey(0, 4, 2)),
        NodeReport("n1", S, ReportKey(0, 1, 2)),
    ]
    assert {node: report.phase for node, report in fold_reports(reports).items()} == {"n1": S, "n2": F}


# --- compute_job_status ---------------------------------------------------------------------------


def test_running_job_reports_progress_with_one_decimal() -> None:
    # Given 5 nodes: two finished, one pulling, two waiting
    status = status_of({"n1": S, "n2": F, "n3": P, "n4": W, "n5": W})
    # Then the counts and message are Kruise's
    assert (status.desired, status.active, status.succeeded, status.failed) == (5, 1, 1, 1)
    assert status.failed_nodes == ["n2"]
    assert status.message == "job is running, progress 40.0%"
    assert status.completion_time is None
    assert status.start_time == START


def test_progress_rounds_like_go_formatting() -> None:
    assert status_of({"n1": S, "n2": F, "n3": P}).message == "job is running, progress 66.7%"
    assert status_of({"n1": W, "n2": P, "n3": P}).message == "job is running, progress 0.0%"


def test_job_without_nodes_that_never_completes_has_no_progress() -> None:
    assert status_of({}, NEVER).message == "job is running, no progress"


def test_always_job_without_nodes_completes_at_once() -> None:
    status = status_of({}, ALWAYS, now=5)
    assert status.message == "job has completed"
    assert status.completion_time == later(5)


def test_always_job_completes_when_every_node_finished() -> None:
    status = status_of({"b": F, "a": S, "c": C}, now=90)
    assert status.message == "job has completed"
    assert status.completion_time == later(90)
    assert (status.succeeded, status.failed, status.active) == (1, 2, 0)
    # Cancelled nodes count as failed: the image is not on them.
    assert status.failed_nodes == ["b", "c"]


def test_never_job_keeps_running_when_every_node_finished() -> None:
    status = status_of({"a": S, "b": S}, NEVER)
    assert status.completion_time is None
    assert status.message == "job is running, progress 100.0%"


def test_deadline_fails_the_unfinished_nodes() -> None:
    # Given a job with a 10-minute deadline that has run for 10 minutes
    policy = CompletionPolicy(active_deadline_seconds=600)
    status = compute_job_status(policy, {"a": S, "d": F, "c": P, "b": W}, START, later(600))
    # Then it completes, failing the pulling and waiting nodes, as Kruise does
    assert status.message == "job exceeds activeDeadlineSeconds"
    assert status.completion_time == later(600)
    assert (status.desired, status.active, status.succeeded, status.failed) == (4, 0, 1, 3)
    assert status.failed_nodes == ["b", "c", "d"]


def test_deadline_not_yet_reached_keeps_the_job_running() -> None:
    policy = CompletionPolicy(active_deadline_seconds=600)
    status = compute_job_status(policy, {"a": S, "b": P}, START, later(599))
    assert status.message == "job is running, progress 50.0%"


def test_finished_job_is_not_failed_by_its_deadline() -> None:
    policy = CompletionPolicy(active_deadline_seconds=600)
    status = compute_job_status(policy, {"a": S, "b": F}, START, later(700))
    assert status.message == "job has completed"


def test_completed_status_does_not_change_again() -> None:
    done = status_of({"a": S}, now=60)
    assert compute_job_status(ALWAYS, {"a": F, "b": P}, START, later(120), previous=done) is done


def test_start_time_defaults_to_the_previous_status_or_now() -> None:
    first = compute_job_status(NEVER, {"a": W}, None, later(5))
    assert first.start_time == later(5)
    second = compute_job_status(NEVER, {"a": P}, None, later(50), previous=first)
    assert second.start_time == later(5)


def test_policy_can_be_given_as_the_job_itself() -> None:
    job = ImagePullJob.from_manifest(
        {
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ImagePullJob",
            "metadata": {"name": "web"},
            "spec": {"image": "nginx:1.25", "completionPolicy": {"type": "Never"}},
        }
    )
    assert compute_job_status(job, {"a": S}, START, later(1)).completion_time is None
    assert compute_job_status(job.spec, {"a": S}, START, later(1)).completion_time is None


def test_status_serialises_as_kruise_omitting_empty_optional_fields() -> None:
    assert status_of({"a": P}).to_dict() == {
        "desired": 1,
        "active": 1,
        "succeeded": 0,
        "failed": 0,
        "startTime": "2024-05-01T10:00:00Z",
        "message": "job is running, progress 0.0%",
    }
    assert status_of({"a": F}, now=60).to_dict()["failedNodes"] == ["a"]


def test_deadline_and_expiry_times() -> None:
    with_deadline = CompletionPolicy(active_deadline_seconds=600, ttl_seconds_after_finished=30)
    assert deadline(START, with_deadline) == later(600)
    assert deadline(START, ALWAYS) is None
    assert expiry(later(700), with_deadline) == later(730)
    assert expiry(later(700), ALWAYS) is None


# --- aggregate_list_status ------------------------------------------------------------------------


def list_job(images: list[str], completion: dict[str, Any] | None = None) -> ImageListPullJob:
    return ImageListPullJob.from_manifest(
        {
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ImageListPullJob",
            "metadata": {"name": "base"},
            "spec": {"images": images, "completionPolicy": completion or {"type": "Always"}},
        }
    )


def child(phases: dict[str, NodePhase]) -> JobStatus:
    return compute_job_status(NEVER, phases, START, later(10))


def test_list_status_counts_children_as_kruise_does() -> None:
    # Given three images: one done, one with a failed node and one still pulling, and one not started
    job = list_job(["nginx:1.25", "redis:7", "busybox:1.36", "alpine:3.20"])
    children = {
        "nginx:1.25": child({"n1": S, "n2": S}),
        "redis:7": child({"n1": S, "n2": F}),
        "busybox:1.36": child({"n1": P, "n2": S}),
    }
    # When the list job's status is aggregated
    status = aggregate_list_status(job, children, START, later(60))
    # Then it counts desired images, active, completed and succeeded children, and lists the failure
    assert (status.desired, status.active, status.completed, status.succeeded) == (4, 1, 2, 1)
    redis_job = next(c.name for c in job.child_jobs() if c.spec.image == "redis:7")
    assert status.failed_image_statuses == [
        FailedImageStatus(image_pull_job=redis_job, name="redis:7", message="failed on 1 of 2 nodes: n2")
    ]
    assert status.completion_time is None


def test_list_job_completes_when_every_child_completed() -> None:
    job = list_job(["nginx:1.25", "redis:7"])
    children = {"nginx:1.25": child({"n1": S}), "redis:7": child({"n1": F})}
    status = aggregate_list_status(job, children, START, later(60))
    assert status.completion_time == later(60)
    assert status.to_dict()["failedImageStatuses"][0]["imagePullJob"].startswith("base-")


def test_never_list_job_does_not_complete() -> None:
    job = list_job(["nginx:1.25"], {"type": "Never"})
    assert aggregate_list_status(job, {"nginx:1.25": child({"n1": S})}, START, later(60)).completion_time is None


def test_failed_image_message_lists_at_most_ten_nodes() -> None:
    phases = {f"n{i:02d}": F for i in range(12)}
    status = aggregate_list_status(list_job(["nginx:1.25"]), {"nginx:1.25": child(phases)}, START, later(9))
    (failed,) = status.failed_image_statuses
    assert failed.message == "failed on 12 of 12 nodes: n00, n01, n02, n03, n04, n05, n06, n07, n08, n09 and 2 more"


# --- Retries --------------------------------------------------------------------------------------


def test_default_pull_plan_is_four_attempts_with_doubling_sleeps() -> None:
    assert kruise_attempt_plan(3, 600) == [
        Attempt(1, 600, 1),
        Attempt(2, 600, 2),
        Attempt(3, 600, 4),
        Attempt(4, 600, 8),
    ]


def test_sleeps_are_capped_at_thirty_seconds() -> None:
    sleeps = [attempt.backoff_seconds for attempt in kruise_attempt_plan(7, 60)]
    assert sleeps == [1, 2, 4, 8, 16, 30, 30, 30]
    assert RetryPolicy(backoff_limit=10_000).backoff_seconds(10_000) == 30


def test_backoff_limit_zero_means_one_attempt() -> None:
    assert kruise_attempt_plan(0, 600) == [Attempt(1, 600, 1)]


def test_attempts_are_cut_to_the_remaining_deadline() -> None:
    # Given 1000 s left: 600 s, then 1 s sleep, leaves 399 s for the second attempt
    plan = kruise_attempt_plan(3, 600, deadline_remaining=1000)
    # Then the second attempt is cut short and no third one starts
    assert plan == [Attempt(1, 600, 1), Attempt(2, 399, 2)]


def test_no_attempt_starts_after_the_deadline() -> None:
    assert kruise_attempt_plan(3, 600, deadline_remaining=0) == []
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


def test_kubelet_image_backoff_doubles_from_ten_seconds_to_five_minutes() -> None:
    assert [kubelet_image_backoff(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert kubelet_image_backoff(10_000) == 300
    with pytest.raises(ValueError, match="failures must be >= 0"):
        kubelet_image_backoff(-1)
