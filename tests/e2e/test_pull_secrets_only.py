"""`spec.pullSecretsOnly` on a real local stack: job resources pulled by a real agent into a private
containerd from the registry that plays ECR (user `AWS`, the password of the token the AWS side hands
out). A job whose own secret the registry refuses fails on the node and the image stays off it, where the
same job without the flag falls back to the agent's shared credentials and pulls; a job whose secret the
registry accepts pulls; a job naming a secret its namespace lacks is not applied.

moto's schedules never fire: the test fires `sync_resources` itself, as local mode's scheduler does.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm.services.jobs import view_job
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode, sync_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

API = "prewarm.dev/v1alpha1"
NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "state", nodes=1) as mode:
        yield mode


@pytest.fixture(scope="module")
def admin(local: LocalMode) -> Iterator[KubeCluster]:
    assert local.kubeconfig_written is not None
    with KubeCluster.from_kubeconfig(str(local.kubeconfig_written)) as cluster:
        cluster.create_object("v1", "namespaces", {"metadata": {"name": NAMESPACE}})
        for name, password in (("team-a-ecr", local.ecr_password), ("team-a-wrong", "not-the-token")):
            config = {"auths": {ecr_host(): {"username": "AWS", "password": password}}}
            cluster.create_object("v1", "secrets", {
                "metadata": {"name": name, "namespace": NAMESPACE}, "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}}, NAMESPACE)
        yield cluster


def job(name: str, image: str, node: str, secret: str, only: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": image, "selector": {"names": [node]}, "pullSecrets": [secret],
                            "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 120}}
    if only:
        spec["pullSecretsOnly"] = True
    return {"apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}


def finished_node(local: LocalMode, name: str) -> Callable[[], Any]:
    store = local.job_store()

    def check() -> Any:
        try:
            view = view_job(store, NAMESPACE, name, now=time.time(), with_tasks=True)
        except LookupError:
            return None
        done = [t for t in view.tasks if t.phase in ("Succeeded", "Failed", "Cancelled")]
        return done[0] if done else None

    return check


def test_the_job_pulls_with_its_own_secret_only_and_never_falls_back(local: LocalMode, admin: KubeCluster) -> None:
    (node,) = sorted(local.nodes)
    pushed = local.push("e2e/own-secrets", "v1", size_mb=1)

    # A pullSecretsOnly job whose secret the registry refuses fails, and the image stays off the node
    admin.create_object(API, "imagepulljobs", job("own-wrong", pushed.reference, node, "team-a-wrong", True),
                        NAMESPACE)
    task = sync_until(local, finished_node(local, "own-wrong"), 90, "the pullSecretsOnly job's node finished")
    assert task.phase == "Failed"
    assert "401 Unauthorized" in task.message
    assert task.message.endswith("(pullSecretsOnly: the registry refused the job's pull secrets, and shared "
                                 "credentials are not tried)")
    assert not local.nodes[node].image_present(pushed.reference)

    # The same job without the flag falls back to the agent's shared credentials and pulls
    admin.create_object(API, "imagepulljobs", job("shared-wrong", pushed.reference, node, "team-a-wrong", False),
                        NAMESPACE)
    task = sync_until(local, finished_node(local, "shared-wrong"), 90, "the shared-credentials job's node finished")
    assert task.phase == "Succeeded", task.message
    assert local.nodes[node].image_present(pushed.reference)


def test_a_secret_the_registry_accepts_pulls(local: LocalMode, admin: KubeCluster) -> None:
    (node,) = sorted(local.nodes)
    pushed = local.push("e2e/own-secrets-ok", "v1", size_mb=1)

    admin.create_object(API, "imagepulljobs", job("own-ok", pushed.reference, node, "team-a-ecr", True), NAMESPACE)

    task = sync_until(local, finished_node(local, "own-ok"), 90, "the pullSecretsOnly job's node finished")
    assert task.phase == "Succeeded", task.message
    assert local.nodes[node].image_present(pushed.reference)


def test_a_missing_secret_is_not_applied(local: LocalMode, admin: KubeCluster) -> None:
    (node,) = sorted(local.nodes)
    admin.create_object(API, "imagepulljobs", job("own-missing", f"{ecr_host()}/e2e/x:v1", node, "team-a-none",
                                                  True), NAMESPACE)

    def refused() -> str | None:
        status = (admin.get_object(API, "imagepulljobs", "own-missing", NAMESPACE) or {}).get("status", {})
        return str(status.get("message", "")) if "not applied" in str(status.get("message", "")) else None

    message = sync_until(local, refused, 30, "the resource refused for its missing secret")
    assert message == (f'not applied: ImagePullJob {NAMESPACE}/own-missing is invalid: spec.pullSecrets[0]: secret '
                       f'"team-a-none" not found in namespace "{NAMESPACE}": spec.pullSecretsOnly pulls with these '
                       "secrets only; create it first")
    assert local.job_store().get_job(f"{NAMESPACE}/own-missing") is None
