"""The credential refresher and the pull-secret mirror against the embedded Kubernetes API and moto.

Real adapters throughout: `KubeCluster` over HTTP to the embedded API server (which validates
secrets, enforces resourceVersions and treats imagePullSecrets as an atomic list), `EcrTokenSource`
on moto's ECR and STS, Secrets Manager on moto.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.ecr_auth import EcrTokenSource
from prewarm.adapters.kube import KubeCluster
from prewarm.adapters.secrets import SecretsManagerCredentialStore, SecretsManagerMirror
from prewarm.domain.refresh import CredentialsConfig
from prewarm.domain.registries import Keyring
from prewarm.services.credentials import CredentialRefreshError, RefreshReport, refresh_credentials
from prewarm.services.ports import PullSecretError
from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.clock import Clock
from tests.support.cluster_directory import clusters_of
from tests.support.credentials import REGION, outcomes

pytestmark = pytest.mark.integration

HOUR = 3600.0
# moto's ECR token is fixed and already expired (2015-01-01T00:00:00Z): the clock starts 12 hours
# before that, so the token is as fresh as one straight from ECR.
ISSUED = datetime.datetime(2014, 12, 31, 12, tzinfo=datetime.UTC).timestamp()
OWN = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
OTHER = "444455556666.dkr.ecr.us-west-2.amazonaws.com"
CONFIG = {
    "registries": [
        {"account": "111122223333", "region": "us-east-1"},
        {"account": "444455556666", "region": "us-west-2",
         "roleArn": "arn:aws:iam::444455556666:role/prewarm-ecr-pull", "extraHosts": ["cache.example.com"]},
    ],
    "namespaces": {"include": ["team-*", "ml"], "exclude": ["team-sandbox"],
                   "labelSelector": {"matchExpressions": [{"key": "prewarm", "operator": "NotIn",
                                                           "values": ["off"]}]}},
    "serviceAccounts": ["default", "builder"],
}


def ns(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def account(name: str, namespace: str, *pull_secrets: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": name, "namespace": namespace}}
    if pull_secrets:
        doc["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return doc


def docker_secret(name: str, namespace: str, document: dict[str, Any], **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(document).encode()).decode()}}


@pytest.fixture
def cluster(kube_api: KubeApiServer) -> Iterator[KubeCluster]:
    kube_api.seed_objects([
        ns("team-a"), ns("team-b"), ns("team-sandbox"), ns("team-off", prewarm="off"), ns("ml"), ns("other"),
        account("builder", "team-a", "regcred"),
    ])
    with KubeCluster(kube_api.url, token_source=lambda: kube_api.token) as kube:
        yield kube


class Refresher:
    def __init__(self, cluster: Any, clock: Clock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.tokens = EcrTokenSource(clock=clock)
        self.store = SecretsManagerCredentialStore("prewarm/it", boto3.client("secretsmanager", region_name=REGION))

    def __call__(self, **fields: Any) -> RefreshReport:
        config = CredentialsConfig.model_validate({**CONFIG, **fields})
        return refresh_credentials(config, clusters_of(None, self.cluster), self.tokens, self.store, clock=self.clock)


@pytest.fixture
def refresher(aws: None, cluster: KubeCluster) -> Refresher:
    return Refresher(cluster, Clock(ISSUED))


def test_refresh_creates_skips_while_fresh_and_refreshes_after_half_life(
    refresher: Refresher, kube_api: KubeApiServer
) -> None:
    # Given namespaces matched by wildcard, an exclude, and a label selector
    report = refresher()
    assert outcomes(report) == {"ml": "created", "team-a": "created", "team-b": "created"}
    secret = kube_api.get_object("secrets", "prewarm-ecr", "team-a")
    assert secret is not None and secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "prewarm"}
    # ... with whose pull permissions its tokens carry: the assumed role's session, for the registry with a
    # roleArn (the token source here asks STS for no identity of its own)
    assert secret["metadata"]["annotations"] == {
        "prewarm.dev/issued-at": "2014-12-31T12:00:00Z", "prewarm.dev/expires-at": "2015-01-01T00:00:00Z",
        "prewarm.dev/issued-to": "arn:aws:sts::444455556666:assumed-role/prewarm-ecr-pull/prewarm-ecr-credentials"}
    keyring = Keyring.from_docker_config_json(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert sorted(a.server for a in keyring.auths) == sorted([OWN, OTHER, "cache.example.com"])
    assert keyring.lookup(f"{OTHER}/app:1")[0].password == "444455556666-auth-token"
    # When it runs again 5 hours later, nothing is rewritten
    version = secret["metadata"]["resourceVersion"]
    refresher.clock.now = ISSUED + 5 * HOUR
    assert set(outcomes(refresher()).values()) == {"skipped-fresh"}
    again = kube_api.get_object("secrets", "prewarm-ecr", "team-a")
    assert again is not None and again["metadata"]["resourceVersion"] == version
    # When it runs past the half-life, every secret is refreshed
    refresher.clock.now = ISSUED + 6 * HOUR
    assert set(outcomes(refresher()).values()) == {"refreshed"}
    refreshed = kube_api.get_object("secrets", "prewarm-ecr", "team-a")
    assert refreshed is not None and refreshed["metadata"]["annotations"]["prewarm.dev/issued-at"] == (
        "2014-12-31T18:00:00Z")


def test_service_accounts_get_the_secret_once_and_keep_their_entries(
    refresher: Refresher, kube_api: KubeApiServer
) -> None:
    report = refresher()
    team_a = next(n for n in report.namespaces if n.namespace == "team-a")
    assert team_a.service_accounts_patched == ["default", "builder"]
    assert next(n for n in report.namespaces if n.namespace == "ml").service_accounts_missing == ["builder"]
    builder = kube_api.get_object("serviceaccounts", "builder", "team-a")
    assert builder is not None and builder["imagePullSecrets"] == [{"name": "regcred"}, {"name": "prewarm-ecr"}]
    version = builder["metadata"]["resourceVersion"]
    # A second run patches nothing
    refresher.clock.now += HOUR
    assert all(not n.service_accounts_patched for n in refresher().namespaces)
    builder = kube_api.get_object("serviceaccounts", "builder", "team-a")
    assert builder is not None and builder["metadata"]["resourceVersion"] == version


class RacingCluster:
    """The real adapter, but someone else updates the object between the refresher's read and write."""

    def __init__(self, kube: KubeCluster) -> None:
        self._kube = kube
        self.raced: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self.raced:
            current = self._kube.get_secret(namespace, name)
            assert current is not None
            current["metadata"]["labels"]["team"] = "a"
            self._kube.replace_secret(namespace, name, current)
            self.raced.append(namespace)
        replaced: dict[str, Any] = self._kube.replace_secret(namespace, name, body)
        return replaced

    def patch_service_account(self, namespace: str, name: str, patch: dict[str, Any],
                              strategic: bool = True) -> dict[str, Any]:
        if namespace not in self.raced:
            self._kube.patch_service_account(namespace, name, {"imagePullSecrets": [{"name": "theirs"}]})
            self.raced.append(namespace)
        patched: dict[str, Any] = self._kube.patch_service_account(namespace, name, patch, strategic)
        return patched


