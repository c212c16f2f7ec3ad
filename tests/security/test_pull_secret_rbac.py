"""Who may read a namespace's pull secrets, with the RBAC `prewarm install` renders, enforced by the
embedded API server: dispatch_job (which mirrors the secrets a job names for the agents) reads the named
pull secrets of the bound namespaces and nothing else; sync_resources reads the same (it refuses a
`pullSecretsOnly` job whose secrets are missing); no other principal of Prewarm reads them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api

from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE
from prewarm_cli.install.render import FUNCTION_GROUPS, InstallError, InstallValues, render, values_from_stack
from prewarm_devtools.kubeapi import Identity, KubeApiServer, service_account

pytestmark = pytest.mark.integration

TEAM = "team"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding"}
STACK = {"STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/111122223333/pw-status",
         "NODE_QUEUE_PREFIX": "pw-node", "NODE_DLQ_ARN": "arn:aws:sqs:us-west-2:111122223333:pw-dlq",
         "SECRET_PREFIX": "prewarm/pw", "AGENT_ROLE_ARN": "arn:aws:iam::111122223333:role/prewarm-agent"}
CREDENTIALS = f'{{"registries": [{{"account": "111122223333", "region": "us-west-2"}}], "namespaces": ["{TEAM}"]}}'


def secret(name: str, namespace: str = TEAM) -> dict[str, Any]:
    return {"kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "e30="}}


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    """Prewarm's RBAC for pull secrets of namespace `team` named `regcred`; one token per principal."""
    values = values_from_stack(STACK, region="us-west-2", image="agent:1", credentials_config=CREDENTIALS,
                               pull_secret_namespaces=[TEAM], pull_secret_names=["regcred"])
    with KubeApiServer() as server:
        server.seed_objects([{"kind": "Namespace", "metadata": {"name": TEAM}}, secret("regcred"),
                             secret("db-password"), secret("regcred", "default"), secret("prewarm-ecr")])
        server.seed_objects([o for o in render(values) if o["kind"] in RBAC_KINDS])
        # Each function's role as its EKS access entry maps it: a user in the entry's groups.
        for setting, groups in FUNCTION_GROUPS.items():
            server.add_identity(setting, Identity(f"arn:aws:sts::111122223333:assumed-role/{setting}", groups))
        server.add_identity("agent", service_account(AGENT_NAMESPACE, AGENT_NAME, node="n1"))
        yield server


def can_read(api: KubeApiServer, token: str, name: str, namespace: str = TEAM) -> bool:
    with api.api_client(token=token) as client:
        try:
            CoreV1Api(client).read_namespaced_secret(name, namespace)
        except ApiException as e:
            assert e.status == 403, e
            return False
    return True


@pytest.mark.parametrize("principal", ["DISPATCH_JOB_ROLE_ARN", "SYNC_RESOURCES_ROLE_ARN"])
def test_dispatch_and_sync_read_the_named_pull_secret_of_a_bound_namespace_and_nothing_else(
        api: KubeApiServer, principal: str) -> None:
    assert can_read(api, principal, "regcred")
    assert not can_read(api, principal, "db-password")  # not a named pull secret
    assert not can_read(api, principal, "prewarm-ecr")
    assert not can_read(api, principal, "regcred", "default")  # namespace not bound


@pytest.mark.parametrize("principal", ["RECORD_STATUS_ROLE_ARN", "SWEEP_ROLE_ARN",
                                       "REFRESH_ECR_CREDENTIALS_ROLE_ARN", "agent"])
def test_no_other_principal_of_prewarm_reads_a_pull_secret(api: KubeApiServer, principal: str) -> None:
    assert not can_read(api, principal, "regcred")
    assert not can_read(api, principal, "db-password")


def test_the_refresher_reads_only_the_secret_it_writes(api: KubeApiServer) -> None:
    assert can_read(api, "REFRESH_ECR_CREDENTIALS_ROLE_ARN", "prewarm-ecr")
    assert not can_read(api, "REFRESH_ECR_CREDENTIALS_ROLE_ARN", "regcred")


def test_without_names_dispatch_reads_every_secret_of_a_bound_namespace() -> None:
    # What --pull-secret-names is for: the rule has no resourceNames then.
    values = values_from_stack(STACK, region="us-west-2", image="agent:1", pull_secret_namespaces=[TEAM])
    (role,) = [o for o in render(values) if o["kind"] == "ClusterRole" and o["metadata"]["name"] ==
               "prewarm-pull-secrets"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert InstallValues.pull_secret_names == ()


def test_a_pull_secret_name_that_is_no_secret_name_is_refused_naming_the_flag() -> None:
    with pytest.raises(InstallError, match=r"--pull-secret-names: 'Reg_Cred': "):
        values_from_stack(STACK, region="us-west-2", image="agent:1", pull_secret_names=["regcred,Reg_Cred"])
