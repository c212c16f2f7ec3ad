"""AdvancedCronJobs on a real local stack, every minute (`* * * * *`), side by side on one stack for two
minutes: a cron job's run is made on time and pulls onto the node; `Forbid` skips a run while one is active,
`Replace` deletes the active run for the next; a paused one makes none; one applied as a `prewarm.dev`
resource with kubectl runs too, its runs are objects it owns, its status shows its active run and last schedule
time, and deleting it collects its runs.

Runs meant to stay active have `parallelism: 0` (nothing is sent until it changes). Local mode fires the
cron jobs' EventBridge Scheduler schedules at their times (`prewarm_devtools.sam.scheduler`), as AWS would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from prewarm.adapters.kube import KubeCluster
from prewarm.domain.jobs import JobState, job_key
from prewarm.services.cron_jobs import cron_runs
from prewarm_cli.app import cli
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode, sync_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

NAMESPACE = "default"
# A schedule fires at the minute; the run exists this soon after it (the local scheduler looks every 0.5 s
# and the function, cold, makes the run; EventBridge Scheduler's own delivery takes seconds too). Measured
# alone: 2.2 to 3.3 s; CI runs two local stacks side by side on two cores, slower still.
ON_TIME_SECONDS = 10.0


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "cron", nodes=1) as mode:
        yield mode


def cron(name: str, images: list[str], *, api: str = "apps.kruise.io/v1beta1", parallelism: int = 1,
         **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": "AdvancedCronJob", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedule": "* * * * *", **spec, "template": {"imageListPullJobTemplate": {"spec": {
                "images": images, "parallelism": parallelism, "pullPolicy": {"backoffLimit": 0}}}}}}


def wait_for(condition: Any, until: float, what: str, seen: Any = None) -> Any:
    while not (found := condition()):
        assert time.time() < until, (f"not by {time.strftime('%H:%M:%S', time.gmtime(until))}: {what}"
                                     + (f" (found {seen()})" if seen else ""))
        time.sleep(0.25)
    return found


def forbid_skipped(local: LocalMode, active: str) -> bool:
    """Whether the functions logged a run of cron job `forbid` skipped under Forbid for its `active` run."""
    for line in (local.logs_dir / "functions.log").read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (entry.get("message") == "cron job run" and str(entry.get("cron_job", "")).endswith("/forbid")
                and entry.get("skipped") == f"concurrencyPolicy Forbid: {active} still running"):
            return True
    return False


def test_cron_jobs_run_on_time_forbid_skips_replace_replaces_and_paused_stops(
        local: LocalMode, tmp_path: Path) -> None:
    assert local.kubeconfig_written is not None
    store = local.job_store()
    pushed = local.push("e2e/cron", "v1", size_mb=1)
    idle = "e2e/never-sent:v1"  # parallelism 0: its runs stay active
    if time.time() % 60 > 45:  # leave the schedules time to be made before the first minute
        time.sleep(61 - time.time() % 60)
    manifests = [cron("on-time", [pushed.reference]), cron("forbid", [idle], parallelism=0, concurrencyPolicy="Forbid"),
                 cron("replace", [idle], parallelism=0, concurrencyPolicy="Replace"),
                 cron("paused", [idle], parallelism=0, paused=True)]
    (tmp_path / "cron.yaml").write_text(yaml.safe_dump_all(manifests))
    applied = CliRunner().invoke(cli, ["--local", "apply", "-f", str(tmp_path / "cron.yaml")], catch_exceptions=False)
    assert applied.exit_code == 0, applied.output
    assert applied.stdout.splitlines() == [f"advancedcronjob.apps.kruise.io/{m['metadata']['name']} created"
                                           for m in manifests]
    # And one as a prewarm.dev resource, through the API as kubectl applies it; the sync stores it
    with KubeCluster.from_kubeconfig(str(local.kubeconfig_written)) as admin:
        admin.create_object("prewarm.dev/v1alpha1", "advancedcronjobs",
                            cron("resource", [idle], api="prewarm.dev/v1alpha1", parallelism=0), NAMESPACE)
        sync_until(local, lambda: store.get_cron_job(job_key(NAMESPACE, "resource")), 30, "the resource stored")

        first = (time.time() // 60 + 1) * 60
        second = first + 60

        def runs(name: str) -> list[str]:
            return sorted(r.name for r in cron_runs(store, job_key(NAMESPACE, name), now=time.time()))

        # The first minute: every cron job but the paused one has its run, named after the minute, on time
        for name in ("on-time", "forbid", "replace", "resource"):
            wait_for(lambda n=name: runs(n) == [f"{n}-{int(first)}"], first + ON_TIME_SECONDS,
                     f"{name}'s first run", lambda n=name: runs(n))
        record = store.get_job(job_key(NAMESPACE, f"on-time-{int(first)}"))
        assert record is not None and first <= record.created_at <= first + ON_TIME_SECONDS
        late = {name: store.get_job(job_key(NAMESPACE, f"{name}-{int(first)}")).created_at - first  # type: ignore[union-attr]
                for name in ("on-time", "forbid", "replace", "resource")}
        print(f"\nrun made, seconds after its minute: { {k: round(v, 2) for k, v in late.items()} }")
        assert all(0 <= v <= ON_TIME_SECONDS for v in late.values()), f"seconds after the minute: {late}"
        node = local.nodes[sorted(local.nodes)[0]]
        wait_for(lambda: node.image_present(pushed.reference), first + 40, "the on-time run pulled onto the node")

        def completed() -> bool:  # the sweep completes a list job whose images are done (every minute)
            local.fire("sweep")
            return (r := store.get_job(record.key)) is not None and r.state is JobState.COMPLETED

        wait_for(completed, first + 50, "the on-time run completed")

        # The second minute: Forbid skipped it (its run is still active), Replace deleted the active run
        wait_for(lambda: runs("replace") == [f"replace-{int(second)}"], second + ON_TIME_SECONDS,
                 "replace's second run replacing the first", lambda: runs("replace"))
        replaced = store.get_job(job_key(NAMESPACE, f"replace-{int(first)}"))
        assert replaced is None or replaced.state is JobState.DELETING
        wait_for(lambda: runs("on-time") == [f"on-time-{int(first)}", f"on-time-{int(second)}"],
                 second + ON_TIME_SECONDS, "on-time's second run", lambda: runs("on-time"))
        # Forbid's invocation of the second minute has ended, and it skipped (they run side by side)
        wait_for(lambda: forbid_skipped(local, f"forbid-{int(first)}"), second + ON_TIME_SECONDS,
                 "forbid's second invocation skipping its run")
        assert runs("forbid") == [f"forbid-{int(first)}"]
        assert runs("paused") == []

        # The resource's status: Kruise's type, its active run and the last schedule time
        def status() -> dict[str, Any] | None:
            got = admin.get_object("prewarm.dev/v1alpha1", "advancedcronjobs", "resource", NAMESPACE)["status"]
            return got if got.get("lastScheduleTime") == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)) \
                else None

        shown = sync_until(local, status, 20, "the resource's status at the second run")
        assert shown["type"] == "ImageListPullJob"
        assert [a["name"] for a in shown["active"]] == [f"resource-{int(second)}"]
        # Its runs are ImageListPullJob objects it controls (the first replaced, so deleted); deleting it with the
        # API collects them, and the sync then deletes it and its run from the table
        owned = [o["metadata"]["name"] for o in admin.list_objects("prewarm.dev/v1alpha1", "imagelistpulljobs",
                                                                   NAMESPACE)
                 if [r["name"] for r in o["metadata"].get("ownerReferences", [])] == ["resource"]]
        assert owned == [f"resource-{int(second)}"]
        admin.delete_object("prewarm.dev/v1alpha1", "advancedcronjobs", "resource", NAMESPACE)
        assert admin.get_object("prewarm.dev/v1alpha1", "imagelistpulljobs", f"resource-{int(second)}",
                                NAMESPACE) is None
        sync_until(local, lambda: store.get_cron_job(job_key(NAMESPACE, "resource")) is None, 30,
                   "the deleted resource's cron job gone from the table")

    listed = CliRunner().invoke(cli, ["--local", "get", "cronjobs", "-n", NAMESPACE], catch_exceptions=False)
    assert listed.exit_code == 0 and "forbid" in listed.stdout and "* * * * *" in listed.stdout, listed.output
    deleted = CliRunner().invoke(cli, ["--local", "delete", "cronjob", "paused", "-n", NAMESPACE],
                                 catch_exceptions=False)
    assert (deleted.exit_code, deleted.stdout) == (0, 'advancedcronjob.apps.kruise.io "paused" deleted\n')
