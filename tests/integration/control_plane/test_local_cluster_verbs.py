"""`prewarm local cluster stop|start NAME`: one local cluster's API goes away (its port refuses connections,
as a dead endpoint, or with `--hang` takes them and never answers) and comes back at the same address with
its objects; `local status` says which is stopped or hung and names each node's containerd socket. A stack
without agents: no containerd needed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner, Result

from prewarm_devtools.commands import _node_lines
from prewarm_devtools.commands import local as local_commands
from prewarm_devtools.localmode import LocalMode
from tests.support.local_mode import running_local_mode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "cluster-verbs", nodes=1, agents=False, clusters=2) as mode:
        if mode.aws is None or mode.aws.layer is None:
            pytest.skip("the AWS limits layer is off: it plays EKS for the second cluster")
        yield mode


def prewarm_local(*args: str) -> Result:
    return CliRunner().invoke(local_commands, list(args), catch_exceptions=False)


def answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=2):
            return True
    except OSError:
        return False


def test_a_stopped_clusters_api_refuses_connections_and_comes_back_with_its_objects(local: LocalMode) -> None:
    other = local.extra_clusters["local-2"]
    url, nodes = other.kube.url, other.kube.list_objects("nodes")
    stopped = prewarm_local("cluster", "stop", "local-2")
    assert stopped.exit_code == 0, stopped.output
    assert stopped.output.strip() == f"cluster local-2: Kubernetes API stopped at {url}"
    assert not answers(url)
    assert answers(local.kube.url if local.kube else "")  # the own cluster's API goes on
    status = prewarm_local("status").output
    assert f"cluster local-2: Kubernetes API at {url} (stopped)" in status, status
    again = prewarm_local("cluster", "stop", "local-2")
    assert again.exit_code != 0 and 'the API of cluster "local-2" is already stopped' in again.output

    started = prewarm_local("cluster", "start", "local-2")
    assert started.exit_code == 0, started.output
    assert answers(url) and other.kube.url == url
    assert other.kube.list_objects("nodes") == nodes
    assert f"cluster local-2: Kubernetes API at {url} (serving)" in prewarm_local("status").output


def hangs(url: str) -> bool:
    """Whether the endpoint takes the connection and then says nothing for 2 s."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port or 443), timeout=2) as connection:
        connection.sendall(b"\x16\x03\x01\x00\x05hello")  # the start of a TLS ClientHello
        try:
            connection.recv(1)  # an answer, or the connection closed
        except TimeoutError:
            return True
        return False


def test_a_hung_clusters_api_accepts_connections_and_never_answers_until_started(local: LocalMode) -> None:
    # Given local-2's API, serving
    other = local.extra_clusters["local-2"]
    url, nodes = other.kube.url, other.kube.list_objects("nodes")
    # When it is stopped with --hang
    hung = prewarm_local("cluster", "stop", "local-2", "--hang")
    # Then connections are taken and never answered, the own cluster goes on, and status says it is hung
    assert hung.exit_code == 0, hung.output
    assert hung.output.strip() == f"cluster local-2: Kubernetes API hung at {url}"
    assert hangs(url)
    assert answers(local.kube.url if local.kube else "")
    assert f"cluster local-2: Kubernetes API at {url} (hung)" in prewarm_local("status").output
    again = prewarm_local("cluster", "stop", "local-2", "--hang")
    assert again.exit_code != 0 and 'the API of cluster "local-2" is already hung' in again.output
    # and `start` ends the hang: the same objects at the same address
    started = prewarm_local("cluster", "start", "local-2")
    assert started.exit_code == 0, started.output
    assert other.kube.url == url and other.kube.list_objects("nodes") == nodes
    assert f"cluster local-2: Kubernetes API at {url} (serving)" in prewarm_local("status").output
    assert prewarm_local("cluster", "start", "local-2", "--hang").exit_code != 0  # --hang goes with stop


def test_the_own_cluster_stops_and_starts_too_and_an_unknown_one_is_named(local: LocalMode) -> None:
    assert prewarm_local("cluster", "stop", "local").exit_code == 0
    assert "cluster local: Kubernetes API stopped" in prewarm_local("status").output
    assert prewarm_local("cluster", "start", "local").exit_code == 0
    unknown = prewarm_local("cluster", "stop", "local-9")
    assert unknown.exit_code != 0
    assert 'no local cluster "local-9": the embedded ones are local, local-2' in unknown.output


def test_status_names_each_nodes_containerd_socket() -> None:
    lines = _node_lines("nodes", [{"name": "node-1", "agent": "running", "pid": 7, "containerd_pid": 6,
                                   "containerd_socket": "/run/prewarm/node-1/containerd.sock", "exit": None}])
    header, row = lines[1].splitlines()
    assert header.split() == ["NAME", "AGENT", "PID", "CONTAINERD-PID", "CONTAINERD-SOCKET", "LAST-EXIT"]
    assert row.split()[4] == "/run/prewarm/node-1/containerd.sock"
