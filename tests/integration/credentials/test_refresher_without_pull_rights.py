"""A refresher role stripped of pull rights (template.yaml without its RegistryPulls statement), on a local
stack whose registry plays ECR: the refreshed namespace secret's pull fails with ECR's 403, `prewarm
doctor` names the missing permissions, and an agent whose shared copy is refused falls back to its own
role's token, with a log line naming both principals."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.domain.messages import NodePhase
from prewarm.services.jobs import apply_manifest
from prewarm_agent.cri.errors import ImagePullError
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.sam.aws import ACCOUNT, REGION
from prewarm_devtools.sam.template import load_template
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.node,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok"),
]

PREWARM = str(Path(sys.executable).with_name("prewarm"))
STATE = "PREWARM_LOCAL_STATE"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    template = load_template()
    document = template["Resources"]["RefreshEcrCredentialsRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    document["Statement"] = [s for s in document["Statement"] if s.get("Sid") != "RegistryPulls"]
    base = tmp_path_factory.mktemp("stripped")
    (base / "template.json").write_text(json.dumps(template, default=str))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE, str(base / "local.json"))
        with LocalMode(nodes=1, template_path=base / "template.json",
                       agent_settings={"ECR_CREDENTIALS": "shared"}) as mode:
            yield mode


def refresher_role(local: LocalMode) -> str:
    assert local.stack is not None
    return str(local.stack.outputs()["RefreshEcrCredentialsRoleArn"])


def secret_auth(local: LocalMode) -> tuple[str, str]:
    assert local.kube is not None
    secret = local.kube.get_object("secrets", "prewarm-ecr", "default")
    assert secret is not None
    entry = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))["auths"][ecr_host()]
    return entry["username"], entry["password"]


def test_the_namespace_secret_s_pull_fails_with_ecr_s_403(local: LocalMode) -> None:
    (node,) = local.nodes.values()
    pushed = local.push("team/refused", "v1", size_mb=1)
    auth = secret_auth(local)

    # containerd, given the secret as the kubelet gives it, is refused the manifest
    with node.containerd.cri_client() as cri, pytest.raises(ImagePullError) as caught:
        cri.pull_image(pushed.reference, auth=auth).result(timeout=60)
    assert "403 Forbidden" in caught.value.details
    assert not node.image_present(pushed.reference)

    # ... and the registry says why, in ECR's words
    connection = http.client.HTTPConnection("127.0.0.1", local.registry.port, timeout=10)
    try:
        connection.request("GET", "/v2/team/refused/manifests/v1", headers={
            "Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()})
        response = connection.getresponse()
        status, body = response.status, json.loads(response.read())
    finally:
        connection.close()
    repository = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/team/refused"
    assert (status, body) == (403, {"errors": [{"code": "DENIED", "message": (
        f"User: {refresher_role(local)} is not authorized to perform: ecr:BatchGetImage on resource: {repository} "
        "because no identity-based policy allows the ecr:BatchGetImage action")}]})


def test_doctor_names_the_missing_permissions(local: LocalMode) -> None:
    done = subprocess.run([PREWARM, "--local", "doctor"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ})

    (line,) = [x for x in done.stdout.splitlines() if x[6:].startswith("registry pulls:")]
    repositories = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/*"
    assert line.startswith("FAIL  registry pulls: "), done.stdout + done.stderr
    assert (f"its token's principal {refresher_role(local)} may not ecr:BatchGetImage on {repositories}; "
            f"ecr:GetDownloadUrlForLayer on {repositories}") in line
    assert "grant ecr:BatchGetImage, ecr:GetDownloadUrlForLayer to refresh_ecr_credentials' role (template.yaml " \
        "RefreshEcrCredentialsRole, statement RegistryPulls" in line
    assert done.returncode == 1


def test_the_agent_falls_back_to_its_own_role_and_names_both(local: LocalMode,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    (name, node), = local.nodes.items()
    agent_role = local.agent_identity_of(name).arn
    store = local.job_store()
    pushed = local.push("team/fallback", "v1", size_mb=1)

    with caplog.at_level(logging.WARNING, logger="prewarm_agent.attempts"):
        apply_manifest(store, {
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "fallback", "namespace": "default"},
            "spec": {"image": pushed.reference, "selector": {"names": [name]},
                     "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 60}},
        }, now=time.time())

        def finished() -> bool:
            task = store.get_task("default/fallback", name)
            return task is not None and task.phase in (NodePhase.SUCCEEDED, NodePhase.FAILED)

        wait_until(finished, 60, "the agent's pull finished")

    task = store.get_task("default/fallback", name)
    assert task is not None and task.phase is NodePhase.SUCCEEDED, task.message if task else None
    assert node.image_present(pushed.reference)
    refused = [r.getMessage() for r in caplog.records if "the registry refused" in r.getMessage()]
    assert refused == [f"the registry refused the shared credential {local.stack.env()['SECRET_PREFIX']}/registry/"
                       f"{ecr_host()} (issued to {refresher_role(local)}) for {pushed.reference}; pulling with the "
                       f"agent's own role ({agent_role}) instead"]
