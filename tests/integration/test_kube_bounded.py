"""The status path's bounded Kubernetes client (`prewarm.adapters.bounded`): one try within short timeouts,
against a socket that accepts and never answers, a closed port and the embedded API server; a cluster that
just failed is not called again until its circuit's time is up; what fails reads as one line."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from prewarm.adapters.bounded import BoundedCalls, CircuitBreakers, InvocationDeadline
from prewarm.adapters.kube import KubeCluster
from prewarm.services.ports import ClusterUnavailableError
from prewarm_devtools.kubeapi import KubeApiServer, StatusError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose server accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


def test_a_call_to_an_api_that_never_answers_returns_within_its_read_timeout(silent_port: int) -> None:
    # Given a bounded client with a read timeout of 0.5 s, on an API that accepts and never answers
    bounded = BoundedCalls(timeout=(0.5, 0.5))
    api = KubeCluster(f"http://127.0.0.1:{silent_port}", name="prod-eu", bounded=bounded)
    # When a node is read
    began = time.monotonic()
    with pytest.raises(ClusterUnavailableError) as failed:
        api.get_node("ip-10-0-1-5")
    # Then it fails after one try, within the timeout (urllib3's connect and read retries would take longer),
    # and says so in one line
    assert time.monotonic() - began < 1.4
    assert str(failed.value) == (f"cluster prod-eu cannot be reached: no answer within 0.5 s "
                                 f"(GET http://127.0.0.1:{silent_port}/api/v1/nodes/ip-10-0-1-5)")
    # and the next call is not made at all while the circuit is open
    began = time.monotonic()
    with pytest.raises(ClusterUnavailableError, match=r"^cluster prod-eu cannot be reached: no answer within 0\.5 s "
                                                      r"\(GET .*\); not called again for 10 s$"):
        api.list_pods("ml", field_selector="spec.nodeName=ip-10-0-1-5")
    assert time.monotonic() - began < 0.1


def test_a_refused_connection_reads_as_one_line_and_the_circuit_lets_a_trial_through_when_its_time_is_up() -> None:
    clock = Clock()
    port = closed_port()
    bounded = BoundedCalls(timeout=(0.5, 0.5), breakers=CircuitBreakers(clock))
    api = KubeCluster(f"http://127.0.0.1:{port}", name="prod-eu", bounded=bounded)
    with pytest.raises(ClusterUnavailableError) as failed:
        api.get_node("n1")
    message = str(failed.value)
    assert message == f"cluster prod-eu cannot be reached: connection refused (GET http://127.0.0.1:{port}/api/v1/nodes/n1)"
    assert "0x" not in message and "\n" not in message and "HTTPConnectionPool" not in message
    with pytest.raises(ClusterUnavailableError, match="not called again for 10 s"):
        api.get_node("n1")
    # When the circuit's 10 s are up, one call goes out again; failing, it opens the circuit for twice as long
    clock.now += 10
    with pytest.raises(ClusterUnavailableError, match="cannot be reached: connection refused"):
        api.get_node("n1")
    with pytest.raises(ClusterUnavailableError, match="not called again for 20 s"):
        api.get_node("n1")


def test_a_probes_call_goes_through_an_open_circuit_every_10_s_and_its_answer_closes_it(
        kube_api: KubeApiServer) -> None:
    clock = Clock()
    breakers = CircuitBreakers(clock)
    calls, probes = BoundedCalls(breakers=breakers), BoundedCalls(breakers=breakers, probe=True)
    url = kube_api.url
    api = KubeCluster(url, lambda: kube_api.token, name="prod-eu", bounded=calls)
    probe = KubeCluster(url, lambda: kube_api.token, name="prod-eu", bounded=probes)
    # Given a circuit that failed three times: the other calls wait 40 s
    kube_api.fail_requests(StatusError(503, "ServiceUnavailable", "etcd leader changed"), count=3)
    for wait in (0, 10, 20):
        clock.now += wait
        with pytest.raises(ClusterUnavailableError, match="503 ServiceUnavailable"):
            api.get_node("n1")
    # Then 10 s on, the other calls are still skipped but a probe calls, and its answer closes the circuit
    clock.now += 10
    with pytest.raises(ClusterUnavailableError, match="not called again for 30 s"):
        api.get_node("n1")
    assert probe.get_version()
    assert not breakers.circuit(api.host).is_open and api.get_node("n1") is None


def test_an_answer_closes_the_circuit_and_a_throttled_api_is_not_called_until_it_said(kube_api: KubeApiServer) -> None:
    clock = Clock()
    bounded = BoundedCalls(breakers=CircuitBreakers(clock))
    api = KubeCluster(kube_api.url, lambda: kube_api.token, name="prod-eu", bounded=bounded)
    throttled = StatusError(429, "TooManyRequests", "too many requests", headers={"Retry-After": "30"})
    kube_api.fail_requests(throttled, count=1)
    with pytest.raises(ClusterUnavailableError, match="429 TooManyRequests"):
        api.get_node("n1")
    clock.now += 20
    with pytest.raises(ClusterUnavailableError, match="not called again for 10 s"):
        api.get_node("n1")
    clock.now += 10
    assert api.get_node("n1") is None  # answered (a 404 is an answer): the circuit is closed
    assert not bounded.breakers.circuit(api.host).is_open
    assert api.get_node("n1") is None


def test_no_call_is_made_once_the_invocations_time_for_them_is_up(kube_api: KubeApiServer) -> None:
    clock = Clock()
    deadline = InvocationDeadline(most=15, reserve=10, clock=clock)
    api = KubeCluster(kube_api.url, lambda: kube_api.token, name="prod-eu", bounded=BoundedCalls(deadline=deadline))
    deadline.begin(lambda: 30.0)  # 30 s left: calls may run for 15 of them
    assert api.get_node("n1") is None
    clock.now += 15
    with pytest.raises(ClusterUnavailableError, match="this invocation's time for cluster calls is up"):
        api.get_node("n1")
    deadline.begin(lambda: 12.0)  # a new invocation with 12 s left: 2 s for calls
    assert api.get_node("n1") is None


def test_an_api_error_reads_as_one_line_whatever_the_server_wrote(kube_api: KubeApiServer) -> None:
    api = KubeCluster(kube_api.url, lambda: kube_api.token, name="prod-eu")
    kube_api.fail_requests(StatusError(503, "ServiceUnavailable", "etcd leader changed\n  retry later\n"), count=1)
    with pytest.raises(ClusterUnavailableError) as failed:
        api.list_nodes()
    assert str(failed.value) == "GET /api/v1/nodes: 503 ServiceUnavailable: etcd leader changed retry later"
