"""Secrets Manager: pullSecrets mirroring and its cleanup, the agents' registry credentials (moto)."""

from __future__ import annotations

import base64
import json
from typing import Any

import boto3
import pytest

from prewarm.adapters.secrets import (
    AgentCredentials,
    ConfigParameterError,
    SecretsManagerCredentialStore,
    SecretsManagerMirror,
    read_config_parameter,
)
from prewarm.domain.refresh import RegistryToken
from prewarm.services.ports import AgentCredentialsError, ClusterAuthError, ClusterUnavailableError, PullSecretError
from tests.support.clock import HOUR, T0, Clock
from tests.support.cluster import FakeCluster
from tests.support.credentials import PASSWORD, REGION

pytestmark = pytest.mark.usefixtures("aws")

HOST = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
DOCKER_CONFIG = {"auths": {"registry.example.com": {"username": "robot", "password": PASSWORD}}}


def sm() -> Any:
    return boto3.client("secretsmanager", region_name=REGION)


def k8s_secret(name: str, document: Any, kind: str = "kubernetes.io/dockerconfigjson",
               key: str = ".dockerconfigjson") -> dict[str, Any]:
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return {"metadata": {"name": name, "namespace": "team-a"}, "type": kind,
            "data": {key: base64.b64encode(raw).decode()}}


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def mirror(cluster: FakeCluster, clock: Clock) -> SecretsManagerMirror:
    return SecretsManagerMirror("prewarm/test", cluster, client=sm(), clock=clock)


def stored(name: str) -> tuple[Any, dict[str, str]]:
    value = sm().get_secret_value(SecretId=name)["SecretString"]
    tags = {t["Key"]: t["Value"] for t in sm().describe_secret(SecretId=name).get("Tags", [])}
    return json.loads(value), tags


def versions(name: str) -> int:
    return len(sm().list_secret_version_ids(SecretId=name)["Versions"])


# -- mirroring ---------------------------------------------------------------------------------------


def test_pull_secret_is_mirrored_with_tags_and_its_arn_returned(cluster: FakeCluster,
                                                                mirror: SecretsManagerMirror) -> None:
    cluster.secrets[("team-a", "regcred")] = k8s_secret("regcred", DOCKER_CONFIG)
    (arn,) = mirror.mirror("team-a", ["regcred"])
    assert ":secret:prewarm/test/pull-secrets/team-a/regcred-" in arn
    value, tags = stored("prewarm/test/pull-secrets/team-a/regcred")
    assert value == DOCKER_CONFIG
    assert tags == {"prewarm:namespace": "team-a", "prewarm:secret": "regcred", "prewarm:mirrored-at": str(int(T0))}


def test_mirror_writes_a_new_version_only_when_the_secret_changed(cluster: FakeCluster,
                                                                  mirror: SecretsManagerMirror) -> None:
    name = "prewarm/test/pull-secrets/team-a/regcred"
    cluster.secrets[("team-a", "regcred")] = k8s_secret("regcred", DOCKER_CONFIG)
    first = mirror.mirror("team-a", ["regcred"])
    assert mirror.mirror("team-a", ["regcred"]) == first
    assert versions(name) == 1
    changed = {"auths": {"registry.example.com": {"username": "robot", "password": "rotated"}}}
    cluster.secrets[("team-a", "regcred")] = k8s_secret("regcred", changed)
    assert mirror.mirror("team-a", ["regcred"]) == first
    assert versions(name) == 2 and stored(name)[0] == changed


def test_legacy_dockercfg_is_converted_to_a_docker_config(cluster: FakeCluster, mirror: SecretsManagerMirror) -> None:
    legacy = {"https://index.docker.io/v1/": {"auth": base64.b64encode(b"me:pw").decode(), "email": "a@b.c"}}
    cluster.secrets[("team-a", "old")] = k8s_secret("old", legacy, "kubernetes.io/dockercfg", ".dockercfg")
    mirror.mirror("team-a", ["old"])
    assert stored("prewarm/test/pull-secrets/team-a/old")[0] == {"auths": legacy}


