"""EKS tokens, the cluster endpoint lookup, and how `KubeCluster.from_settings` chooses its connection.

moto does not answer presigned STS URLs, so the round trip an API server makes to STS with the
token is not exercised here: these tests check the token's form and signature inputs only.
"""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters import eks_auth
from prewarm.adapters.eks_auth import EksTokenSource, describe_cluster_endpoint
from prewarm.adapters.kube import KubeCluster, ca_pem
from prewarm.services.ports import ClusterAuthError, ClusterConfigError
from prewarm.settings import Settings
from tests.support.clock import Clock

REGION = "eu-west-1"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A clock for the token source that botocore also signs with, so re-signed tokens differ visibly."""
    clock = Clock(1_700_000_000.0)
    monkeypatch.setattr(
        "botocore.auth.get_current_datetime",
        lambda: datetime.datetime.fromtimestamp(clock.now, datetime.UTC).replace(tzinfo=None),
    )
    return clock


def session(region: str | None = REGION) -> boto3.Session:
    return boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=region)


def decode(token: str) -> str:
    payload = token.removeprefix("k8s-aws-v1.")
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()


def query_of(token: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(decode(token)).query)


def settings(**env: str) -> Settings:
    return Settings.from_env({"TABLE_NAME": "jobs", **env})


def self_signed_ca_pem() -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


# -- EksTokenSource ----------------------------------------------------------------------------------


def test_token_is_prefixed_unpadded_base64url_of_a_presigned_get_caller_identity_url() -> None:
    # Given a token source for a cluster
    source = EksTokenSource("prod-cluster", session())

    # When a token is made
    token = source()

    # Then it has the EKS prefix, no base64 padding, and decodes to a presigned STS URL
    assert token.startswith("k8s-aws-v1.")
    assert "=" not in token
    assert all(c.isalnum() or c in "-_." for c in token)
    url = urlsplit(decode(token))
    query = parse_qs(url.query)
    assert url.scheme == "https"
    assert query["Action"] == ["GetCallerIdentity"]
    assert query["Version"] == ["2011-06-15"]
    assert query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Credential"][0].startswith("AKIDEXAMPLE/")
    assert f"/{REGION}/sts/aws4_request" in query["X-Amz-Credential"][0]
    assert "X-Amz-Signature" in query


def test_signature_covers_the_cluster_id_header() -> None:
    # Given a token source
    source = EksTokenSource("prod-cluster", session())

    # When a token is made
    signed_headers = query_of(source())["X-Amz-SignedHeaders"][0].split(";")

    # Then the host and x-k8s-aws-id are signed, and the cluster name is not sent in the URL
    assert signed_headers == ["host", "x-k8s-aws-id"]
    assert "prod-cluster" not in decode(source())


def test_tokens_for_different_clusters_differ(clock: Clock) -> None:
    # Given two token sources signing at the same instant with the same credentials
    first = EksTokenSource("cluster-a", session())
    second = EksTokenSource("cluster-b", session())

    # Then their signatures differ: the cluster name is part of what is signed
    assert query_of(first())["X-Amz-Signature"] != query_of(second())["X-Amz-Signature"]


@pytest.mark.parametrize(
    ("region", "host"),
    [("eu-west-1", "sts.eu-west-1.amazonaws.com"), ("cn-north-1", "sts.cn-north-1.amazonaws.com.cn")],
)
def test_token_uses_the_regional_sts_endpoint_of_the_sessions_region(region: str, host: str) -> None:
    # Given a session in a region
    source = EksTokenSource("prod-cluster", session(region))

    # Then the presigned URL goes to that region's STS endpoint
    assert urlsplit(decode(source())).hostname == host


def test_token_is_reused_before_the_refresh_margin(clock: Clock) -> None:
    # Given a token made now
    source = EksTokenSource("prod-cluster", session(), clock=clock)
    first = source()

    # When it is asked for again 9 minutes later
    clock.now += 540

    # Then the same token is returned
    assert source() == first


def test_token_is_re_signed_once_older_than_the_refresh_margin(clock: Clock) -> None:
    # Given a token made now
    source = EksTokenSource("prod-cluster", session(), clock=clock)
    first = source()

    # When it is asked for again 10 minutes later
    clock.now += 600
    second = source()

    # Then a new token is signed at the later time, and kept until it ages in turn
    assert query_of(first)["X-Amz-Date"] == ["20231114T221320Z"]
    assert query_of(second)["X-Amz-Date"] == ["20231114T222320Z"]
    clock.now += 60
    assert source() == second


def test_token_is_re_signed_when_the_clock_goes_backwards(clock: Clock) -> None:
    # Given a token made now
    source = EksTokenSource("prod-cluster", session(), clock=clock)
    first = source()

    # When the clock steps back an hour (the token's age is unknown)
    clock.now -= 3600

    # Then the token is signed again
    assert source() != first


def test_token_source_needs_a_cluster_name() -> None:
    with pytest.raises(ClusterConfigError, match="CLUSTER_NAME"):
        EksTokenSource("", session())


def test_token_without_a_region_names_aws_region(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a session with no region at all
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    source = EksTokenSource("prod-cluster", session(region=None))
    # When a token is asked for, Then the error says how to set one
    with pytest.raises(ClusterConfigError, match="AWS_REGION"):
        source()


def test_token_without_credentials_is_an_auth_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    # Given an environment with no AWS credentials anywhere
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    source = EksTokenSource("prod-cluster", boto3.Session(region_name=REGION))

    # When a token is asked for, Then the error says credentials are missing
    with pytest.raises(ClusterAuthError, match="no AWS credentials"):
        source()


# -- describe_cluster_endpoint ---------------------------------------------------------------------


def create_cluster() -> tuple[str, dict[str, object]]:
    name = f"cluster-{uuid.uuid4().hex[:8]}"
    eks = boto3.client("eks", region_name=REGION)
    cluster = eks.create_cluster(
        name=name,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )["cluster"]
    return name, cluster


def test_describe_cluster_endpoint_returns_endpoint_and_ca_data(aws: None) -> None:
    # Given an EKS cluster
    name, cluster = create_cluster()

    # When its endpoint is looked up
    endpoint, ca_data = describe_cluster_endpoint(name, boto3.Session(region_name=REGION))

    # Then the endpoint and CA data are EKS's
    assert endpoint == cluster["endpoint"]
    assert ca_data == cluster["certificateAuthority"]["data"]  # type: ignore[index]


def test_describe_cluster_endpoint_is_cached_for_the_process(aws: None) -> None:
    # Given a cluster looked up once
    name, _ = create_cluster()
    first = describe_cluster_endpoint(name, boto3.Session(region_name=REGION))

    # When the cluster disappears and it is looked up again
    boto3.client("eks", region_name=REGION).delete_cluster(name=name)

    # Then the cached answer is returned without calling EKS
    assert describe_cluster_endpoint(name, boto3.Session(region_name=REGION)) == first


def test_describe_cluster_endpoint_of_an_unknown_cluster_names_cluster_name(aws: None) -> None:
    with pytest.raises(ClusterConfigError, match=r"'nope' not found in region eu-west-1: check CLUSTER_NAME"):
        describe_cluster_endpoint("nope", boto3.Session(region_name=REGION))


def test_describe_cluster_endpoint_without_credentials_is_an_auth_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    with pytest.raises(ClusterAuthError, match="no AWS credentials"):
        describe_cluster_endpoint("prod-cluster", boto3.Session(region_name=REGION))


def test_endpoint_cache_is_per_region(aws: None) -> None:
    # Given a cluster name known in one region only
    name, _ = create_cluster()
    describe_cluster_endpoint(name, boto3.Session(region_name=REGION))

    # Then the same name in another region is looked up there, not served from the cache
    with pytest.raises(ClusterConfigError, match="not found in region us-east-1"):
        describe_cluster_endpoint(name, boto3.Session(region_name="us-east-1"))
    assert (name, REGION) in eks_auth._endpoints


# -- CA data and KubeCluster.from_settings ------------------------------------------------------------


def test_ca_pem_accepts_pem_and_base64_pem() -> None:
    pem = self_signed_ca_pem()
    encoded = base64.b64encode(pem.encode()).decode()
    assert ca_pem(pem, "ca_data") == pem.strip()
    assert ca_pem(encoded, "KUBE_CA_DATA") == pem


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("not base64 at all!", "is not base64-encoded PEM"),
        (base64.b64encode(b"hello").decode(), "holds no valid PEM CA certificate"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "holds no valid PEM CA"),
    ],
)
def test_invalid_ca_data_names_the_parameter(data: str, problem: str) -> None:
    with pytest.raises(ClusterConfigError, match=f"^KUBE_CA_DATA {problem}"):
        ca_pem(data, "KUBE_CA_DATA")


def test_from_settings_rejects_the_ca_data_of_moto_eks_naming_the_cluster(aws: None) -> None:
    # Given an EKS cluster whose CA data is not PEM (moto makes up random text)
    name, _ = create_cluster()

    # When the adapter is built from CLUSTER_NAME alone
    with pytest.raises(ClusterConfigError) as caught:
        KubeCluster.from_settings(settings(CLUSTER_NAME=name), boto3.Session(region_name=REGION))

    # Then the error names where the bad CA data came from
    assert f"certificateAuthority.data of EKS cluster {name!r}" in str(caught.value)


def test_from_settings_uses_the_eks_endpoint_of_cluster_name(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an EKS cluster with a valid CA
    name, cluster = create_cluster()
    # (moto's CA data is random text, so the cached answer is replaced by one holding a real CA)
    ca_data = base64.b64encode(self_signed_ca_pem().encode()).decode()
    monkeypatch.setitem(eks_auth._endpoints, (name, REGION), (str(cluster["endpoint"]), ca_data))

    # When the adapter is built from CLUSTER_NAME
    kube = KubeCluster.from_settings(settings(CLUSTER_NAME=name), boto3.Session(region_name=REGION))

    # Then it talks to the cluster's endpoint
    assert kube.host == str(cluster["endpoint"]).rstrip("/")


def test_from_settings_prefers_an_explicit_endpoint_and_ca() -> None:
    pem = self_signed_ca_pem()
    env = {
        "CLUSTER_NAME": "prod",
        "KUBE_API_ENDPOINT": "https://kube.example:6443",
        "KUBE_CA_DATA": base64.b64encode(pem.encode()).decode(),
        "KUBECONFIG": "/nonexistent/kubeconfig",
    }
    kube = KubeCluster.from_settings(settings(**env), session())
    assert kube.host == "https://kube.example:6443"


def test_from_settings_with_an_explicit_endpoint_rejects_bad_kube_ca_data() -> None:
    env = {"CLUSTER_NAME": "prod", "KUBE_API_ENDPOINT": "https://kube.example", "KUBE_CA_DATA": "bm9wZQ=="}
    with pytest.raises(ClusterConfigError, match=r"^KUBE_CA_DATA holds no valid PEM"):
        KubeCluster.from_settings(settings(**env), session())


def test_from_settings_with_an_explicit_endpoint_needs_cluster_name() -> None:
    with pytest.raises(ClusterConfigError, match="CLUSTER_NAME is empty"):
        KubeCluster.from_settings(settings(KUBE_API_ENDPOINT="https://kube.example"), session())


def test_from_settings_with_nothing_configured_lists_the_choices() -> None:
    with pytest.raises(ClusterConfigError, match=r"set CLUSTER_NAME .* or KUBECONFIG"):
        KubeCluster.from_settings(settings(), session())


def test_from_settings_with_a_missing_kubeconfig_names_it(tmp_path: object) -> None:
    path = f"{tmp_path}/missing-kubeconfig"
    with pytest.raises(ClusterConfigError, match=f"KUBECONFIG '{path}' cannot be used"):
        KubeCluster.from_settings(settings(KUBECONFIG=path), session())


def test_plain_constructor_rejects_a_host_without_scheme() -> None:
    with pytest.raises(ClusterConfigError, match="must be an http:// or https:// URL"):
        KubeCluster("kube.example:6443")


def test_plain_constructor_rejects_a_page_size_below_one() -> None:
    with pytest.raises(ClusterConfigError, match="page_size must be at least 1, got 0"):
        KubeCluster("http://127.0.0.1:1", page_size=0)
