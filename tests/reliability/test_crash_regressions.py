"""Crash points that once lost a message or did the work twice, pinned (the slow suite tries them all)."""

from __future__ import annotations

import pytest

from tests.reliability.faults import Fault
from tests.reliability.scenarios import crash_runs, describe

PINNED = {
    # sweep cancelled node by node, then sent the cancels: a retry found the nodes cancelled and sent none
    "deadline cancels survive a crash between the node updates": (
        "deadline_passes_with_nodes_in_flight", Fault("store.apply_update", 2, "before")),
    "deadline cancels survive a crash before they are sent": (
        "deadline_passes_with_nodes_in_flight", Fault("queues.send_many", 1, "before")),
    # a new round overwrote the old round's items, then cancelled: a retry found nothing to cancel
    "superseded pulls are cancelled after a crash before the plan is committed": (
        "new_image_starts_a_new_round", Fault("store.commit_plan", 1, "before")),
    "superseded pulls are cancelled after a crash before the sends": (
        "new_image_starts_a_new_round", Fault("queues.send_many", 1, "before")),
    # a re-plan removed a deselected node's item, then cancelled it: a retry no longer saw the node
    "a deselected node is cancelled after a crash between its removal and its cancel": (
        "selector_edit_replans_the_round", Fault("queues.send", 1, "before")),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_pinned_crash_point_converges_on_redelivery(case: str) -> None:
    # Given a scenario and a crash point that once diverged
    scenario, fault = PINNED[case]
    # When it crashes there and the input is delivered again
    _, failures = crash_runs(scenario, [fault])
    # Then the run ends as the fault-free run does
    assert not failures, describe(failures)
