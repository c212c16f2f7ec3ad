"""The sweep and the daily round leave a record of their last completed run in the job table."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm import bootstrap
from prewarm.domain.schedules import DAILY_ROUND, RECORDED_SCHEDULES, SWEEP, ScheduleRun
from prewarm.services.schedules import record_run
from tests.support.control_plane import ControlPlane
from tests.support.events import load_event
from tests.support.handlers import load_handler


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
    items = plane.store.client.scan(TableName=plane.store.table_name)["Items"]
    assert [i["pk"]["S"] for i in items] == [f"SCHEDULE#{SWEEP}"]


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


def test_the_sweep_and_the_daily_round_handlers_record_their_runs(stack: dict[str, Any]) -> None:
    # Given no run recorded yet
    assert bootstrap.store().last_runs(RECORDED_SCHEDULES) == {}

    # When both schedules fire
    load_handler("sweep").lambda_handler(load_event("schedule_sweep"), stack["ctx"])
    load_handler("repull_daily").lambda_handler(load_event("schedule_repull"), stack["ctx"])

    # Then each left its run
    runs = bootstrap.store().last_runs(RECORDED_SCHEDULES)
    assert sorted(runs) == sorted(RECORDED_SCHEDULES)
    assert all(run.finished_at >= run.started_at > 0 for run in runs.values())


def test_a_sweep_that_fails_records_nothing(stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the table is gone")

    monkeypatch.setattr("prewarm.services.schedules.sweep", failing)

    with pytest.raises(RuntimeError):
        load_handler("sweep").lambda_handler(load_event("schedule_sweep"), stack["ctx"])
    assert bootstrap.store().last_runs([SWEEP]) == {}


def test_the_sweep_records_how_the_stacks_own_cluster_answered_and_fails_when_it_did_not(
    stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prewarm.services.ports import ClusterUnavailableError

    monkeypatch.setenv("CLUSTER_NAME", "home")
    bootstrap.reset()
    load_handler("sweep").lambda_handler(load_event("schedule_sweep"), stack["ctx"])
    home = bootstrap.store().get_cluster("home")
    assert home is not None and (home.reachable, home.reason, home.agents) == (True, "", 0)

    def down() -> list[dict[str, Any]]:
        raise ClusterUnavailableError("connection refused")

    monkeypatch.setattr(stack["cluster"], "list_node_metadata", down)
    with pytest.raises(ClusterUnavailableError, match="the stack's own cluster 'home' was not swept: connection"):
        load_handler("sweep").lambda_handler(load_event("schedule_sweep"), stack["ctx"])
    home = bootstrap.store().get_cluster("home")
    assert home is not None and (home.reachable, home.reason) == (False, "connection refused")
    # The own cluster's health item is not a registered cluster
    assert [c.name for c in bootstrap.clusters().served()] == [""]
