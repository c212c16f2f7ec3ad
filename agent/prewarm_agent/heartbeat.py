"""What the agent sends while its pulls run: the heartbeat keeps their messages invisible (and sends the
hello or warm-up again until it goes); the progress sampler sends each running task's bytes so far."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from prewarm.domain.messages import NodePhase
from prewarm_agent.clock import Clock
from prewarm_agent.cri.errors import CriError
from prewarm_agent.logs import NodeLogger
from prewarm_agent.progress import Ingest
from prewarm_agent.pulls import PullCoordinator
from prewarm_agent.queue import TaskQueue
from prewarm_agent.reporting import Reports
from prewarm_agent.settings import AgentSettings
from prewarm_agent.startup import NodeStartup
from prewarm_agent.tasks import NodeTasks


class Heartbeat:
    """Every `heartbeat_interval_seconds`: the runs' messages hidden for another visibility timeout."""

    def __init__(self, queue: TaskQueue, settings: AgentSettings, *, tasks: NodeTasks, startup: NodeStartup,
                 stop: threading.Event, logger: NodeLogger) -> None:
        self.queue = queue
        self.settings = settings
        self.tasks = tasks
        self.startup = startup
        self._stop = stop
        self.log = logger

    def run(self) -> None:
        interval = self.settings.heartbeat_interval_seconds
        while not self._stop.wait(interval):
            with self.tasks.lock:
                held = [delivery for run in self.tasks.runs.values() for delivery in run.deliveries]
            if held:
                for failure in self.queue.set_visibility(held, self.settings.node_queue_visibility_seconds):
                    self.log.warning("visibility not extended: %s", failure)
            self.startup.send_hello()
            self.startup.send_warmed()


class IngestSource(Protocol):
    def list_statuses(self, filters: Sequence[str] = ()) -> Sequence[Ingest]: ...


class ProgressReports:
    """Every `progress_interval_seconds`: a Pulling report for each task past its first attempt."""

    def __init__(self, content: IngestSource, settings: AgentSettings, *, pulls: PullCoordinator, tasks: NodeTasks,
                 reports: Reports, clock: Clock, stop: threading.Event, logger: NodeLogger) -> None:
        self.content = content
        self.settings = settings
        self.pulls = pulls
        self.tasks = tasks
        self.reports = reports
        self.clock = clock
        self._stop = stop
        self.log = logger
        self._content_warned = False

    def run(self) -> None:
        while not self._stop.wait(self.settings.progress_interval_seconds):
            try:
                self.report()
            except Exception:
                self.log.exception("progress sampling failed")

    def report(self) -> None:
        """Send one Pulling report for every task past its first attempt (the sampler's tick): the bytes so
        far of a running pull, or that the next attempt waits. The control plane reads silence as a gone
        agent (docs/agent.md, "Progress"), so a run between attempts reports too.
        """
        running = self.pulls.running()
        waiting = [run for run in self.tasks.current_runs()
                   if run.pulling and not run.cancelled.is_set() and not any(run in runs for _, runs in running)]
        for run in waiting:
            self.reports.send(run.report(NodePhase.PULLING,
                                         message=run.throttled or f"attempt {run.attempt} ended; waiting for the next"))
        if not running:
            return
        ingests: Sequence[Ingest] | None = None
        try:
            ingests = self.content.list_statuses()
        except CriError as e:
            if not self._content_warned:
                self._content_warned = True
                self.log.warning("containerd's content API is unavailable (%s): progress reports carry the "
                                 "elapsed time only", e)
        now = self.clock.time()
        for shared, runs in running:
            progress = shared.observe(ingests, exclusive=len(running) == 1) if ingests is not None else None
            for run in runs:
                if run.cancelled.is_set() or not run.pulling:
                    continue
                elapsed = now - (run.attempt_started_at or now)
                if progress is None:
                    report = run.report(NodePhase.PULLING, message=f"pulling for {elapsed:.0f}s")
                else:
                    total = "?" if progress.bytes_total is None else str(progress.bytes_total)
                    report = run.report(NodePhase.PULLING, bytes_done=progress.bytes_done,
                                        bytes_total=progress.bytes_total,
                                        message=f"{progress.bytes_done} of {total} bytes after {elapsed:.0f}s")
                self.reports.send(report)
