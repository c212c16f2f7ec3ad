"""Authentication, discovery, routing errors and the CLI, through real HTTP."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, ApiException, Configuration, CoreV1Api, VersionApi
from kubernetes.config import kube_config

from prewarm_devtools.kubeapi import KubeApiServer, StatusError
from tests.support.kube import SAMPLE_CLUSTER, call, status_of

pytestmark = pytest.mark.integration


def client_with_token(api: KubeApiServer, token: str | None) -> ApiClient:
    configuration = Configuration(host=api.url)
    if token is not None:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return ApiClient(configuration)


@pytest.mark.parametrize("token", [None, "wrong-prefix.abc"])
def test_missing_or_unknown_token_is_401(kube_api: KubeApiServer, token: str | None) -> None:
    # Given a client without a token, or with one that is no EKS token
    # When it lists nodes, Then the API answers 401 Unauthorized
    with client_with_token(kube_api, token) as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_node()
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"], status["message"]) == (401, "Unauthorized", "Unauthorized")


@pytest.mark.parametrize("authorization", ["Bearer ", "Bearer", "Basic dXNlcjpwYXNz", "k8s-aws-v1.no-scheme"])
def test_malformed_authorization_header_is_401(kube_api: KubeApiServer, authorization: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", kube_api.port, timeout=5)
    connection.request("GET", "/api/v1/nodes", headers={"Authorization": authorization})
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert (response.status, body["reason"]) == (401, "Unauthorized")


@pytest.mark.parametrize("token", ["k8s-aws-v1.aHR0cHM6Ly9zdHMuYW1hem9uYXdzLmNvbS8", "test-anything"])
def test_tokens_that_name_no_identity_are_401(kube_api: KubeApiServer, token: str) -> None:
    # Given an EKS-looking token that is no presigned GetCallerIdentity URL, and an unknown token
    # When it lists namespaces, Then the API answers 401 as for any unknown token
    with client_with_token(kube_api, token) as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_namespace()
    assert (raised.value.status, status_of(raised.value)["message"]) == (401, "Unauthorized")


def test_anonymous_requests_are_forbidden_as_on_eks() -> None:
    with KubeApiServer(anonymous="forbidden") as api, client_with_token(api, None) as client:
        assert VersionApi(client).get_code().git_version.startswith("v1.")
        answer = call(client, "GET", "/api/v1/namespaces/default/pods", authenticate=False)
        assert (answer.status, answer.body["reason"]) == (403, "Forbidden")
        assert answer.body["message"] == (
            'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" '
            'in the namespace "default"'
        )


def test_anonymous_requests_can_be_allowed_for_local_use() -> None:
    with KubeApiServer(anonymous="allowed") as api, client_with_token(api, None) as client:
        assert CoreV1Api(client).read_namespace("default").metadata.name == "default"
        # A token that is presented must still be valid.
    with KubeApiServer(anonymous="allowed") as api, client_with_token(api, "bad") as client:
        with pytest.raises(ApiException) as raised:
            CoreV1Api(client).read_namespace("default")
        assert raised.value.status == 401


def test_discovery_documents(kube_client: ApiClient) -> None:
    versions = call(kube_client, "GET", "/api").body
    assert (versions["kind"], versions["versions"]) == ("APIVersions", ["v1"])
    resources = call(kube_client, "GET", "/api/v1").body
    assert resources["kind"] == "APIResourceList" and resources["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in resources["resources"]}
    assert {"nodes", "nodes/status", "namespaces", "pods", "pods/status", "secrets", "serviceaccounts"} <= set(by_name)
    assert (by_name["nodes"]["namespaced"], by_name["pods"]["namespaced"]) == (False, True)
    assert "watch" in by_name["nodes"]["verbs"] and by_name["serviceaccounts"]["shortNames"] == ["sa"]
    assert call(kube_client, "GET", "/apis").body["kind"] == "APIGroupList"


def test_version_through_the_typed_client(kube_client: ApiClient) -> None:
    info = VersionApi(kube_client).get_code()
    assert info.git_version.startswith("v1.") and info.platform == "linux/amd64"


@pytest.mark.parametrize(
    ("method", "path", "status", "reason"),
    [
        ("GET", "/api/v1/deployments", 404, "NotFound"),
        ("GET", "/api/v1/pods/x", 404, "NotFound"),
        ("GET", "/api/v1/namespaces/default/nodes", 404, "NotFound"),
        ("GET", "/api/v1/nodes/x/proxy", 404, "NotFound"),
        ("POST", "/api/v1/pods", 405, "MethodNotAllowed"),
        ("PUT", "/api/v1/nodes", 405, "MethodNotAllowed"),
        ("POST", "/api/v1/nodes/x", 405, "MethodNotAllowed"),
        ("DELETE", "/api/v1/namespaces", 405, "MethodNotAllowed"),
    ],
)
def test_unknown_paths_and_verbs(kube_client: ApiClient, method: str, path: str, status: int, reason: str) -> None:
    answer = call(kube_client, method, path)
    assert (answer.status, answer.body["kind"], answer.body["reason"]) == (status, "Status", reason)


def test_watch_path_prefix_is_understood(kube_api: KubeApiServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", kube_api.port, timeout=5)
    connection.request(
        "GET", "/api/v1/watch/namespaces?timeoutSeconds=1", headers={"Authorization": f"Bearer {kube_api.token}"}
    )
    response = connection.getresponse()
    lines = [json.loads(line) for line in response.read().splitlines() if line]
    connection.close()
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines][:1] == [("ADDED", "default")]


def test_connections_are_kept_alive(kube_api: KubeApiServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", kube_api.port, timeout=5)
    headers = {"Authorization": f"Bearer {kube_api.token}"}
    statuses = []
    for _ in range(3):
        connection.request("GET", "/api/v1/namespaces/default", headers=headers)
        response = connection.getresponse()
        response.read()
        statuses.append(response.status)
    socket_used = connection.sock
    connection.request("GET", "/version", headers=headers)
    connection.getresponse().read()
    assert connection.sock is socket_used and statuses == [200, 200, 200]
    connection.close()


def test_kubeconfig_loads_into_the_official_client(kube_api: KubeApiServer, tmp_path: Path) -> None:
    path = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = Configuration()
    kube_config.load_kube_config(config_file=str(path), client_configuration=configuration)
    with ApiClient(configuration) as client:
        assert CoreV1Api(client).read_namespace("default").status.phase == "Active"


def test_cli_serves_the_sample_cluster_until_interrupted(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "prewarm_devtools.kubeapi",
        "--seed",
        str(SAMPLE_CLUSTER),
        "--nodes",
        "20",
        "--kubeconfig",
        str(kubeconfig),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = []
        assert process.stdout is not None
        for line in process.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(banner)
        url = re.search(r"Kubernetes API: (http://127\.0\.0\.1:\d+)", text)
        token = re.search(r"Bearer token:\s+(\S+) \(cluster admin\)", text)
        assert url and token, text
        configuration = Configuration(
            host=url.group(1), api_key={"BearerToken": token.group(1)}, api_key_prefix={"BearerToken": "Bearer"}
        )
        with ApiClient(configuration) as client:
            assert len(CoreV1Api(client).list_node().items) == 12 + 20
        assert kubeconfig.exists()
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=10)
    assert code == 0


def test_typed_call_without_preloading_gives_the_raw_json(core_v1: CoreV1Api) -> None:
    response = core_v1.list_namespace(limit=2, _preload_content=False)
    body = json.loads(response.data)
    assert (response.status, body["kind"], len(body["items"])) == (200, "NamespaceList", 2)
    assert body["metadata"]["remainingItemCount"] == 2


def test_stopping_the_server_leaves_no_thread_and_no_listener() -> None:
    # Given a server with idle keep-alive connections and an open watch
    before = set(threading.enumerate())
    api = KubeApiServer().start()
    port = api.port
    client = api.api_client()
    CoreV1Api(client).list_namespace()
    watch_response = CoreV1Api(client).list_namespace(watch=True, _preload_content=False)
    # When it stops
    api.stop()
    watch_response.release_conn()
    client.close()
    # Then its threads (the serving loop, one per connection) are gone and nothing listens on its port
    left = [t.name for t in threading.enumerate() if t not in before and t.name in ("kubeapi", "kubeapi-connection")]
    assert left == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_injected_throttling_answers_the_next_matching_requests(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    # Given two node lists to be throttled
    throttled = StatusError(
        429, "TooManyRequests", "Too many requests, please try again later.", {"retryAfterSeconds": 1}
    )
    kube_api.fail_requests(throttled, count=2, method="GET", path_prefix="/api/v1/nodes")
    # When the client lists nodes, Then the first two calls get 429, other paths are served all along
    for _ in range(2):
        with pytest.raises(ApiException) as raised:
            core_v1.list_node()
        assert status_of(raised.value)["details"] == {"retryAfterSeconds": 1}
        assert core_v1.list_namespace().items
    # And the third call is served
    assert core_v1.list_node().items == []


def test_retry_after_header_is_sent_and_honoured_by_the_client(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    # Given one request to be throttled with a Retry-After header
    throttled = StatusError(429, "TooManyRequests", "slow down", {"retryAfterSeconds": 1}, headers={"Retry-After": "1"})
    kube_api.fail_requests(throttled, count=1)
    # When the client reads, Then its urllib3 retries after the second the header asked for
    started = time.monotonic()
    assert core_v1.read_namespace("default").metadata.name == "default"
    assert time.monotonic() - started >= 0.9


def test_injected_failures_last_until_cleared(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    kube_api.fail_requests(StatusError(503, "ServiceUnavailable", "etcd is down"), count=None)
    for _ in range(3):
        with pytest.raises(ApiException) as raised:
            core_v1.read_namespace("default")
        assert raised.value.status == 503
    kube_api.clear_failures()
    assert core_v1.read_namespace("default").metadata.name == "default"
