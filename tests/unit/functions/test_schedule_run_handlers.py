"""The sweep and the daily round handlers record their runs in the job table (moto in-process), and the
sweep records how the stack's own cluster answered."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm import bootstrap
from prewarm.domain.schedules import RECORDED_SCHEDULES, SWEEP
from tests.support.events import load_event
from tests.support.handlers import load_handler


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


def test_a_cron_jobs_schedule_makes_its_run_for_the_time_it_was_due(stack: dict[str, Any]) -> None:
    from pathlib import Path

    import yaml

    from prewarm.domain.jobs import job_key
    from prewarm.services.jobs import apply_manifest

    event = load_event("schedule_run_cron_job")
    handler = load_handler("run_cron_job")
    # Given no such cron job, the run is skipped and says why
    assert handler.lambda_handler(event, stack["ctx"])["skipped"] == "the cron job is gone"

    # Given the sample's cron job, the run is the ImageListPullJob of the scheduled time, once
    sample = Path(__file__).resolve().parents[3] / "samplefiles" / "jobs" / "advancedcronjob-batch-images.yaml"
    (batch, _) = yaml.safe_load_all(sample.read_text())
    apply_manifest(bootstrap.store(), batch, now=1_795_000_000.0)
    made = handler.lambda_handler(event, stack["ctx"])
    assert made["run"] == "gpu-batch-images-1796032800" and made["skipped"] == ""
    assert bootstrap.store().get_job(job_key("ml", made["run"])) is not None
    assert handler.lambda_handler(event, stack["ctx"])["run"] == made["run"]  # a retry makes the same run
