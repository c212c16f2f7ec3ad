"""HTTPS (`KubeApiServer(tls=True)`): a CA made at start, trusted by the clients that are given it and
by no one else; the written kubeconfig is the cluster admin's as the official client loads it, a
request without a token is 401; watches stream over TLS and a client that leaves is let go; and
kubectl, which sends a kubeconfig's token over TLS only, is the admin."""

# mypy: disable-error-code="union-attr, no-untyped-call"

from __future__ import annotations

import contextlib
import socket
import ssl
import stat
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient, AuthorizationV1Api, Configuration, CoreV1Api, V1SelfSubjectAccessReview
from kubernetes.config import kube_config

from prewarm.adapters.kube import KubeCluster
from prewarm.services.ports import ClusterConfigError
from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kube import SAMPLE_CLUSTER, call, node
from tests.support.kubectl import kubectl_binary

pytestmark = pytest.mark.integration

KUBECTL = kubectl_binary()


@pytest.fixture(scope="module")
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer(tls=True) as server:
        server.seed_from_file(SAMPLE_CLUSTER)
        yield server


def loaded(path: Path) -> ApiClient:
    """An ApiClient as `kubernetes.config.load_kube_config` makes one from the file."""
    configuration = Configuration()
    kube_config.load_kube_config(config_file=str(path), client_configuration=configuration, persist_config=False)
    return ApiClient(configuration)


def connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kubeapi-connection"]


def test_the_server_serves_https_on_127_0_0_1_to_clients_that_trust_its_ca(api: KubeApiServer) -> None:
    assert api.url.startswith("https://127.0.0.1:") and api.ca_pem and "BEGIN CERTIFICATE" in api.ca_pem
    with api.api_client() as client:
        names = [n.metadata.name for n in CoreV1Api(client).list_node().items]
    with KubeCluster(api.url, lambda: api.token, ca_data=api.ca_pem) as cluster:
        assert sorted(n["metadata"]["name"] for n in cluster.list_nodes()) == sorted(names) != []


def test_a_client_that_does_not_trust_the_ca_fails_verification(api: KubeApiServer) -> None:
    # The system CAs do not know a CA made at start
    with pytest.raises(urllib.error.URLError) as raised:
        urllib.request.urlopen(f"{api.url}/version", timeout=5, context=ssl.create_default_context())
    assert isinstance(raised.value.reason, ssl.SSLCertVerificationError)
    with (KubeCluster(api.url, lambda: api.token) as cluster,
          pytest.raises(ClusterConfigError, match=r"TLS verification of https://127\.0\.0\.1:\d+ failed")):
        cluster.list_nodes()
    # Another server's CA does not sign this one's certificate
    other = KubeApiServer(tls=True)
    assert other.ca_pem != api.ca_pem
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{api.url}/version", timeout=5, context=other.certificate.client_context())


def test_the_written_kubeconfig_is_the_cluster_admin_and_a_request_without_token_is_401(
    api: KubeApiServer, tmp_path: Path
) -> None:
    path = api.write_kubeconfig(tmp_path / "config", "prewarm-test")
    # It holds the admin token: its owner's only
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "prewarm-test"
    assert doc["clusters"][0]["cluster"]["server"] == api.url
    with loaded(path) as client:
        # As the admin: every verb on everything, secrets included
        review = AuthorizationV1Api(client).create_self_subject_access_review(V1SelfSubjectAccessReview(
            spec={"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}))
        assert review.status.allowed is True
        assert CoreV1Api(client).list_secret_for_all_namespaces().items is not None
        # Without the token: 401, not the admin and not even system:anonymous
        refused = call(client, "GET", "/api/v1/nodes", authenticate=False)
        assert (refused.status, refused.body["reason"]) == (401, "Unauthorized")


def test_a_plain_http_request_to_the_tls_port_does_not_stop_the_server(api: KubeApiServer) -> None:
    with socket.create_connection(("127.0.0.1", api.port), timeout=5) as raw:
        raw.sendall(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert not raw.recv(4096).startswith(b"HTTP/1.1")
    with api.api_client() as client:
        assert call(client, "GET", "/version").status == 200


@pytest.mark.parametrize("leaving", ["close", "close_notify"])
def test_a_watch_streams_over_tls_and_a_client_that_leaves_is_let_go(api: KubeApiServer, leaving: str) -> None:
    before = set(connection_threads())
    context = api.certificate.client_context()
    raw = socket.create_connection(("127.0.0.1", api.port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(f"GET /api/v1/nodes?watch=1&resourceVersion={api.resource_version} HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\nAuthorization: Bearer {api.token}\r\n\r\n".encode())
    api.seed_objects([node(f"watched-{leaving.replace('_', '-')}")])
    received = b""
    while b"watched-" not in received:
        received += tls.recv(65536)
    assert received.startswith(b"HTTP/1.1 200 OK") and b'"type":"ADDED"' in received
    (serving,) = set(connection_threads()) - before
    if leaving == "close_notify":
        # unwrap sends close_notify, then waits for the server's: which closes the connection instead
        with contextlib.suppress(ssl.SSLEOFError):
            tls.unwrap()
    tls.close()
    serving.join(timeout=5)
    assert not serving.is_alive(), "the server still holds the watch of a client that left"


def test_kubectl_sends_the_kubeconfigs_token_over_tls_and_is_the_admin(api: KubeApiServer, tmp_path: Path) -> None:
    path = api.write_kubeconfig(tmp_path / "config")

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", str(path), "--cache-dir", str(tmp_path / "cache"), *args],
                              capture_output=True, text=True, timeout=60, check=False)

    nodes = kubectl("get", "nodes", "-o", "name")
    assert nodes.returncode == 0, nodes.stderr
    assert sorted(nodes.stdout.split()) == sorted(f"node/{n['metadata']['name']}" for n in api.list_objects("nodes"))
    assert kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    assert kubectl("auth", "whoami").stdout.split() == ["ATTRIBUTE", "VALUE", "Username", "kubernetes-admin",
                                                         "Groups", "[system:masters", "system:authenticated]"]
    assert kubectl("get", "secrets", "-A").returncode == 0
    # A token the server does not know is refused
    unknown = kubectl("--token", "not-a-token", "get", "nodes")
    assert unknown.returncode != 0 and "You must be logged in to the server (Unauthorized)" in unknown.stderr
