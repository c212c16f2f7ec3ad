"""Kubernetes-native jobs on a real local stack: an ImagePullJob resource pulls onto real nodes (private
containerd, agents, the registry behind a bandwidth limit), its `.status` converges to the job's exact
counters, deleting it cancels the pulls, and a job cannot use another namespace's pull secret.

The first resource is applied with the real kubectl and the kubeconfig local mode writes (the cluster
admin, over TLS), when kubectl is installed; without it, through the Kubernetes API with that same
kubeconfig. The others go through the API. moto's schedules never fire: the test fires
`sync_resources` itself, as local mode's scheduler does every minute.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from prewarm.adapters.kube import KubeCluster
from prewarm.domain.jobs import job_key
from prewarm.services.jobs import view_job
from prewarm_agent.cri.client import ContentStatusReader
from prewarm_cli.app import cli
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.kubectl import kubectl_binary
from tests.support.local_mode import running_local_mode, sync_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

API = "prewarm.dev/v1alpha1"
MIB = 1024 * 1024
# Two pulls share it: a 1 MiB image takes about a second, a 24 MiB one over 20 s.
BANDWIDTH = 2 * MIB
KUBECTL = kubectl_binary()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "state", nodes=2, registry_bandwidth=BANDWIDTH) as mode:
        yield mode


@pytest.fixture(scope="module")
def admin(local: LocalMode) -> Iterator[KubeCluster]:
    # The cluster admin as the kubeconfig local mode wrote for kubectl says
    assert local.kubeconfig_written is not None
    with KubeCluster.from_kubeconfig(str(local.kubeconfig_written)) as cluster:
        yield cluster


def kubectl(local: LocalMode, *args: str) -> subprocess.CompletedProcess[str]:
    assert local.kubeconfig_written is not None
    return subprocess.run([KUBECTL, "--kubeconfig", str(local.kubeconfig_written), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def resource(name: str, namespace: str, image: str, nodes: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": image, "parallelism": len(nodes), "selector": {"names": nodes},
                     "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 300}, **spec}}


def ingested(local: LocalMode, node: str) -> int:
    with ContentStatusReader(str(local.nodes[node].containerd.socket_path)) as reader:
        return sum(s.offset for s in reader.list_statuses() if s.ref.startswith("layer-"))


def test_a_resource_pulls_on_every_node_and_its_status_converges_to_the_exact_counters(
    local: LocalMode, admin: KubeCluster, tmp_path: Path
) -> None:
    assert local.aws is not None and local.stack is not None
    store = local.job_store()
    nodes = sorted(local.nodes)
    pushed = local.push("e2e/small", "v1", size_mb=1)
    manifest = resource("res-small", "default", pushed.reference, nodes)

    # kubectl reaches the stack as the cluster admin with the kubeconfig local mode wrote
    listed = kubectl(local, "get", "nodes", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) >= {f"node/{n}" for n in nodes}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    applied = kubectl(local, "apply", "-f", str(tmp_path / "job.yaml"))
    assert (applied.returncode, applied.stdout) == (0, "imagepulljob.prewarm.dev/res-small created\n"), \
        applied.stderr

    def done() -> dict[str, Any] | None:
        status = admin.get_object(API, "imagepulljobs", "res-small", "default")["status"]
        return status if status.get("completionTime") else None

    status = sync_until(local, done, 60, "the resource's status reports the job complete")
    view = view_job(store, "default", "res-small", now=time.time())
    assert (status["desired"], status["active"], status["succeeded"], status["failed"]) == (
        view.desired, view.active, view.succeeded, view.failed) == (2, 0, 2, 0)
    assert status["nodes"] == {"waiting": 0, "pulling": 0, "succeeded": 2, "failed": 0}
    assert status["message"] == view.message and status["observedGeneration"] == 1
    for node in nodes:
        assert local.nodes[node].image_present(pushed.reference), node
    # And `prewarm --local get jobs` lists the job the resource made, as does kubectl the resource
    jobs = CliRunner().invoke(cli, ["--local", "get", "jobs"], catch_exceptions=False)
    assert jobs.exit_code == 0 and "res-small" in jobs.stdout, jobs.output
    shown = kubectl(local, "get", "imagepulljobs", "-A")
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if " res-small " in f" {line} ")
    assert row[:6] == ["default", "res-small", "2", "0", "2", "0"]


def test_deleting_the_resource_cancels_its_pulls(local: LocalMode, admin: KubeCluster) -> None:
    assert local.aws is not None and local.stack is not None
    store = local.job_store()
    nodes = sorted(local.nodes)
    pushed = local.push("e2e/big", "v1", size_mb=24)
    admin.create_object(API, "imagepulljobs", resource("res-big", "default", pushed.reference, nodes), "default")
    sync_until(local, lambda: all(ingested(local, n) > 0 for n in nodes), 30, "both nodes downloading")

    admin.delete_object(API, "imagepulljobs", "res-big", "default")
    sync_until(local, lambda: store.get_job(job_key("default", "res-big")) is None, 20, "the job gone")

    # Then no node goes on downloading and neither has the image
    time.sleep(1.0)
    before = {n: ingested(local, n) for n in nodes}
    time.sleep(1.0)
    assert {n: ingested(local, n) for n in nodes} == before
    assert not any(local.nodes[n].image_present(pushed.reference) for n in nodes)


def test_a_job_may_not_name_another_namespaces_pull_secret(local: LocalMode, admin: KubeCluster) -> None:
    # Given a pull secret in namespace team-b, and a job resource in team-a that names it
    import base64
    import json

    for namespace in ("team-a", "team-b"):
        admin.create_object("v1", "namespaces", {"metadata": {"name": namespace}})
    config = json.dumps({"auths": {"registry.example": {"auth": base64.b64encode(b"u:p").decode()}}})
    admin.create_object("v1", "secrets", {"metadata": {"name": "team-b-pull", "namespace": "team-b"},
                                          "type": "kubernetes.io/dockerconfigjson",
                                          "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}},
                        "team-b")
    nodes = sorted(local.nodes)
    pushed = local.push("e2e/secret", "v1", size_mb=1)
    admin.create_object(API, "imagepulljobs",
                        resource("res-steal", "team-a", pushed.reference, nodes, pullSecrets=["team-b-pull"]),
                        "team-a")

    def refused() -> str | None:
        status = admin.get_object(API, "imagepulljobs", "res-steal", "team-a").get("status", {})
        return str(status["message"]) if "pull secret" in str(status.get("message", "")) else None

    # Then the job is refused, the message saying where the secret must be, and nothing was pulled
    message = sync_until(local, refused, 30, "the job refused for its pull secret")
    assert message == ("pull secret team-a/team-b-pull not found: create it in namespace team-a or remove it from "
                       "the job's pullSecrets")
    assert not any(local.nodes[n].image_present(pushed.reference) for n in nodes)
