"""The sweep and the daily round leave a record of their last completed run in the job table. Through their
handlers: tests/unit/functions/test_schedule_run_handlers.py."""

from __future__ import annotations

import pytest

from prewarm.domain.schedules import DAILY_ROUND, RECORDED_SCHEDULES, SWEEP, ScheduleRun
from prewarm.services.schedules import record_run
from tests.support.control_plane import ControlPlane
from tests.support.memory_store import MemoryJobStore


def test_a_recorded_run_is_read_back(plane: ControlPlane) -> None:
    # Given a sweep that ran from t=100 to t=101.5
    record_run(plane.store, SWEEP, started_at=100.0, finished_at=101.5)

    # When the last runs are read
    runs = plane.store.last_runs(RECORDED_SCHEDULES)

    # Then the sweep's is there, and the daily round, which never ran, is not
    assert runs == {SWEEP: ScheduleRun(SWEEP, started_at=100.0, finished_at=101.5)}


def test_each_run_overwrites_the_last_one_so_a_schedule_holds_one_item(plane: ControlPlane) -> None:
    for minute in range(3):
        record_run(plane.store, SWEEP, started_at=60.0 * minute, finished_at=60.0 * minute + 1)

    assert plane.store.last_runs([SWEEP])[SWEEP].finished_at == 121.0
    assert isinstance(plane.store, MemoryJobStore)  # its items are the table's (the contract test holds them so)
    assert [pk for pk, _ in plane.store.item_keys()] == [f"SCHEDULE#{SWEEP}"]


def test_run_records_are_neither_jobs_nor_nodes(plane: ControlPlane) -> None:
    record_run(plane.store, DAILY_ROUND, started_at=1.0, finished_at=2.0)

    assert plane.store.list_jobs() == [] and plane.store.list_nodes() == [] and plane.store.list_rules() == []


@pytest.mark.parametrize(("schedule", "started", "finished", "problem"), [
    ("refresh", 1.0, 2.0, "unknown schedule 'refresh'"),
    (SWEEP, 2.0, 1.0, "cannot finish"),
])
def test_a_wrong_record_is_refused(plane: ControlPlane, schedule: str, started: float, finished: float,
                                   problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        record_run(plane.store, schedule, started_at=started, finished_at=finished)
    assert plane.store.last_runs(RECORDED_SCHEDULES) == {}
