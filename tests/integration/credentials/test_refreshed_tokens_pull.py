"""With the shipped template, what `refresh_ecr_credentials` writes can pull from the registry that plays
ECR, which admits a token only for what its principal's policies allow: a pod's pull with the refreshed
namespace secret (containerd given the secret's `.dockerconfigjson` credentials, as the kubelet gives
them) and an agent's pull through the shared copy both succeed, and the agent's role asks ECR for no
token of its own for it."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest

from prewarm.domain.messages import NodePhase
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.node,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok"),
]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREWARM_LOCAL_STATE", str(tmp_path_factory.mktemp("state") / "local.json"))
        # The agents as they ship: the refresher's shared copy first.
        with LocalMode(nodes=1, agent_settings={"ECR_CREDENTIALS": "shared"}) as mode:
            yield mode


def namespace_secret_auth(local: LocalMode, namespace: str = "default") -> tuple[str, str]:
    """The ECR host's credentials in the refreshed pull secret, as the kubelet reads them."""
    assert local.kube is not None
    secret = local.kube.get_object("secrets", "prewarm-ecr", namespace)
    assert secret is not None, f"no refreshed pull secret in {namespace}"
    entry = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))["auths"][ecr_host()]
    return entry["username"], entry["password"]


def test_a_pod_pulls_with_the_refreshed_namespace_secret(local: LocalMode) -> None:
    (node,) = local.nodes.values()
    pushed = local.push("team/pod-pull", "v1", size_mb=1)

    with node.containerd.cri_client() as cri:
        cri.pull_image(pushed.reference, auth=namespace_secret_auth(local)).result(timeout=60)

    assert node.image_present(pushed.reference)


def test_an_agent_pulls_through_the_shared_credentials(local: LocalMode) -> None:
    assert local.aws is not None and local.aws.layer is not None
    (name, node), = local.nodes.items()
    agent_role = local.agent_identity_of(name).arn
    store = local.job_store()
    pushed = local.push("team/agent-pull", "v1", size_mb=1)
    # Counted from here: an agent that started before local mode's second refresh may have found the
    # copy with moto's 2015 expiry and asked as its role then.
    tokens_before = local.aws.layer.ecr.issued_to(agent_role)

    apply_manifest(store, {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "shared-pull", "namespace": "default"},
        "spec": {"image": pushed.reference, "selector": {"names": [name]},
                 "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 60}},
    }, now=time.time())

    def finished() -> bool:
        task = store.get_task("default/shared-pull", name)
        return task is not None and task.phase in (NodePhase.SUCCEEDED, NodePhase.FAILED)

    wait_until(finished, 60, "the agent's pull finished")
    task = store.get_task("default/shared-pull", name)
    assert task is not None and task.phase is NodePhase.SUCCEEDED, task.message if task else None
    assert node.image_present(pushed.reference)
    # Through the shared copy: the agent's role was issued no token for this pull
    assert local.aws.layer.ecr.issued_to(agent_role) == tokens_before
