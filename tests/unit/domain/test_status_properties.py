"""Properties of report handling: order and duplication of reports never change the outcome."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeReport, ReportKey, apply_report, can_transition, fold_reports

reports = st.builds(
    NodeReport,
    node=st.sampled_from(["n1", "n2", "n3"]),
    phase=st.sampled_from(list(NodePhase)),
    key=st.builds(ReportKey, st.integers(0, 2), st.integers(0, 3), st.integers(0, 5)),
    message=st.sampled_from(["", "timeout", "pulled"]),
)


@given(sent=st.lists(reports, max_size=12), data=st.data())
def test_final_state_is_the_same_for_any_order_and_duplication(sent: list[NodeReport], data: st.DataObject) -> None:
    # Given reports delivered shuffled, with some delivered more than once
    duplicated = sent + data.draw(st.lists(st.sampled_from(sent), max_size=6)) if sent else []
    delivered = data.draw(st.permutations(duplicated))
    # Then the state kept for every node is the same as for in-order, once-only delivery
    assert fold_reports(delivered) == fold_reports(sent)


@given(delivered=st.lists(reports, max_size=12))
def test_a_node_never_moves_backwards_within_a_round(delivered: list[NodeReport]) -> None:
    kept: dict[str, NodeReport] = {}
    for report in delivered:
        before = kept.get(report.node)
        after = apply_report(before, report)
        if before is not None:
            # A later round may restart the node; within a round, phases only move forward.
            assert after.key.round >= before.key.round
            if after.key.round == before.key.round:
                assert can_transition(before.phase, after.phase)
        kept[report.node] = after
