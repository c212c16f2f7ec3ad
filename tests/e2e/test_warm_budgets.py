"""A namespace's warm budget on a real local stack (issue 38): the Namespace's annotation, read by the resource
sync into the table; sizes read from ECR's manifests of real pushes (compressed bytes); a job beyond the budget
refused by `prewarm --local apply` (exit 1, naming the namespace, the budget and the bytes) with what was
accepted before untouched, and a resource beyond it left unapplied with its status saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from prewarm.adapters.kube import KubeCluster
from prewarm.domain.jobs import JobState, job_key
from prewarm_cli.app import cli
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode, sync_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

NAMESPACE, API = "team-budget", "prewarm.dev/v1alpha1"
MIB = 2**20


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "budgets", nodes=1) as mode:
        yield mode


def job(name: str, image: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"image": image, "selector": {"names": [node]}, "completionPolicy": {"type": "Never"},
                     "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 60}}}


def apply(path: Path, manifest: dict[str, Any]) -> Any:
    path.write_text(yaml.safe_dump(manifest))
    return CliRunner().invoke(cli, ["--local", "apply", "-f", str(path)], catch_exceptions=False)


def test_a_job_beyond_its_namespaces_budget_is_refused_and_what_was_kept_stays(local: LocalMode,
                                                                               tmp_path: Path) -> None:
    assert local.kube is not None and local.kubeconfig_written is not None
    (node,) = sorted(local.nodes)
    # Given two images pushed to ECR, 2 MB of random bytes each (no rule matches them)
    first, second = (local.push(f"e2e/budget-{n}", "v1", size_mb=2) for n in ("a", "b"))
    # and a namespace that keeps 3 MiB of images per node, which the sync copies into the table
    local.kube.seed_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE, "annotations": {"prewarm.dev/warm-bytes-per-node": "3Mi"}}}])
    store = local.job_store()
    sync_until(local, lambda: NAMESPACE in store.get_warm_budgets(), 30, "the namespace's budget in the table")

    # When a job of the first image is applied, it is created, its size read from ECR's manifest
    created = apply(tmp_path / "a.yaml", job("warm-a", first.reference, node))
    assert created.exit_code == 0 and "created" in created.output, created.output
    kept = store.get_job(job_key(NAMESPACE, "warm-a"))
    assert kept is not None and kept.warm_bytes is not None and 2 * MIB <= kept.warm_bytes < 3 * MIB

    # When a job of the second image is applied beside it, it is refused, naming the namespace, the budget
    # and the bytes; nothing of it is stored and the first job is as it was
    refused = apply(tmp_path / "b.yaml", job("warm-b", second.reference, node))
    assert refused.exit_code == 1, refused.output
    assert (f"ImagePullJob {NAMESPACE}/warm-b refused: namespace {NAMESPACE} keeps at most 3145728 bytes (3.0 MiB) "
            f"of images warm per node; on node {node} its other jobs keep {kept.warm_bytes} bytes") in refused.output
    assert store.get_job(job_key(NAMESPACE, "warm-b")) is None
    still = store.get_job(job_key(NAMESPACE, "warm-a"))
    assert still is not None and (still.spec_hash, still.state) == (kept.spec_hash, JobState.RUNNING)

    # And the same job as a resource is not applied: its status says why at the sync
    with KubeCluster.from_kubeconfig(str(local.kubeconfig_written)) as admin:
        manifest = job("res-b", second.reference, node) | {"apiVersion": API}
        admin.create_object(API, "imagepulljobs", manifest, NAMESPACE)

        def why() -> str:
            status = admin.get_object(API, "imagepulljobs", "res-b", NAMESPACE).get("status") or {}
            return str(status.get("message", ""))

        message = sync_until(local, lambda: why().startswith("not applied: ") and why(), 30,
                             "the resource's status saying it is not applied")
    assert f"ImagePullJob {NAMESPACE}/res-b refused: namespace {NAMESPACE} keeps at most 3145728 bytes" in message
    assert store.get_job(job_key(NAMESPACE, "res-b")) is None
