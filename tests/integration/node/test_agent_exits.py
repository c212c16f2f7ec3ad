"""`prewarm local status` tells an agent the operator stopped or killed from one that died (issue #25):
a real `python -m prewarm_agent` process, killed from outside with SIGKILL or exiting on its own, and
the state and exit note local mode's status gives it."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prewarm_devtools.node.agent import DEAD, KILLED, STOPPED, AgentProcess, exit_note
from prewarm_devtools.node.process import DaemonProcess, ProcessExit, process_running

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that takes connections and never answers: an agent calling it waits, alive."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def agent_at(endpoint: str, tmp_path: Path) -> AgentProcess:
    values = {"NODE_NAME": "node-a", "NODE_QUEUE_PREFIX": "prewarm-test", "STATUS_QUEUE_URL": f"{endpoint}/1/status",
              "AWS_REGION": "us-west-2", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
              "AWS_SECRET_ACCESS_KEY": "test", "HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": "0",
              "CRI_SOCKET": str(tmp_path / "containerd.sock")}
    return AgentProcess(values, tmp_path / "agent.log")


def wait_until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_agent_killed_with_sigkill_by_someone_else_is_dead_and_says_by_what(
    silent_endpoint: str, tmp_path: Path
) -> None:
    # Given a running agent process (waiting on its first AWS call)
    agent = agent_at(silent_endpoint, tmp_path)
    agent._daemon.start()
    try:
        time.sleep(1.5)  # past the interpreter's start: the agent's own code runs, and waits
        assert agent.state == "running" and exit_note(agent.last_exit, agent.state) is None
        pid = agent.pid
        assert pid is not None

        # When something other than `prewarm local agent kill` kills it (kill -9, the OOM killer)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: agent.state != "running")

        # Then it is dead, not stopped: killed by SIGKILL, unexpectedly
        assert not process_running(pid)
        assert agent.state == DEAD
        assert agent.last_exit == ProcessExit(-signal.SIGKILL)
        assert exit_note(agent.last_exit, agent.state) == "killed by SIGKILL, unexpectedly"
        # ... and reaping it later keeps how it ended
        agent.stop(1)
        assert agent.state == DEAD and agent.last_exit == ProcessExit(-signal.SIGKILL)
    finally:
        agent.kill()


def test_an_agent_that_exits_on_its_own_is_dead_with_its_exit_code(tmp_path: Path) -> None:
    # Given an agent whose AWS endpoint refuses connections (nothing listens there): it exits 1 at start
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    agent = agent_at(endpoint, tmp_path)
    agent._daemon.start()
    try:
        wait_until(lambda: agent.state != "running", timeout=60)
        # Then it is dead with its exit code, not `stopped`
        assert agent.state == DEAD
        assert agent.last_exit is not None and agent.last_exit.returncode > 0
        assert exit_note(agent.last_exit, agent.state) == f"exit code {agent.last_exit.returncode}, unexpectedly"
    finally:
        agent.kill()


def test_an_agent_stopped_or_killed_on_request_says_so(tmp_path: Path) -> None:
    # Given a daemon as an agent's (its own process group, log, SIGTERM then SIGKILL)
    daemon = DaemonProcess("sleeper", ["sleep", "300"], tmp_path / "sleep.log")
    daemon.start()
    daemon.stop(5)
    stopped = daemon.last_exit
    daemon.start()
    assert daemon.last_exit is None
    daemon.kill()
    killed = daemon.last_exit

    # Then `stop` and `kill` are told apart from a death, with the signal that ended each
    assert stopped == ProcessExit(-signal.SIGTERM, "stop")
    assert exit_note(stopped, STOPPED) == "killed by SIGTERM, on request"
    assert killed == ProcessExit(-signal.SIGKILL, "kill")
    assert exit_note(killed, KILLED) == "killed by SIGKILL, on request"


def test_a_containers_exit_status_reads_as_the_signal_that_ended_it() -> None:
    # A container's exit status is the shell's: 128 + the signal
    assert ProcessExit.of_wait_status(137).cause == "killed by SIGKILL"
    assert ProcessExit.of_wait_status(1, "stop").cause == "exit code 1"
    assert ProcessExit.of_wait_status(0).cause == "exit code 0"
