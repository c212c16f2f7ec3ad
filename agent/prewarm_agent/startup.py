"""The node's start as the control plane hears of it: the agent's hello and, on a node that joined with
the startup taint, the hold (`warming.StartupTaintHold`) and how the taint came off (`Warmed`).

Both messages go once; the heartbeat sends them again until the status queue takes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prewarm.adapters.sqs import QueueError
from prewarm.domain.messages import WARMED_MISSING_MAX, FromAgent, Hello, NodePhase, StatusReport, Warmed
from prewarm_agent.clock import Clock
from prewarm_agent.cri.errors import CriError
from prewarm_agent.logs import NodeLogger
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.mirrors import read_mirror_config
from prewarm_agent.node import NodeFacts, NodeReadError
from prewarm_agent.reporting import StatusSink
from prewarm_agent.settings import AgentSettings
from prewarm_agent.tasks import NodeTasks
from prewarm_agent.warming import NodeWrites, StartupTaintHold

# Reading the node again after the API failed at start: from 1 s, doubling to this.
NODE_READ_RETRY_MAX_SECONDS = 30.0


def agent_version() -> str:
    try:
        return version("prewarm")
    except PackageNotFoundError:
        return "0+unknown"


class NodeStartup:
    """Says hello, holds the startup taint while the node has it, and says how it came off."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        images: Any,
        node_writes: NodeWrites,
        status: StatusSink,
        tasks: NodeTasks,
        clock: Clock,
        metrics: AgentMetrics,
        stop: threading.Event,
        logger: NodeLogger,
    ) -> None:
        self.settings = settings
        self.images = images
        self.node_writes = node_writes
        self.status = status
        self.tasks = tasks
        self.clock = clock
        self.metrics = metrics
        self._stop = stop
        self.log = logger
        # Held while the node has the startup taint (docs/agent.md, "Startup taint").
        self.hold: StartupTaintHold | None = None
        # Why the last pull of each image did not end with the image: for the warm deadline's Event.
        self._pull_failures: dict[str, str] = {}
        self._hello: Hello | None = None  # until sent
        # The start, the node re-read and the queue wait send from their own threads: one hello at a time,
        # so none goes twice and a newer one is never cleared by an older one's send.
        self._hello_lock = threading.Lock()
        self._said: Hello | None = None  # the hello, to say again while the node queue is awaited
        self._queue_url: str | None = None
        self.hello_at: float | None = None  # when the first hello went out
        self._warmed: Warmed | None = None  # how the taint came off, until sent

    def hold_taint(self, facts: NodeFacts) -> StartupTaintHold | None:
        """Holds the startup taint when the node has it: before any AWS call, so the deadline counts
        from the node's join even when the node queue cannot be reached (it fails open)."""
        self.hold = self._startup_taint_hold(facts)
        return self.hold

    def begin(self, queue_url: str, facts: NodeFacts) -> None:
        """Says hello: the control plane makes the node queue (`queue_url`) on it."""
        self._queue_url = queue_url
        self._say(self._make_hello(queue_url, facts))

    def say_hello_again(self) -> None:
        """Sends the hello again (while the agent waits for its queue)."""
        if self._said is not None:
            self._say(self._said)

    def read_node_until_deadline(self, read: Callable[[], NodeFacts], *, started_at: float) -> None:
        """The agent could not read its Node at start, so it knows of no startup taint: reads it again
        (1 s, doubling to 30 s) until it answers or `MAX_WARM_SECONDS` from `started_at` (the node joined
        before) have passed. A Node read with the taint is then held and warmed as at start (past its
        deadline: removed at once), and the hello is sent again with the Node's labels and deadline."""
        deadline = started_at + self.settings.max_warm_seconds
        delay = 1.0
        while not self.clock.wait(self._stop, min(delay, max(0.0, deadline - self.clock.time()))):
            facts = read()
            if facts.from_api:
                hold = self.hold_taint(facts)
                if self._queue_url is not None:
                    self._say(self._make_hello(self._queue_url, facts))
                if hold is not None:
                    self.warm(hold)
                return
            if self.clock.time() >= deadline:
                self.log.error(
                    "node %s still cannot be read %.0f s after the agent started: its startup taint, "
                    "if any, is left to the sweep (NoAgentGraceSeconds or StartupTaintGraceSeconds)",
                    self.settings.node_name,
                    self.settings.max_warm_seconds,
                )
                return
            delay = min(delay * 2, NODE_READ_RETRY_MAX_SECONDS)

    def give_up(self, why: str) -> None:
        """The agent cannot run on this node: the taint comes off now rather than at the deadline, so the
        node is no worse off than without Prewarm."""
        hold = self.hold
        if hold is None:
            return
        try:
            hold.release_now(why)
        except NodeReadError as e:
            # The start error is what matters: the sweep removes the taint after the deadline instead.
            self.log.error("cannot remove the startup taint %s now: %s", hold.taint, e)

    def _startup_taint_hold(self, facts: NodeFacts) -> StartupTaintHold | None:
        """A hold when the node joined with the startup taint (and still has it), else None."""
        taint = self.settings.startup_taint
        if not any(taint.matches(t) for t in facts.taints):
            return None
        # From the node's join, not the agent's start: a restarted agent must not hold the node longer.
        joined_at = facts.created_at if facts.created_at is not None else self.clock.time()
        until = joined_at + self.settings.max_warm_seconds
        self.log.info(
            "node holds the startup taint %s: removing it once its images are present, at the latest "
            "%.0f s after it joined",
            taint,
            self.settings.max_warm_seconds,
        )
        return StartupTaintHold(
            node=self.settings.node_name,
            taint=taint,
            joined_at=joined_at,
            until=until,
            images=self.images,
            api=self.node_writes,
            clock=self.clock,
            metrics=self.metrics,
            why=self.why_missing,
            logger=self.log,
        )

    def why_missing(self, image: str) -> str:
        """Why `image` is not on the node, as far as this agent knows."""
        for run in self.tasks.current_runs():
            if run.task.image != image:
                continue
            if run.last_error:
                return f"pull failed (attempt {run.attempt}, retrying): {run.last_error}"
            return f"pull running (attempt {run.attempt})" if run.pulling else "pull waiting for a slot"
        if image in self._pull_failures:
            return f"pull failed: {self._pull_failures[image]}"
        return "no pull task received"

    def pull_ended(self, image: str, report: StatusReport) -> None:
        """While the taint is held: remember why the image's pull failed, and check the images again."""
        if self.hold is not None and not self.hold.done.is_set():
            if report.phase is NodePhase.SUCCEEDED:
                self._pull_failures.pop(image, None)
            else:
                self._pull_failures[image] = report.message
            self.hold.poke()

    def _make_hello(self, queue_url: str, facts: NodeFacts) -> Hello:
        try:
            images = sorted({digest for image in self.images.list_images() for digest in image.repo_digests})
        except CriError as e:
            self.log.warning("cannot list the node's images for the hello: %s", e)
            images = []
        return Hello(
            node=self.settings.node_name,
            labels=dict(facts.labels),
            architecture=facts.architecture,
            os=facts.os,
            queue_url=queue_url,
            images=images,
            agent_version=agent_version(),
            warm_until=self.hold.until if self.hold is not None else None,
            cluster=self.settings.cluster,
            mirror_config=read_mirror_config(self.settings.registry_config_path, self.settings.containerd_config),
        )

    def _send_once(self, message: FromAgent, what: str) -> bool:
        """Sends a message the heartbeat retries until it goes (the hello, the warm-up)."""
        try:
            self.status.send(message)
        except QueueError as e:
            self.log.warning("%s not sent, retrying with the next heartbeat: %s", what, e)
            return False
        return True

    def _say(self, hello: Hello) -> None:
        with self._hello_lock:
            self._hello = self._said = hello
        self.send_hello()

    def send_hello(self) -> None:
        """Sends the hello not yet sent, if any."""
        with self._hello_lock:
            hello = self._hello
            if hello is None or not self._send_once(hello, "hello"):
                return
            self._hello = None
            if self.hello_at is None:
                self.hello_at = self.clock.time()
        self.log.info("hello sent: %s/%s, %d images present", hello.os, hello.architecture, len(hello.images))

    def warm(self, hold: StartupTaintHold) -> None:
        """Hold the taint, then tell the control plane how it came off (`prewarm describe node` shows it)."""
        hold.run(self._stop)
        released = hold.released
        # Without a list the control plane may predate `Warmed` (it would be a poison message there).
        if released is None or hold.required is None:
            return
        missing = sorted(released.missing)
        self._warmed = Warmed(
            node=self.settings.node_name,
            joined_at=hold.joined_at,
            hello_at=self.hello_at if self.hello_at is not None else hold.joined_at,
            warm_at=released.at,
            outcome=released.outcome,
            missing=missing[:WARMED_MISSING_MAX],
            missing_total=len(missing),
            cluster=self.settings.cluster,
        )
        self.send_warmed()

    def send_warmed(self) -> None:
        warmed = self._warmed
        if warmed is not None and self._send_once(warmed, "warm-up"):
            self._warmed = None
