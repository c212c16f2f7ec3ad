"""`prewarm.adapters.kube.KubeCluster` against the embedded Kubernetes API server over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm.services.ports import (
    ClusterAuthError,
    ClusterConflictError,
    ClusterError,
    ClusterExpiredError,
    ClusterInvalidError,
    ClusterNotFoundError,
    ClusterUnavailableError,
)
from prewarm.settings import Settings
from prewarm_devtools.kubeapi import KubeApiServer, StatusError
from prewarm_devtools.kubeapi.synthetic import generate_cluster
from tests.support.kube import SAMPLE_CLUSTER

pytestmark = pytest.mark.integration

SYNTHETIC_NODES = 1200


class CountingToken:
    """A token source that counts the requests it authorises and can act before one of them."""

    def __init__(self, token: str, before: Callable[[int], None] | None = None) -> None:
        self.token = token
        self.calls = 0
        self._before = before

    def __call__(self) -> str:
        self.calls += 1
        if self._before is not None:
            self._before(self.calls)
        return self.token


@pytest.fixture(scope="module")
def sample_api(kube_api_module: KubeApiServer) -> KubeApiServer:
    """The sample EKS cluster (12 nodes, pods in `ml` and `shop`), shared by the read-only tests."""
    kube_api_module.seed_from_file(SAMPLE_CLUSTER)
    return kube_api_module


@pytest.fixture
def sample(sample_api: KubeApiServer) -> Iterator[KubeCluster]:
    with KubeCluster(sample_api.url, lambda: sample_api.token) as cluster:
        yield cluster


@pytest.fixture
def cluster(kube_api: KubeApiServer) -> Iterator[KubeCluster]:
    """An adapter on a fresh, empty server, for tests that write."""
    with KubeCluster(kube_api.url, lambda: kube_api.token) as adapter:
        yield adapter


def answer_every_request_with(api: KubeApiServer, error: StatusError, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the server answer every request with `error`'s Status, as a busy or locked-down EKS would."""

    def route(*args: object) -> None:
        raise error

    monkeypatch.setattr(api, "_route", route)


def names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def secret(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}


# -- import cost ---------------------------------------------------------------------------------------


