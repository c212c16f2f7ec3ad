"""AdvancedCronJobs through the CLI on a local stack: apply warns of a schedule with no time zone, and `describe
cronjob` shows the spec, the last and next run times, the runs, and the schedules EventBridge Scheduler holds."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from prewarm.adapters.scheduler import SchedulerCronSchedules
from prewarm.domain.cronjobs import ZONE_NOT_GIVEN
from prewarm.domain.jobs import job_key
from prewarm.domain.kubernetes import format_time
from prewarm.services.cron_jobs import run_due, sync_schedules
from prewarm_devtools.sam.stack import LocalStack
from tests.support.cli import Run
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.integration


def cron_yaml(name: str, zone: str | None, paused: bool = False) -> str:
    return textwrap.dedent(f"""\
        apiVersion: apps.kruise.io/v1beta1
        kind: AdvancedCronJob
        metadata:
          name: {name}
          namespace: ml
        spec:
          schedule: "0 18 * * MON-FRI"
          {f'timeZone: {zone}' if zone else ''}
          paused: {str(paused).lower()}
          startingDeadlineSeconds: 300
          template:
            imageListPullJobTemplate:
              spec:
                images: [registry.example.com/ml/batch:2.3, registry.example.com/ml/tools:1.9]
                selector: {{matchLabels: {{pool: gpu}}}}
        """)


def test_apply_warns_of_a_schedule_without_a_time_zone_and_only_then(prewarm: Run, tmp_path: Path) -> None:
    bare, zoned = tmp_path / "bare.yaml", tmp_path / "zoned.yaml"
    bare.write_text(cron_yaml("warn-bare", None))
    zoned.write_text(cron_yaml("warn-zoned", "Asia/Shanghai"))

    unzoned = prewarm("apply", "-f", str(bare))
    with_zone = prewarm("apply", "-f", str(zoned))

    assert (unzoned.exit_code, unzoned.stdout) == (0, "advancedcronjob.apps.kruise.io/warn-bare created\n")
    assert unzoned.stderr == f"Warning: {bare} document 1: {ZONE_NOT_GIVEN}\n"
    assert (with_zone.exit_code, with_zone.stderr) == (0, "")


def test_describe_cronjob_shows_spec_times_runs_and_the_schedules_on_aws(
        prewarm: Run, tmp_path: Path, local_stack: LocalStack, control_plane: ControlPlane) -> None:
    # Given a cron job applied, its schedule put as dispatch_job puts it, and two runs, the first finished
    manifest = tmp_path / "cron.yaml"
    manifest.write_text(cron_yaml("gpu-batch", "Asia/Shanghai"))
    assert prewarm("apply", "-f", str(manifest)).exit_code == 0
    store, key = control_plane.store, job_key("ml", "gpu-batch")
    schedules = SchedulerCronSchedules(local_stack.env()["CRON_SCHEDULE_PREFIX"], "arn:aws:lambda:us-east-1:"
                                       "123456789012:function:run", "arn:aws:iam::123456789012:role/run",
                                       client=local_stack.scheduler)
    sync_schedules(schedules, store.get_cron_job(key), None)
    now = control_plane.now()
    first = run_due(store, key, scheduled_at=now - 120, now=now - 120).run
    store.set_job_fields(job_key("ml", first), {"completion_time": now - 60})  # finished, nothing pulled
    for child in store.get_job(job_key("ml", first)).children:  # type: ignore[union-attr]
        store.set_job_fields(job_key("ml", child), {"completion_time": now - 60})
    second = run_due(store, key, scheduled_at=now - 30, now=now - 30).run

    # When it is described
    described = prewarm("describe", "cronjob", "gpu-batch", "-n", "ml")

    # Then the spec, the times, the runs and Scheduler's schedule are shown
    assert described.exit_code == 0, described.stderr
    text = described.stdout
    for line in ("Schedule:", "0 18 * * MON-FRI"), ("Time Zone:", "Asia/Shanghai"), \
            ("Concurrency Policy:", "Replace"), ("Paused:", "false"), ("Starting Deadline:", "300s"), \
            ("Active Runs:", second), ("Last Schedule Time:", format_time(now - 30)):
        assert any(line[0] in row and line[1] in row for row in text.splitlines()), (line, text)
    next_line = next(row for row in text.splitlines() if row.startswith("Next Run Time:"))
    following = store.get_cron_job(key).job.spec.next_run(now)  # type: ignore[union-attr]
    assert following is not None and format_time(following) in next_line and "(in " in next_line
    assert f"{first}   {format_time(now - 120)}   Succeeded" in text
    (name,) = [s.name for s in schedules.get_schedules(key)]
    assert f"{name}   cron(0 18 ? * 2-6 *)   Asia/Shanghai   ENABLED" in text
    assert "Differs from the spec" not in text

    # And once paused in the table but not on AWS, the difference is named and no next run is given
    manifest.write_text(cron_yaml("gpu-batch", "Asia/Shanghai", paused=True))
    assert prewarm("apply", "-f", str(manifest)).exit_code == 0
    paused = prewarm("describe", "cronjob", "gpu-batch", "-n", "ml").stdout
    assert "Next Run Time:" in paused and "<none> (paused)" in paused
    assert "Differs from the spec: enabled while paused" in paused


def test_describe_a_missing_cronjob_exits_1_naming_it(prewarm: Run) -> None:
    result = prewarm("describe", "cronjob", "nope", "-n", "ml")
    assert result.exit_code == 1
    assert 'advancedcronjob "nope" not found in namespace "ml"' in result.stderr
