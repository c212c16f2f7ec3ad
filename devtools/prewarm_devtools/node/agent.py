"""A node's agent in local mode: a process of its own (`python -m prewarm_agent`, as the DaemonSet runs
it) or, for callers that need its internals, the `Agent` object in this process. Both answer `start`,
`stop` (SIGTERM: drain, then exit), `kill` (SIGKILL: a crash), `state`, `last_exit` and `pid`."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from prewarm_devtools.node.process import DaemonBacked, DaemonProcess, ProcessExit

# What the agent logs once it has said hello and consumes its queue.
_READY_LINE = '"consuming '

RUNNING = "running"
STOPPED = "stopped"  # `stop` ended it (SIGTERM: `prewarm local agent stop`, or a test)
KILLED = "killed"  # `kill` ended it (SIGKILL: `prewarm local agent kill`, or a test)
DEAD = "dead"  # it ended without being asked: crashed, exited, or killed by someone else
NONE = "none"  # the node has no agent


def agent_state(running: bool, last_exit: ProcessExit | None) -> str:
    """What `prewarm local status` says of an agent: `running`, `stopped`, `killed` or `dead`."""
    if running:
        return RUNNING
    requested = last_exit.requested if last_exit is not None else ""
    return {"stop": STOPPED, "kill": KILLED}.get(requested, DEAD)


def exit_note(last_exit: ProcessExit | None, state: str) -> str | None:
    """How an agent that is not running ended, for `prewarm local status`: `killed by SIGKILL,
    unexpectedly`, `exit code 0, on request`; None while it runs."""
    if state in (RUNNING, NONE):
        return None
    if last_exit is None:
        return "ended unexpectedly (exit status unknown)"
    return f"{last_exit.cause}, {'on request' if last_exit.requested else 'unexpectedly'}"


class AgentProcess(DaemonBacked):
    """The agent of one node as a child process, logging JSON lines to ``log_path``."""

    def __init__(self, values: dict[str, str], log_path: Path, start_timeout: float = 60.0) -> None:
        from prewarm_agent.settings import AgentSettings

        self.settings = AgentSettings.from_env(values)
        self.log_path = log_path
        self.start_timeout = start_timeout
        env = {**os.environ, **values, "PYTHONUNBUFFERED": "1"}
        self._daemon = DaemonProcess(f"agent of {self.settings.node_name}", [sys.executable, "-m", "prewarm_agent"],
                                     log_path, env=env)

    @property
    def state(self) -> str:
        """`running`, `stopped`, `killed` or `dead` (`agent_state`)."""
        return agent_state(self.running, self.last_exit)

    def start(self) -> None:
        """Start the process and wait until it consumes its queue (it said hello)."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._daemon.start()
        self._daemon.wait_ready(lambda: self._logged_since(offset), timeout=self.start_timeout, interval=0.1)

    def _logged_since(self, offset: int) -> bool:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return _READY_LINE.encode() in log.read()

    def stop(self, grace: float) -> None:
        """SIGTERM: the agent drains for its SHUTDOWN_GRACE_SECONDS and exits; SIGKILL after ``grace`` more."""
        self._daemon.stop(grace)

    def kill(self) -> None:
        """SIGKILL, as a crashed agent."""
        self._daemon.kill()


class InProcessAgent:
    """The agent of one node as an `Agent` object in this process (its internals stay reachable).

    `signing`: a block in which the boto3 clients it builds sign as its node's agent role (this
    process's environment holds the operator's keys, or a function's while one runs); its clients
    are all built in it, the ECR client included (`prepare`)."""

    def __init__(self, values: dict[str, str],
                 signing: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        from prewarm_agent.settings import AgentSettings

        self.settings = AgentSettings.from_env(values)
        self.signing = signing
        self.agent: Any = None
        # A thread cannot die on its own here: only `stop` and `kill` end it.
        self.last_exit: ProcessExit | None = None

    @property
    def pid(self) -> int | None:
        return os.getpid() if self.agent is not None else None

    @property
    def start_time(self) -> int | None:
        return None

    @property
    def state(self) -> str:
        return agent_state(self.agent is not None, self.last_exit)

    def start(self) -> None:
        """Starts the agent; an agent that cannot start (its queue refused) is stopped, and its error raised,
        as the process would exit with it."""
        from prewarm_agent.agent import Agent
        from prewarm_agent.credentials import RegistryCredentials

        with self.signing():
            agent = Agent(self.settings)
            if isinstance(agent.credentials, RegistryCredentials):
                agent.credentials.prepare(self.settings.aws_region)
        try:
            agent.start()
        except BaseException:
            agent.stop(0)
            raise
        self.agent = agent
        self.last_exit = None

    def consuming(self) -> bool:
        """Whether its agent consumes its node queue: what `AgentProcess.start` waits for."""
        return self.agent is not None and self.agent.queue is not None

    def stop(self, grace: float) -> None:
        if self.agent is not None:
            self.agent.stop(grace)
            self.agent = None
            self.last_exit = ProcessExit(0, "stop")

    def kill(self) -> None:
        """As close to a crash as a thread gets: stop at once, without draining."""
        if self.agent is not None:
            self.agent.stop(0)
            self.agent = None
            self.last_exit = ProcessExit(-signal.SIGKILL, "kill")

    def __getattr__(self, name: str) -> Any:
        # `node.agent.metrics`, `node.agent.http_port`...: the running Agent's own attributes.
        agent = self.__dict__.get("agent")
        if agent is None:
            raise AttributeError(name)
        return getattr(agent, name)


def agent_log_name(node: str) -> str:
    """The file name of a node's agent log under the stack's `logs/` directory."""
    return f"agent-{node}.log"


def agent_output_path(logs_dir: Path, node: str) -> Path:
    return logs_dir / agent_log_name(node)

