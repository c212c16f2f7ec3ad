"""The counting rules as a table: what every report the rules accept does to the job's counters and to
its node's item, what removing a node in each phase does, and the times and durations recorded.

The counters must always equal a recount of the node items (`Counters.of`): each table row is checked
against that recount too, so a rule and the counters the job shows cannot drift apart.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import pytest

from prewarm.domain.messages import NodePhase, StatusReport
from prewarm.domain.status import (
    COUNTERS,
    Counters,
    JobStatus,
    NodeTaskRecord,
    RetryPolicy,
    applied,
    job_bytes,
    merged,
    removal_deltas,
    report_change,
)

W, P, S, F, C = (NodePhase.WAITING, NodePhase.PULLING, NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED)
REPORTED = (P, S, F, C)  # an agent never reports Waiting
NOW = 500.0


def node(phase: NodePhase, *, dispatched: bool = True, attempt: int = 1, seq: int = 5, name: str = "n1",
         started_at: float | None = 100.0) -> NodeTaskRecord:
    return NodeTaskRecord(node=name, round=0, phase=phase, dispatched_at=90.0 if dispatched else None,
                          attempt=attempt if phase is not W else 0, seq=seq if phase is not W else 0,
                          started_at=started_at if phase is not W and dispatched else None)


def report(phase: NodePhase, *, attempt: int = 1, seq: int = 6, **fields: Any) -> StatusReport:
    return StatusReport(job="default/web", job_uid="u1", round=0, node="n1", phase=phase, attempt=attempt, seq=seq,
                        **fields)


def nonzero(deltas: Any) -> dict[str, int]:
    return {k: v for k, v in dict(deltas).items() if v}


def recount_deltas(before: NodeTaskRecord, after: NodeTaskRecord) -> dict[str, int]:
    """How the counters move by recounting the node items before and after."""
    old, new = Counters.of([before]), Counters.of([after])
    names = (*COUNTERS, "done")
    return nonzero({name: getattr(new, name) - getattr(old, name) for name in names})


# Each report the counting rules accept, from each phase a node can be in: (stored phase, dispatched,
# reported phase, from a later attempt, the counters' deltas). A Cancelled node may never have been
# dispatched: the deadline cancels waiting nodes too.
FINISH_SUCCEEDED = {"active": -1, "done": 1, "succeeded": 1}
FINISH_FAILED = {"active": -1, "done": 1, "failed": 1}
CORRECTED_TO_SUCCEEDED = {"failed": -1, "succeeded": 1}
TABLE: list[tuple[NodePhase, bool, NodePhase, bool, dict[str, int]]] = [
    # A dispatched node is active until it finishes.
    (W, True, P, False, {}),
    (W, True, S, False, FINISH_SUCCEEDED),
    (W, True, F, False, FINISH_FAILED),
    (W, True, C, False, FINISH_FAILED),
    # A node never dispatched (its task was sent by a run that crashed before recording it) leaves waiting.
    (W, False, P, False, {"waiting": -1, "active": 1}),
    (W, False, S, False, {"waiting": -1, "done": 1, "succeeded": 1}),
    (W, False, F, False, {"waiting": -1, "done": 1, "failed": 1}),
    (W, False, C, False, {"waiting": -1, "done": 1, "failed": 1}),
    # Progress: a newer report of the same running phase moves no counter, from any attempt.
    (P, True, P, False, {}),
    (P, True, P, True, {}),
    (P, True, S, False, FINISH_SUCCEEDED),
    (P, True, S, True, FINISH_SUCCEEDED),
    (P, True, F, False, FINISH_FAILED),
    (P, True, F, True, FINISH_FAILED),
    (P, True, C, False, FINISH_FAILED),
    (P, True, C, True, FINISH_FAILED),
    # Between final phases only a truer one is taken; Cancelled and Failed are both counted failed.
    (C, True, F, False, {}),
    (C, True, F, True, {}),
    (C, True, S, False, CORRECTED_TO_SUCCEEDED),
    (C, True, S, True, CORRECTED_TO_SUCCEEDED),
    (C, False, F, False, {}),
    (C, False, F, True, {}),
    (C, False, S, False, CORRECTED_TO_SUCCEEDED),
    (C, False, S, True, CORRECTED_TO_SUCCEEDED),
    (F, True, S, False, CORRECTED_TO_SUCCEEDED),
    (F, True, S, True, CORRECTED_TO_SUCCEEDED),
    # The same final phase from a later attempt (the node pulled again, `healing`) is recorded, not recounted.
    (C, True, C, True, {}),
    (C, False, C, True, {}),
    (F, True, F, True, {}),
    (S, True, S, True, {}),
]


def change_for(stored: NodePhase, dispatched: bool, new: NodePhase, later_attempt: bool) -> Any:
    return report_change(node(stored, dispatched=dispatched), report(new, attempt=2 if later_attempt else 1), now=NOW)


@pytest.mark.parametrize(("stored", "dispatched", "new", "later_attempt", "deltas"), TABLE)
def test_each_accepted_report_moves_the_counters_as_a_recount_of_the_nodes_would(
    stored: NodePhase, dispatched: bool, new: NodePhase, later_attempt: bool, deltas: dict[str, int]
) -> None:
    before = node(stored, dispatched=dispatched)
    change = change_for(stored, dispatched, new, later_attempt)
    assert change is not None, "the rules accept this report"
    assert nonzero(change.deltas) == deltas
    assert recount_deltas(before, applied(before, change)) == deltas
    assert change.counts == bool(deltas)
    # A node frees its slot once: when it first reaches a final phase.
    assert change.finished == (new.is_terminal and not stored.is_terminal)


def test_the_table_covers_every_report_the_rules_accept_and_only_those() -> None:
    # Every stored phase and dispatch state a node can have, every reported phase, this attempt or a later one
    # (a node that has reported is dispatched: the report records it, so only Waiting and Cancelled can lack it).
    states = [(W, True), (W, False), (P, True), (C, True), (C, False), (F, True), (S, True)]
    accepted = {
        (stored, dispatched, new, later)
        for (stored, dispatched), new, later in product(states, REPORTED, (False, True))
        if change_for(stored, dispatched, new, later) is not None
    }
    # Waiting has no attempt yet: a first report is never "later" than one that was not sent.
    table = {(stored, dispatched, new, later) for stored, dispatched, new, later, _ in TABLE}
    assert accepted - table <= {(W, d, n, True) for d in (True, False) for n in REPORTED}
    assert table <= accepted


@pytest.mark.parametrize(("stored", "new"), [(S, F), (S, C), (S, P), (F, C), (F, P), (C, P)])
def test_a_report_that_would_move_a_node_backwards_is_refused_from_any_attempt(
    stored: NodePhase, new: NodePhase
) -> None:
    assert change_for(stored, True, new, False) is None
    assert change_for(stored, True, new, True) is None


@pytest.mark.parametrize("final", [S, F, C])
def test_the_same_final_report_again_from_the_same_attempt_is_a_duplicate(final: NodePhase) -> None:
    assert change_for(final, True, final, False) is None


def test_a_final_report_of_a_later_attempt_is_recorded_on_the_node() -> None:
    # Given a node whose image was removed and pulled again by its agent (healing)
    healed = report_change(node(S, attempt=1, seq=5), report(S, attempt=2, seq=9, image_id="sha256:new"), now=NOW)
    # Then the node item shows the new pull, and no counter moves
    assert healed is not None and not healed.counts and not healed.finished
    assert (healed.fields["attempt"], healed.fields["seq"], healed.fields["image_id"]) == (2, 9, "sha256:new")


# --- Removing a node ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "dispatched", "deltas"),
    [
        (W, False, {"desired": -1, "waiting": -1}),
        (W, True, {"desired": -1, "active": -1}),
        (P, True, {"desired": -1, "active": -1}),
        (S, True, {"desired": -1, "succeeded": -1, "done": -1}),
        (F, True, {"desired": -1, "failed": -1, "done": -1}),
        (C, True, {"desired": -1, "failed": -1, "done": -1}),
        (C, False, {"desired": -1, "failed": -1, "done": -1}),
    ],
)
def test_removing_a_node_takes_it_out_of_the_counter_it_is_counted_in(
    stored: NodePhase, dispatched: bool, deltas: dict[str, int]
) -> None:
    task = node(stored, dispatched=dispatched)
    assert removal_deltas(task) == deltas
    # The same as recounting without it
    counted = Counters.of([task])
    assert {k: -v for k, v in deltas.items()} == nonzero({k: getattr(counted, k) for k in (*COUNTERS, "done")})


# --- Counters of many nodes ------------------------------------------------------------------------


def test_counters_of_node_items_count_each_node_once_in_its_own_counter() -> None:
    tasks = [
        node(W, dispatched=False, name="w1"), node(W, dispatched=False, name="w2"),
        node(W, name="a1"), node(P, name="a2"), node(P, name="a3"),
        node(S, name="s1"), node(S, name="s2"),
        node(F, name="f1"), node(C, name="f2"), node(C, dispatched=False, name="f3"),
    ]
    c = Counters.of(tasks)
    assert (c.desired, c.waiting, c.active, c.succeeded, c.failed, c.done) == (10, 2, 3, 2, 3, 5)
    assert Counters.of([]) == Counters()


# --- Times and durations ---------------------------------------------------------------------------


def test_a_first_report_starts_the_node_at_the_time_the_agent_gives_or_else_now() -> None:
    fresh = node(W)
    given = report_change(fresh, report(P, started_at=420.0), now=NOW)
    assert given is not None and given.fields["started_at"] == 420.0
    untold = report_change(fresh, report(P), now=NOW)
    assert untold is not None and untold.fields["started_at"] == NOW
    assert given.fields["updated_at"] == untold.fields["updated_at"] == NOW


def test_a_later_report_keeps_the_start_already_recorded() -> None:
    change = report_change(node(P, started_at=100.0), report(P, started_at=420.0), now=NOW)
    assert change is not None and "started_at" not in change.fields


def test_dispatch_time_is_kept_once_recorded() -> None:
    change = report_change(node(P), report(S), now=NOW)
    assert change is not None and "dispatched_at" not in change.fields
    first = report_change(node(W, dispatched=False), report(P), now=NOW)
    assert first is not None and first.fields["dispatched_at"] == NOW


def test_a_final_report_records_when_it_finished_and_how_long_the_pull_took() -> None:
    # The agent's own times win over the control plane's clock
    timed = report_change(node(P, started_at=100.0), report(S, finished_at=160.0), now=NOW)
    assert timed is not None and timed.fields["finished_at"] == 160.0 and timed.seconds == 60.0
    # A final report without a finish time finishes the node now
    untimed = report_change(node(P, started_at=100.0), report(F), now=NOW)
    assert untimed is not None and untimed.fields["finished_at"] == NOW and untimed.seconds == NOW - 100.0
    # A node whose first report is final is timed from the start the report gives
    quick = report_change(node(W), report(S, started_at=150.0, finished_at=170.0), now=NOW)
    assert quick is not None and quick.seconds == 20.0 and quick.fields["started_at"] == 150.0


def test_only_the_report_that_finishes_a_node_has_a_duration() -> None:
    progress = report_change(node(P), report(P, bytes_done=1), now=NOW)
    assert progress is not None and progress.seconds is None and "finished_at" not in progress.fields
    corrected = report_change(node(F), report(S, finished_at=480.0), now=NOW)
    assert corrected is not None and corrected.seconds is None and corrected.fields["finished_at"] == 480.0


def test_a_change_names_its_node_phase_and_the_report_it_records() -> None:
    change = report_change(node(P, attempt=1, seq=5), report(F, attempt=2, seq=8, message="pull failed"), now=NOW)
    assert change is not None
    assert (change.node, change.phase) == ("n1", F)
    assert {k: change.fields[k] for k in ("phase", "attempt", "seq", "message", "updated_at")} == {
        "phase": "Failed", "attempt": 2, "seq": 8, "message": "pull failed", "updated_at": NOW,
    }


# --- Merging a node's changes of one batch -----------------------------------------------------------


def test_a_batch_merged_keeps_the_last_phase_and_fields_and_the_finishing_duration() -> None:
    # Given a waiting node's Pulling, Failed and then truer Succeeded reports in one batch
    task = node(W, dispatched=False)
    changes = []
    for r, at in ((report(P, seq=6, started_at=400.0), 401.0), (report(F, seq=7, finished_at=430.0), 431.0),
                  (report(S, seq=8, finished_at=440.0, message="pulled"), 441.0)):
        change = report_change(task, r, now=at)
        assert change is not None
        changes.append(change)
        task = applied(task, change)
    # When they are merged into one write
    write = merged(changes)
    # Then it is the node's, in its last phase with the last fields, timed by the report that finished it
    assert (write.node, write.phase, write.finished) == ("n1", S, True)
    assert write.fields["phase"] == "Succeeded" and write.fields["message"] == "pulled"
    assert write.fields["finished_at"] == 440.0 and write.fields["updated_at"] == 441.0
    assert write.seconds == 30.0
    assert write.deltas == {"waiting": -1, "done": 1, "succeeded": 1}


def test_a_merged_progress_batch_has_no_duration_and_no_deltas() -> None:
    first = report_change(node(P), report(P, seq=6, bytes_done=1), now=NOW)
    assert first is not None
    second = report_change(applied(node(P), first), report(P, seq=7, bytes_done=2), now=NOW + 1)
    assert second is not None
    write = merged([first, second])
    assert write.seconds is None and write.deltas == {} and not write.finished
    assert write.fields["bytes_done"] == 2 and write.phase is P


# --- Bytes -----------------------------------------------------------------------------------------


def test_a_success_keeps_the_bytes_it_reports_and_falls_back_to_the_image_size() -> None:
    sized = report_change(node(P), report(S, bytes_done=90, bytes_total=100, size_bytes=120), now=NOW)
    assert sized is not None and (sized.fields["bytes_done"], sized.fields["bytes_total"]) == (90, 100)
    quick = report_change(node(P), report(S, size_bytes=120), now=NOW)
    assert quick is not None and (quick.fields["bytes_done"], quick.fields["bytes_total"]) == (120, 120)


def test_a_failure_does_not_claim_the_image_size_it_reports() -> None:
    failed = report_change(node(P), report(F, size_bytes=120), now=NOW)
    assert failed is not None and failed.fields["bytes_done"] is None and failed.fields["bytes_total"] is None


def test_a_node_that_has_not_said_how_much_it_pulled_adds_nothing_done() -> None:
    sized_only = NodeTaskRecord(node="a", round=0, bytes_total=100)
    assert job_bytes([sized_only]) == (0, 100)


# --- Status and retry defaults ---------------------------------------------------------------------


def test_a_status_without_a_message_leaves_it_out() -> None:
    assert "message" not in JobStatus(desired=1).to_dict()


def test_the_retry_policy_defaults_are_kruises() -> None:
    # kruise-daemon: pullPolicy.backoffLimit 3 and timeoutSeconds 600 when the spec leaves them out
    assert (RetryPolicy().backoff_limit, RetryPolicy().timeout_seconds, RetryPolicy().max_attempts) == (3, 600.0, 4)


def test_a_retry_policy_takes_any_positive_timeout_and_time_left() -> None:
    policy = RetryPolicy(timeout_seconds=0.5)
    assert policy.attempt(1) is not None and policy.attempt(1).timeout_seconds == 0.5  # type: ignore[union-attr]
    short = RetryPolicy().attempt(1, deadline_remaining=0.5)
    assert short is not None and short.timeout_seconds == 0.5
    with pytest.raises(ValueError, match="attempt numbers start at 1, got 0"):
        RetryPolicy().backoff_seconds(0)
