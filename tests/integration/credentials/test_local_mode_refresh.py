"""Local mode runs `refresh_ecr_credentials` once at start: pull secrets appear in the embedded cluster
and the agents' copies in moto's Secrets Manager, for the registry that plays ECR."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest

from prewarm.domain.kubernetes import parse_time
from prewarm.domain.refresh import ISSUED_TO_ANNOTATION, registry_secret_name
from prewarm_agent.settings import EcrCredentials
from prewarm_devtools.localecr import ECR_TOKEN_LIFETIME_SECONDS, ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites

pytestmark = [
    pytest.mark.integration,
    pytest.mark.node,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok"),
]

SECRET_NAME = "prewarm-ecr"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalMode]:
    with LocalMode(nodes=1) as mode:
        yield mode


def refresher_role(local: LocalMode) -> str:
    assert local.stack is not None
    return str(local.stack.outputs()["RefreshEcrCredentialsRoleArn"])


def issued_to(local: LocalMode, password: str) -> str | None:
    """The principal the AWS limits layer issued the ECR token `password` to."""
    assert local.aws is not None and local.aws.layer is not None
    token = local.aws.layer.ecr.holder(password)
    return token.principal if token is not None else None


def test_the_pull_secret_in_default_holds_the_ecr_host(local: LocalMode) -> None:
    # Given local mode started with one node
    assert local.kube is not None

    # When the pull secret of namespace default is read back from the embedded cluster
    secret = local.kube.get_object("secrets", SECRET_NAME, "default")

    # Then the refresher wrote it, for the ECR host, with a token ECR issued to the refresher's role
    assert secret is not None, "refresh_ecr_credentials wrote no pull secret into namespace default"
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "prewarm"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"][ecr_host()]
    assert entry["username"] == "AWS"
    assert issued_to(local, entry["password"]) == refresher_role(local)
    assert secret["metadata"]["annotations"][ISSUED_TO_ANNOTATION] == refresher_role(local)
    # ... and the namespace's default service account pulls with it
    account = local.kube.get_object("serviceaccounts", "default", "default")
    assert account is not None
    assert {"name": SECRET_NAME} in account.get("imagePullSecrets", [])


def test_no_pull_secret_is_written_outside_the_target_namespaces(local: LocalMode) -> None:
    assert local.kube is not None

    assert local.kube.get_object("secrets", SECRET_NAME, "kube-system") is None


def test_the_agents_copy_is_in_secrets_manager_under_the_stacks_prefix(local: LocalMode) -> None:
    assert local.stack is not None and local.aws is not None
    prefix = local.stack.env()["SECRET_PREFIX"]

    # When the registry's copy is read from moto's Secrets Manager
    value = local.aws.client("secretsmanager").get_secret_value(SecretId=registry_secret_name(prefix, ecr_host()))

    # Then it holds the ECR host's credentials, the refresher's token, which expire in 12 hours as ECR's do
    document = json.loads(value["SecretString"])
    assert issued_to(local, document["auths"][ecr_host()]["password"]) == refresher_role(local)
    assert document["issuedTo"] == refresher_role(local)
    expires = parse_time(document["expiresAt"])
    assert expires is not None and abs(expires - (time.time() + ECR_TOKEN_LIFETIME_SECONDS)) < 300


def test_local_agents_know_the_prefix_and_get_tokens_from_their_role(local: LocalMode) -> None:
    assert local.stack is not None
    (node,) = local.nodes.values()

    settings = node.agent.settings

    assert settings.secret_prefix == local.stack.env()["SECRET_PREFIX"]
    assert settings.ecr_credentials is EcrCredentials.ROLE
