"""Crash points that once lost a message or did the work twice, pinned (the slow suite tries them all)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from prewarm import bootstrap
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.schedules import repull_daily
from tests.reliability.faults import Fault
from tests.reliability.scenarios import KEY, crash_runs, describe
from tests.reliability.simulation import Driver, Plane, moto_aws
from tests.support.cluster import make_node
from tests.support.events import load_event
from tests.support.handlers import load_handler
from tests.support.manifests import job_doc

PINNED = {
    # sweep cancelled node by node, then sent the cancels: a retry found the nodes cancelled and sent none
    "deadline cancels survive a crash between the node updates": (
        "deadline_passes_with_nodes_in_flight", Fault("store.apply_updates", 2, "before")),
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
    # the daily re-pull retried after bumping a round bumped it again: every node pulled twice
    "a retried daily re-pull starts one round": (
        "daily_round_of_a_never_job", Fault("store.set_job_fields", 1, "after")),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_pinned_crash_point_converges_on_redelivery(case: str) -> None:
    # Given a scenario and a crash point that once diverged
    scenario, fault = PINNED[case]
    # When it crashes there and the input is delivered again
    _, failures = crash_runs(scenario, [fault])
    # Then the run ends as the fault-free run does
    assert not failures, describe(failures)


def test_a_daily_repull_retried_after_its_round_was_planned_starts_no_second_round() -> None:
    with moto_aws() as (ddb, sqs):
        # Given a Never job whose daily round was started and planned
        plane = Plane(ddb, sqs, "repull")
        d = Driver(plane)
        plane.add_nodes("n0")
        d.apply(job_doc(completionPolicy={"type": "Never"}))
        d.work()
        scheduled = plane.clock()
        assert repull_daily(plane.store, scheduled_time=scheduled) == [KEY]
        d.stream()
        d.work()
        # When the scheduler retries the same invocation, then the next day's arrives
        retried = repull_daily(plane.store, scheduled_time=scheduled)
        next_day = repull_daily(plane.store, scheduled_time=plane.clock() + 86400)
        # Then the retry starts nothing and the next day starts round 2
        assert (retried, next_day) == ([], [KEY])
        record = plane.real_store.get_job(KEY)
        assert record is not None and record.round == 2


def test_the_repull_handler_passes_the_schedules_time_so_its_retries_start_no_round(stack: dict[str, Any]) -> None:
    # Given a planned Never job and the scheduler's event for a time after it was planned
    store, cluster = bootstrap.store(), stack["cluster"]
    cluster.nodes.append(make_node("n0"))
    apply_manifest(store, job_doc(completionPolicy={"type": "Never"}), now=time.time() - 60)
    plan_job(store, cluster, bootstrap.queues(), KEY, now=time.time() - 60)
    event = load_event("schedule_repull") | {"scheduled_time": datetime.now(UTC).isoformat()}
    handler = load_handler("repull_daily")
    # When the invocation runs, its round is planned, and the same invocation is retried
    first = handler.lambda_handler(event, stack["ctx"])
    plan_job(store, cluster, bootstrap.queues(), KEY, now=time.time())
    retried = handler.lambda_handler(event | {"attempt_number": "2"}, stack["ctx"])
    # Then only the first started a round
    assert (first, retried) == ({"rounds_started": [KEY]}, {"rounds_started": []})
