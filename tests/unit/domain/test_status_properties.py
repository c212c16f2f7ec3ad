"""Properties of the counting rules: order, duplication and batching of reports never change the outcome."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prewarm.domain.messages import NodePhase, StatusReport
from prewarm.domain.status import (
    COUNTERS,
    NodeChange,
    NodeTaskRecord,
    applied,
    can_transition,
    merged,
    precedence,
    report_change,
)

FINAL = [NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED]


@st.composite
def agent_reports(draw: st.DrawFn) -> list[StatusReport]:
    """What one agent sends for one node in one round: progress with growing (attempt, seq), then one final report."""
    reports = []
    seq = 0
    for attempt in range(1, draw(st.integers(1, 3)) + 1):
        for _ in range(draw(st.integers(0, 3))):
            seq += 1
            reports.append(StatusReport(job="d/j", job_uid="u", round=0, node="n", phase=NodePhase.PULLING,
                                        attempt=attempt, seq=seq, bytes_done=seq * 10, bytes_total=100))
    if draw(st.booleans()):
        seq += 1
        reports.append(StatusReport(job="d/j", job_uid="u", round=0, node="n", phase=draw(st.sampled_from(FINAL)),
                                    attempt=attempt, seq=seq, message="done"))
    return reports


def apply_all(task: NodeTaskRecord, delivered: list[StatusReport]) -> tuple[NodeTaskRecord, dict[str, int]]:
    """Applies reports one by one, as separate batches would; returns the node and the summed counter deltas."""
    deltas: dict[str, int] = {}
    for report in delivered:
        change = report_change(task, report, now=1000.0)
        if change is not None:
            task = applied(task, change)
            for name, delta in change.deltas.items():
                deltas[name] = deltas.get(name, 0) + delta
    return task, {k: v for k, v in deltas.items() if v}


def start(dispatched: bool) -> NodeTaskRecord:
    return NodeTaskRecord(node="n", round=0, dispatched_at=10.0 if dispatched else None)


def state(task: NodeTaskRecord) -> tuple[object, ...]:
    return (task.phase, task.attempt, task.seq, task.bytes_done, task.bytes_total, task.message)


@given(sent=agent_reports(), data=st.data(), dispatched=st.booleans())
def test_final_state_and_counters_are_the_same_for_any_order_and_duplication(
    sent: list[StatusReport], data: st.DataObject, dispatched: bool
) -> None:
    # Given an agent's reports delivered shuffled, some more than once
    duplicated = sent + data.draw(st.lists(st.sampled_from(sent), max_size=6)) if sent else []
    delivered = data.draw(st.permutations(duplicated))
    # Then the node and the job counters end as for in-order, once-only delivery
    expected_task, expected_deltas = apply_all(start(dispatched), sent)
    task, deltas = apply_all(start(dispatched), delivered)
    assert state(task) == state(expected_task)
    assert deltas == expected_deltas
    # And the counters moved the node out of waiting/active into exactly one final counter
    if task.phase.is_terminal:
        assert sum(deltas.get(c, 0) for c in COUNTERS) == 0 and deltas.get("done") == 1


@given(sent=agent_reports(), data=st.data(), dispatched=st.booleans())
def test_a_batch_merged_into_one_write_equals_its_reports_applied_one_by_one(
    sent: list[StatusReport], data: st.DataObject, dispatched: bool
) -> None:
    batch = sorted(data.draw(st.permutations(sent)), key=precedence)
    changes: list[NodeChange] = []
    task = start(dispatched)
    for report in batch:
        change = report_change(task, report, now=1000.0)
        if change is not None:
            changes.append(change)
            task = applied(task, change)
    one_by_one, deltas = apply_all(start(dispatched), sent)
    if changes:
        write = merged(changes)
        assert state(applied(start(dispatched), write)) == state(one_by_one)
        assert dict(write.deltas) == deltas


@given(delivered=st.lists(agent_reports(), max_size=3).map(lambda rs: [r for group in rs for r in group]))
def test_a_node_never_moves_backwards_within_a_round(delivered: list[StatusReport]) -> None:
    task = start(True)
    for report in delivered:
        change = report_change(task, report, now=1000.0)
        if change is not None:
            after = applied(task, change)
            assert can_transition(task.phase, after.phase)
            task = after