def test_several_names_keep_their_order_and_duplicates_are_mirrored_once(cluster: FakeCluster,
                                                                         mirror: SecretsManagerMirror) -> None:
    for name in ("b", "a"):
        cluster.secrets[("team-a", name)] = k8s_secret(name, DOCKER_CONFIG)
    arns = mirror.mirror("team-a", ["b", "a", "b"])
    assert [arn.split(":secret:")[1].rsplit("-", 1)[0] for arn in arns] == [
        "prewarm/test/pull-secrets/team-a/b", "prewarm/test/pull-secrets/team-a/a"]


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (None, "pull secret team-a/regcred not found: create it in namespace team-a"),
        (k8s_secret("regcred", DOCKER_CONFIG, kind="Opaque"), "has type 'Opaque'; image pull secrets need type"),
        ({"metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson", "data": {}},
         "has no data key '.dockerconfigjson'"),
        (k8s_secret("regcred", b'{"auths": {"r.io": {"password": "' + PASSWORD.encode() + b'"'),
         "data '.dockerconfigjson' is not base64 of a JSON document"),
        (k8s_secret("regcred", ["not", "an", "object"]), "is not a JSON object"),
        (k8s_secret("regcred", {"auths": {"r.io": {"auth": PASSWORD + "!"}}}), 'entry "r.io": field "auth"'),
    ],
)
def test_missing_or_malformed_pull_secret_names_secret_and_namespace_never_its_contents(
    cluster: FakeCluster, mirror: SecretsManagerMirror, secret: dict[str, Any] | None, message: str
) -> None:
    if secret is not None:
        cluster.secrets[("team-a", "regcred")] = secret
    with pytest.raises(PullSecretError) as raised:
        mirror.mirror("team-a", ["regcred"])
    assert message in str(raised.value) and "team-a/regcred" in str(raised.value)
    assert PASSWORD not in str(raised.value) and raised.value.__cause__ is None


def test_forbidden_read_fails_the_job_but_an_unavailable_api_is_retried(cluster: FakeCluster,
                                                                        mirror: SecretsManagerMirror) -> None:
    cluster.broken["team-a"] = ClusterAuthError("secrets is forbidden", status=403)
    with pytest.raises(PullSecretError, match="team-a/regcred cannot be read: secrets is forbidden"):
        mirror.mirror("team-a", ["regcred"])
    cluster.broken["team-a"] = ClusterUnavailableError("503", status=503)
    with pytest.raises(ClusterUnavailableError):
        mirror.mirror("team-a", ["regcred"])


def test_secret_deleted_with_a_recovery_window_is_restored_and_updated(cluster: FakeCluster,
                                                                       mirror: SecretsManagerMirror) -> None:
    name = "prewarm/test/pull-secrets/team-a/regcred"
    cluster.secrets[("team-a", "regcred")] = k8s_secret("regcred", DOCKER_CONFIG)
    mirror.mirror("team-a", ["regcred"])
    sm().delete_secret(SecretId=name, RecoveryWindowInDays=7)
    mirror.mirror("team-a", ["regcred"])
    assert "DeletedDate" not in sm().describe_secret(SecretId=name)
    assert stored(name)[0] == DOCKER_CONFIG


# -- cleanup -------------------------------------------------------------------------------------------


def mirrored(cluster: FakeCluster, mirror: SecretsManagerMirror, *pairs: tuple[str, str]) -> None:
    for namespace, name in pairs:
        cluster.secrets[(namespace, name)] = k8s_secret(name, DOCKER_CONFIG)
        mirror.mirror(namespace, [name])


def test_cleanup_force_deletes_unreferenced_mirrors_past_the_grace_period(
    cluster: FakeCluster, mirror: SecretsManagerMirror, clock: Clock
) -> None:
    mirrored(cluster, mirror, ("team-a", "keep"), ("team-a", "drop"), ("team-b", "drop"))
    sm().create_secret(Name="prewarm/test/registry/example.com", SecretString="{}")
    sm().create_secret(Name="prewarm/test/pull-secrets/odd", SecretString="{}")
    clock.now = T0 + 2 * HOUR
    deleted = mirror.cleanup({("team-a", "keep")}, min_age_seconds=0)
    assert sorted(deleted) == ["prewarm/test/pull-secrets/team-a/drop", "prewarm/test/pull-secrets/team-b/drop"]
    # Gone for good (no recovery window), and nothing else touched
    left = {s["Name"] for s in sm().list_secrets(IncludePlannedDeletion=True)["SecretList"]}
    assert left == {"prewarm/test/pull-secrets/team-a/keep", "prewarm/test/registry/example.com",
                    "prewarm/test/pull-secrets/odd"}


def test_cleanup_keeps_mirrors_written_recently(cluster: FakeCluster, mirror: SecretsManagerMirror,
                                                clock: Clock) -> None:
    mirrored(cluster, mirror, ("team-a", "new"))
    # moto stamps CreatedDate with the real time; the mirror's own tag is what counts
    clock.now = T0 + 60
    assert mirror.cleanup(set(), min_age_seconds=float(2**40)) == []
    assert mirror.cleanup(set(), min_age_seconds=0) == ["prewarm/test/pull-secrets/team-a/new"]


def test_cleanup_ignores_another_prefix(cluster: FakeCluster, clock: Clock) -> None:
    other = SecretsManagerMirror("prewarm/other", cluster, client=sm(), clock=clock)
    mirrored(cluster, other, ("team-a", "regcred"))
    mine = SecretsManagerMirror("prewarm/test", cluster, client=sm(), clock=clock)
    assert mine.cleanup(set(), min_age_seconds=0) == []