def test_conflict_on_replace_is_read_again_and_retried(refresher: Refresher, cluster: KubeCluster,
                                                        kube_api: KubeApiServer) -> None:
    refresher(namespaces=["team-a"])
    racing = RacingCluster(cluster)
    refresher.cluster = racing
    refresher.clock.now = ISSUED + 7 * HOUR
    # When the secret changes on the server between the read and the replace
    assert outcomes(refresher(namespaces=["team-a"])) == {"team-a": "refreshed"}
    # Then the server answered 409, the refresher re-read, and kept the other writer's label
    assert racing.raced == ["team-a"]
    secret = kube_api.get_object("secrets", "prewarm-ecr", "team-a")
    assert secret is not None and secret["metadata"]["labels"]["team"] == "a"
    assert secret["metadata"]["annotations"]["prewarm.dev/issued-at"] == "2014-12-31T19:00:00Z"


def test_service_account_changed_meanwhile_keeps_the_other_writers_entry(refresher: Refresher, cluster: KubeCluster,
                                                                         kube_api: KubeApiServer) -> None:
    racing = RacingCluster(cluster)
    racing.raced.append("no-secret-race")
    refresher.cluster = racing
    refresher(namespaces=["team-b"])
    default = kube_api.get_object("serviceaccounts", "default", "team-b")
    assert default is not None and default["imagePullSecrets"] == [{"name": "theirs"}, {"name": "prewarm-ecr"}]


def test_foreign_secret_and_forbidden_namespace_fail_alone(refresher: Refresher, kube_api: KubeApiServer) -> None:
    # Given a secret of the same name that prewarm does not manage
    theirs = docker_secret("prewarm-ecr", "team-b", {"auths": {"r.io": {"auth": base64.b64encode(b"u:p").decode()}}})
    kube_api.seed_objects([theirs])
    before = kube_api.get_object("secrets", "prewarm-ecr", "team-b")
    # When the refresher runs
    report = refresher()
    # Then team-b fails with a clear reason, its secret untouched, and the others are written
    assert outcomes(report) == {"ml": "created", "team-a": "created", "team-b": "failed"}
    assert "not managed by prewarm" in report.namespaces[2].reason
    assert kube_api.get_object("secrets", "prewarm-ecr", "team-b") == before
    with pytest.raises(CredentialRefreshError, match=r"^1 credential refresh failure\(s\): namespace team-b: "):
        report.raise_for_failures()


def test_agent_copies_hold_each_registry_token_in_secrets_manager(refresher: Refresher) -> None:
    refresher(namespaces=None)
    client = boto3.client("secretsmanager", region_name=REGION)
    for host in (OWN, OTHER, "cache.example.com"):
        document = json.loads(client.get_secret_value(SecretId=f"prewarm/it/registry/{host}")["SecretString"])
        assert document["expiresAt"] == "2015-01-01T00:00:00Z"
        assert Keyring.from_docker_config(document).lookup(f"{host}/x:1")[0].username == "AWS"


def test_pull_secrets_are_mirrored_from_the_cluster_and_missing_ones_named(
    aws: None, cluster: KubeCluster, kube_api: KubeApiServer
) -> None:
    regcred = {"auths": {"ghcr.io": {"username": "bot", "password": "ghp_example"}}}
    kube_api.seed_objects([docker_secret("regcred", "team-a", regcred)])
    client = boto3.client("secretsmanager", region_name=REGION)
    mirror = SecretsManagerMirror("prewarm/it", cluster, client=client)
    (arn,) = mirror.mirror("team-a", ["regcred"])
    assert json.loads(client.get_secret_value(SecretId=arn)["SecretString"]) == regcred
    with pytest.raises(PullSecretError, match="pull secret team-b/regcred not found"):
        mirror.mirror("team-b", ["regcred"])
    assert mirror.cleanup(set(), min_age_seconds=0) == ["prewarm/it/pull-secrets/team-a/regcred"]
