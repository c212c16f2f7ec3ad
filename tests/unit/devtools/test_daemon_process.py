"""Daemons of local mode start cleanly beside live gRPC channels and die with the thread that started them."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from prewarm_devtools.node.process import DaemonProcess, process_start_time


@pytest.fixture
def grpc_traffic() -> Iterator[None]:
    """Four threads calling a local gRPC server without pause, as running agents call containerd."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def call() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.unary_unary("/prewarm.Test/Nothing")
            while not stop.is_set():
                with contextlib.suppress(grpc.RpcError):
                    method(b"", timeout=0.05)

    threads = [threading.Thread(target=call, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        server.stop(grace=None)


@pytest.mark.usefixtures("grpc_traffic")
def test_daemons_started_beside_live_grpc_channels_never_die_before_their_exec(tmp_path: Path) -> None:
    # Given gRPC calls in flight on other threads (a fork() there ran grpcio's fork handlers in the child,
    # which aborted on the descriptors Popen closes: containerd "exited with code -6", 3 starts in 300)
    codes = []
    # When a short-lived daemon is started 300 times
    for _ in range(300):
        daemon = DaemonProcess("true", ["true"], tmp_path / "true.log")
        daemon.start()
        assert daemon._process is not None
        codes.append(daemon._process.wait(timeout=30))
    # Then every one ran its program and exited 0, and nothing was written to its log but the start line
    assert codes == [0] * 300
    assert all(line.startswith("--- starting ") for line in (tmp_path / "true.log").read_text().splitlines())


def test_a_daemon_dies_with_the_thread_that_started_it(tmp_path: Path) -> None:
    # Given a daemon started from a thread that ends once the daemon runs its program
    started: list[DaemonProcess] = []

    def start() -> None:
        daemon = DaemonProcess("sleep", ["sleep", "300"], tmp_path / "sleep.log")
        daemon.start()
        started.append(daemon)
        assert daemon.pid is not None
        deadline = time.monotonic() + 10
        while not os.readlink(f"/proc/{daemon.pid}/exe").endswith("/sleep"):
            assert time.monotonic() < deadline, "the daemon never ran its program"
            time.sleep(0.01)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    (daemon,) = started
    assert daemon._process is not None
    pid = daemon._process.pid
    try:
        # Then the kernel kills it (PR_SET_PDEATHSIG): its exit status is SIGKILL's
        assert daemon._process.wait(timeout=10) == -signal.SIGKILL
        assert process_start_time(pid) is None
    finally:
        if daemon._process.poll() is None:
            os.kill(pid, signal.SIGKILL)
            daemon._process.wait()