def test_importing_the_adapter_does_not_import_kubernetes() -> None:
    code = (
        "import sys, prewarm.adapters.kube, prewarm.adapters.eks_auth; "
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'; "
        "assert 'boto3' not in sys.modules, 'boto3 imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- reads ----------------------------------------------------------------------------------------------


def test_label_selector_is_evaluated_by_the_server(sample: KubeCluster, sample_api: KubeApiServer) -> None:
    # Given the sample cluster's 12 nodes, 2 of them in the gpu node group
    all_nodes = sample.list_nodes()

    # When nodes are listed with a label selector
    gpu = sample.list_nodes(label_selector="eks.amazonaws.com/nodegroup=gpu")
    not_arm = sample.list_nodes(label_selector="kubernetes.io/arch notin (arm64),eks.amazonaws.com/nodegroup")

    # Then only the matching nodes come back, as raw API dicts
    assert len(all_nodes) == 12
    assert len(gpu) == 2
    assert all(n["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == "gpu" for n in gpu)
    assert sorted(names(not_arm)) == sorted(
        n["metadata"]["name"]
        for n in all_nodes
        if n["metadata"]["labels"].get("kubernetes.io/arch") != "arm64"
        and "eks.amazonaws.com/nodegroup" in n["metadata"]["labels"]
    )
    assert isinstance(gpu[0]["status"]["capacity"], dict)


def test_get_node_returns_the_node_or_none(sample: KubeCluster) -> None:
    first = sample.list_nodes()[0]
    assert sample.get_node(first["metadata"]["name"]) == first
    assert sample.get_node("ip-10-9-9-9.us-west-2.compute.internal") is None


def test_pods_by_namespace_and_across_all_namespaces(sample: KubeCluster) -> None:
    # Given pods of inference in ml (3) and web in shop (5)
    # When pods are listed per namespace and for all namespaces
    ml = sample.list_pods("ml")
    shop = sample.list_pods("shop", label_selector="app.kubernetes.io/name=web")
    everywhere = sample.list_pods(None)

    # Then each namespace returns its own, and None returns them all
    assert {p["metadata"]["namespace"] for p in ml} == {"ml"} and len(ml) == 3
    assert {p["metadata"]["namespace"] for p in shop} == {"shop"} and len(shop) == 5
    assert sorted(names(everywhere)) == sorted(names(ml) + names(shop))
    assert sample.list_pods("no-such-namespace") == []


def test_field_selector_on_spec_node_name(sample: KubeCluster) -> None:
    # Given a pod scheduled on a node
    scheduled = next(p for p in sample.list_pods(None) if p["spec"].get("nodeName"))
    node_name = scheduled["spec"]["nodeName"]

    # When pods are listed with the field selector the dispatcher uses
    on_node = sample.list_pods(None, field_selector=f"spec.nodeName={node_name}")
    running_on_node = sample.list_pods(None, field_selector=f"spec.nodeName={node_name},status.phase=Running")

    # Then exactly the pods bound to that node come back
    expected = [p for p in sample.list_pods(None) if p["spec"].get("nodeName") == node_name]
    assert sorted(names(on_node)) == sorted(names(expected))
    assert {p["status"]["phase"] for p in running_on_node} <= {"Running"}


def test_namespaces_by_label(sample: KubeCluster) -> None:
    assert names(sample.list_namespaces(label_selector="team=ml-platform")) == ["ml"]
    assert {"default", "kube-system", "ml", "shop"} <= set(names(sample.list_namespaces()))


# -- paging -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as api:
        api.seed_objects(generate_cluster(SYNTHETIC_NODES, seed=6))
        yield api


def test_pages_of_500_return_every_node_exactly_once(synthetic_api: KubeApiServer) -> None:
    # Given 1,200 nodes and an adapter listing 500 per page
    token = CountingToken(synthetic_api.token)
    with KubeCluster(synthetic_api.url, token, page_size=500) as cluster:
        # When all nodes are listed
        nodes = cluster.list_nodes()

    # Then every node comes back exactly once, in three requests
    listed = names(nodes)
    assert len(listed) == SYNTHETIC_NODES
    assert sorted(listed) == sorted(names(synthetic_api.list_objects("nodes")))
    assert token.calls == 3


def test_an_expired_continue_token_restarts_the_listing_once(synthetic_api: KubeApiServer) -> None:
    # Given continue tokens that expire just before the second page is asked for
    def expire_before_second_request(call: int) -> None:
        if call == 2:
            synthetic_api.expire_continue_tokens()

    token = CountingToken(synthetic_api.token, expire_before_second_request)
    with KubeCluster(synthetic_api.url, token, page_size=500) as cluster:
        # When all nodes are listed
        nodes = cluster.list_nodes()

    # Then the listing starts over (1 page, the 410, then 3 pages) and returns each node once
    assert token.calls == 5
    assert sorted(names(nodes)) == sorted(names(synthetic_api.list_objects("nodes")))


def test_a_second_expiry_during_the_restarted_listing_is_raised(synthetic_api: KubeApiServer) -> None:
    # Given continue tokens that expire before every second page
    def expire_before_second_pages(call: int) -> None:
        if call in (2, 4):
            synthetic_api.expire_continue_tokens()

    with (
        KubeCluster(
            synthetic_api.url, CountingToken(synthetic_api.token, expire_before_second_pages), page_size=500
        ) as cluster,
        # When all nodes are listed, Then the second 410 is not retried again
        pytest.raises(ClusterExpiredError) as caught,
    ):
        cluster.list_nodes()
    assert caught.value.status == 410 and caught.value.reason == "Expired"


def test_page_size_is_configurable(synthetic_api: KubeApiServer) -> None:
    token = CountingToken(synthetic_api.token)
    with KubeCluster(synthetic_api.url, token, page_size=100) as cluster:
        gpu = cluster.list_nodes(label_selector="eks.amazonaws.com/nodegroup=gpu")
    expected = [
        n
        for n in synthetic_api.list_objects("nodes")
        if n["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] == "gpu"
    ]
    assert sorted(names(gpu)) == sorted(names(expected))
    assert token.calls == max(1, -(-len(expected) // 100))


# -- writes ------------------------------------------------------------------------------------------------


def test_secret_create_get_replace(cluster: KubeCluster) -> None:
    # Given a created secret
    created = cluster.create_secret("default", secret("pull", token="one"))
    assert created["metadata"]["resourceVersion"]

    # When it is read and replaced with its resourceVersion
    current = cluster.get_secret("default", "pull")
    assert current is not None
    current["data"] = {"token": "dHdv"}  # "two"
    replaced = cluster.replace_secret("default", "pull", current)

    # Then the new data is stored under a new resourceVersion
    assert replaced["data"] == {"token": "dHdv"}
    assert replaced["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert cluster.get_secret("default", "missing") is None


def test_service_account_patches_merge_or_replace_lists(cluster: KubeCluster, kube_api: KubeApiServer) -> None:
    # Given a service account with a secret and an image pull secret
    kube_api.seed_objects(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "builder", "namespace": "default"},
                "secrets": [{"name": "token"}],
                "imagePullSecrets": [{"name": "existing"}],
            }
        ]
    )

    # When a strategic merge patch adds to both lists
    merged = cluster.patch_service_account(
        "default", "builder", {"secrets": [{"name": "extra"}], "imagePullSecrets": [{"name": "prewarm"}]}
    )

    # Then `secrets` (merge key `name`) merges, and `imagePullSecrets` (no merge key) is replaced
    assert sorted(s["name"] for s in merged["secrets"]) == ["extra", "token"]
    assert merged["imagePullSecrets"] == [{"name": "prewarm"}]

    # When a JSON merge patch sets `secrets`, Then the list is replaced
    replaced = cluster.patch_service_account("default", "builder", {"secrets": [{"name": "only"}]}, strategic=False)
    assert replaced["secrets"] == [{"name": "only"}]
    assert cluster.get_service_account("default", "builder") == replaced
    assert cluster.get_service_account("default", "nobody") is None


# -- errors ------------------------------------------------------------------------------------------------


def test_a_token_without_an_accepted_prefix_is_an_auth_error(kube_api: KubeApiServer) -> None:
    with (
        KubeCluster(kube_api.url, lambda: "eks-token-of-another-kind") as cluster,
        pytest.raises(ClusterAuthError) as caught,
    ):
        cluster.list_nodes()
    assert caught.value.status == 401
    assert "EKS access entry" in str(caught.value)
    assert not caught.value.retryable


def test_forbidden_is_an_auth_error_naming_rbac(kube_api: KubeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    forbidden = StatusError(403, "Forbidden", 'nodes is forbidden: User "prewarm" cannot list resource "nodes"')
    answer_every_request_with(kube_api, forbidden, monkeypatch)
    with KubeCluster(kube_api.url, lambda: kube_api.token) as cluster, pytest.raises(ClusterAuthError) as caught:
        cluster.list_nodes()
    assert caught.value.status == 403 and caught.value.reason == "Forbidden"
    assert "cannot list resource" in str(caught.value) and "RBAC" in str(caught.value)


def test_create_in_a_missing_namespace_is_not_found(cluster: KubeCluster) -> None:
    with pytest.raises(ClusterNotFoundError) as caught:
        cluster.create_secret("no-such-namespace", secret("pull", token="x"))
    assert caught.value.status == 404 and caught.value.reason == "NotFound"
    assert 'namespaces "no-such-namespace" not found' in str(caught.value)


def test_replace_of_a_missing_secret_is_not_found(cluster: KubeCluster) -> None:
    with pytest.raises(ClusterNotFoundError):
        cluster.replace_secret("default", "missing", secret("missing", token="x"))


def test_creating_an_existing_secret_is_a_conflict_already_exists(cluster: KubeCluster) -> None:
    cluster.create_secret("default", secret("pull", token="x"))
    with pytest.raises(ClusterConflictError) as caught:
        cluster.create_secret("default", secret("pull", token="y"))
    assert caught.value.status == 409 and caught.value.reason == "AlreadyExists"


def test_replace_with_a_stale_resource_version_is_a_conflict(cluster: KubeCluster) -> None:
    # Given two readers of the same secret
    cluster.create_secret("default", secret("pull", token="x"))
    first = cluster.get_secret("default", "pull")
    second = cluster.get_secret("default", "pull")
    assert first is not None and second is not None

    # When both replace it, the second with the now stale resourceVersion
    cluster.replace_secret("default", "pull", {**first, "stringData": {"token": "first"}})
    with pytest.raises(ClusterConflictError) as caught:
        cluster.replace_secret("default", "pull", {**second, "stringData": {"token": "second"}})

    # Then the second write is refused with reason Conflict and the API's message
    assert caught.value.status == 409 and caught.value.reason == "Conflict"
    assert "the object has been modified" in str(caught.value)


def test_an_invalid_secret_is_invalid_with_the_servers_message(cluster: KubeCluster) -> None:
    with pytest.raises(ClusterInvalidError) as caught:
        cluster.create_secret("default", secret("Not_A_DNS_Name", token="x"))
    assert caught.value.status == 422 and caught.value.reason == "Invalid"
    assert "metadata.name" in str(caught.value) and "Not_A_DNS_Name" in str(caught.value)


def test_a_malformed_label_selector_is_invalid(cluster: KubeCluster) -> None:
    with pytest.raises(ClusterInvalidError) as caught:
        cluster.list_nodes(label_selector="a in (b")
    assert caught.value.status == 400


@pytest.mark.parametrize(("code", "reason"), [(429, "TooManyRequests"), (503, "ServiceUnavailable")])
def test_throttling_and_server_errors_are_retryable_with_retry_after(
    kube_api: KubeApiServer, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    busy = StatusError(code, reason, "try again later", details={"retryAfterSeconds": 2}, headers={"Retry-After": "3"})
    answer_every_request_with(kube_api, busy, monkeypatch)
    with KubeCluster(kube_api.url, lambda: kube_api.token) as cluster, pytest.raises(ClusterUnavailableError) as caught:
        cluster.get_node("any")
    assert caught.value.status == code and caught.value.reason == reason
    assert caught.value.retry_after == 3.0
    assert caught.value.retryable


def test_connection_refused_is_unavailable() -> None:
    # Given the address of a server that has stopped
    with KubeApiServer() as api:
        url = api.url
    # When the adapter calls it, Then the error is retryable and names the host
    with KubeCluster(url, lambda: "test-token") as cluster, pytest.raises(ClusterUnavailableError) as caught:
        cluster.list_nodes()
    assert url in str(caught.value)
    assert caught.value.status is None
    assert isinstance(caught.value, ClusterError)


def test_a_read_timeout_is_unavailable(kube_api: KubeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server that takes longer to answer than the adapter's read timeout
    route = kube_api._route

    def slow_route(*args: Any) -> Any:
        time.sleep(0.3)
        return route(*args)

    monkeypatch.setattr(kube_api, "_route", slow_route)
    adapter = KubeCluster(kube_api.url, lambda: kube_api.token, request_timeout=(1.0, 0.1))

    # When a list is asked for, Then the timeout is a retryable error
    with adapter as cluster, pytest.raises(ClusterUnavailableError, match=r"no answer within 0\.1 s"):
        cluster.list_namespaces()


# -- authentication and construction -----------------------------------------------------------------------


def test_the_token_source_is_asked_before_every_request(kube_api: KubeApiServer) -> None:
    # Given a token source whose token changes between calls
    tokens = iter([kube_api.token, "revoked", kube_api.token])
    with KubeCluster(kube_api.url, lambda: next(tokens)) as cluster:
        # When three requests are made, Then each carries the token current at that moment
        assert cluster.list_namespaces()
        with pytest.raises(ClusterAuthError):
            cluster.list_namespaces()
        assert cluster.list_namespaces()


def test_from_kubeconfig_uses_the_servers_address_and_token(kube_api: KubeApiServer, tmp_path: Path) -> None:
    path = kube_api.write_kubeconfig(tmp_path / "config")
    with KubeCluster.from_kubeconfig(str(path)) as cluster:
        assert cluster.host == kube_api.url
        assert "kube-system" in names(cluster.list_namespaces())


def test_from_settings_with_kubeconfig(kube_api: KubeApiServer, tmp_path: Path) -> None:
    path = kube_api.write_kubeconfig(tmp_path / "config")
    settings = Settings.from_env({"TABLE_NAME": "jobs", "KUBECONFIG": str(path)})
    with KubeCluster.from_settings(settings) as cluster:
        assert "default" in names(cluster.list_namespaces())


def test_from_kubeconfig_without_credentials_is_an_auth_error(kube_api: KubeApiServer, tmp_path: Path) -> None:
    config = kube_api.kubeconfig()
    config["users"][0]["user"] = {}
    path = tmp_path / "config"
    path.write_text(json.dumps(config))
    with KubeCluster.from_kubeconfig(str(path)) as cluster, pytest.raises(ClusterAuthError):
        cluster.list_namespaces()


def test_from_settings_with_an_endpoint_sends_an_eks_token(kube_api: KubeApiServer) -> None:
    # Given an explicit endpoint, a cluster name and AWS credentials
    settings = Settings.from_env(
        {"TABLE_NAME": "jobs", "KUBE_API_ENDPOINT": kube_api.url, "CLUSTER_NAME": "prewarm-local"}
    )
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-west-2")

    # When the adapter is built from the settings, Then its k8s-aws-v1. token is accepted
    with KubeCluster.from_settings(settings, session) as cluster:
        assert "default" in names(cluster.list_namespaces())