# -- the agents' registry credentials -------------------------------------------------------------------


def token(issued_at: float = T0) -> RegistryToken:
    return RegistryToken.for_hosts("AWS", PASSWORD, (HOST,), issued_at=issued_at, expires_at=issued_at + 12 * HOUR)


def test_credential_store_writes_docker_config_with_times_and_reads_back_only_metadata() -> None:
    store = SecretsManagerCredentialStore("prewarm/test", client=sm())
    assert store.read(HOST) is None
    arn = store.write(HOST, token())
    value, tags = stored(f"prewarm/test/registry/{HOST}")
    auth = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    assert value == {"auths": {HOST: {"username": "AWS", "password": PASSWORD, "auth": auth}},
                     "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-01T12:00:00Z"}
    assert tags == {"prewarm:registry": HOST}
    meta = store.read(HOST)
    assert meta is not None and meta.expires_at == T0 + 12 * HOUR and meta.hosts == {HOST}
    assert store.write(HOST, token(T0 + 7 * HOUR)) == arn


def test_unreadable_stored_credential_reads_as_absent_so_it_is_rewritten() -> None:
    sm().create_secret(Name=f"prewarm/test/registry/{HOST}", SecretString="not json")
    assert SecretsManagerCredentialStore("prewarm/test", client=sm()).read(HOST) is None


def test_agent_reads_pull_secret_mirrors_and_registry_credentials_as_one_keyring(
    cluster: FakeCluster, mirror: SecretsManagerMirror, clock: Clock
) -> None:
    cluster.secrets[("team-a", "regcred")] = k8s_secret("regcred", DOCKER_CONFIG)
    (arn,) = mirror.mirror("team-a", ["regcred"])
    registry_arn = SecretsManagerCredentialStore("prewarm/test", client=sm()).write(HOST, token())
    agent = AgentCredentials(client=sm(), clock=clock)
    keyring = agent.keyring([arn, registry_arn])
    assert keyring.lookup("registry.example.com/app:1")[0].username == "robot"
    assert keyring.lookup(f"{HOST}/app:1")[0].password == PASSWORD
    by_host = agent.registry_keyring("prewarm/test", HOST)
    assert by_host is not None and by_host.lookup(f"{HOST}/x")[0].username == "AWS"
    assert agent.registry_keyring("prewarm/test", "public.ecr.aws") is None


def test_agent_cache_serves_repeated_reads_until_max_age(clock: Clock) -> None:
    SecretsManagerCredentialStore("p", client=sm()).write(HOST, token())
    agent = AgentCredentials(client=sm(), clock=clock, max_age_seconds=300)
    agent.keyring([f"p/registry/{HOST}"])
    sm().put_secret_value(SecretId=f"p/registry/{HOST}", SecretString=json.dumps(
        {"auths": {HOST: {"username": "AWS", "password": "newer"}}, "expiresAt": "2026-01-02T00:00:00Z"}))
    assert agent.keyring([f"p/registry/{HOST}"]).auths[0].password == PASSWORD
    clock.now += 300
    assert agent.keyring([f"p/registry/{HOST}"]).auths[0].password == "newer"


def test_agent_refuses_expired_registry_credentials(clock: Clock) -> None:
    SecretsManagerCredentialStore("p", client=sm()).write(HOST, token())
    clock.now = T0 + 12 * HOUR
    with pytest.raises(AgentCredentialsError, match=r"expired at 2026-01-01T12:00:00Z; check that refresh_ecr"):
        AgentCredentials(client=sm(), clock=clock).keyring([f"p/registry/{HOST}"])


def test_agent_errors_name_the_secret_and_never_its_value(clock: Clock) -> None:
    agent = AgentCredentials(client=sm(), clock=clock)
    with pytest.raises(AgentCredentialsError, match="secret p/missing does not exist"):
        agent.keyring(["p/missing"])
    sm().create_secret(Name="p/bad", SecretString='{"auths": {"r.io": {"auth": "' + PASSWORD + '"}}}')
    with pytest.raises(AgentCredentialsError) as raised:
        agent.keyring(["p/bad"])
    assert "secret p/bad holds no usable docker config" in str(raised.value) and PASSWORD not in str(raised.value)


# -- configuration parameter ----------------------------------------------------------------------------


def test_config_parameter_is_read_decrypted_and_a_missing_one_is_named() -> None:
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/prewarm/credentials", Value='{"registries": []}', Type="SecureString")
    assert read_config_parameter("/prewarm/credentials", ssm) == '{"registries": []}'
    with pytest.raises(ConfigParameterError, match="CREDENTIALS_CONFIG_PARAMETER '/prewarm/absent' cannot be read: "
                                                   "ParameterNotFound"):
        read_config_parameter("/prewarm/absent", ssm)
