"""Each task's pull, on a thread of its own, to its answer: the final report (the image pinned when the
job asks, the outcome counted) sent and the task's messages deleted; or, when the agent stops, the
messages released for a restarted agent. Also what the runner tells the agent while it pulls."""

from __future__ import annotations

from typing import Any, Protocol

from prewarm.domain.images import parse_image
from prewarm.domain.messages import ALREADY_PRESENT, NodePhase, StatusReport
from prewarm_agent.attempts import TaskRunner
from prewarm_agent.clock import Clock
from prewarm_agent.cri.errors import CriError
from prewarm_agent.cri.pinning import PINNED_LABEL, ImagePins
from prewarm_agent.logs import NodeLogger
from prewarm_agent.manifests import ManifestError
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.pulled import PullRecord
from prewarm_agent.pulls import SharedPull, TaskRun
from prewarm_agent.reporting import Reports
from prewarm_agent.startup import NodeStartup
from prewarm_agent.tasks import NodeTasks, Spawn

#: The last report of a pull the agent's shutdown interrupted; its message goes back to the queue.
SHUTDOWN_MESSAGE = "agent shutting down; the pull starts again when the agent restarts"


class LayerSource(Protocol):
    def layers(self, image: Any, auth: Any) -> dict[str, int]: ...


class TaskRuns:
    """Runs a `TaskRun` (the body of its thread) and answers for it once it ends."""

    def __init__(self, runner: TaskRunner, *, tasks: NodeTasks, reports: Reports, startup: NodeStartup,
                 cri_socket: str, record: PullRecord, metrics: AgentMetrics, clock: Clock, logger: NodeLogger) -> None:
        self.runner = runner
        self.record = record
        self.tasks = tasks
        self.reports = reports
        self.startup = startup
        self.cri_socket = cri_socket
        self.metrics = metrics
        self.clock = clock
        self.log = logger

    def run(self, run: TaskRun) -> None:
        try:
            report = self.runner.run(run)
        except Exception as e:
            self.log.exception("the pull failed unexpectedly", extra=_context(run))
            report = run.report(NodePhase.FAILED, message=f"agent error: {type(e).__name__}: {e}",
                                finished_at=self.clock.time())
        self._finish(run, report)

    def _finish(self, run: TaskRun, report: StatusReport) -> None:
        if report.phase == NodePhase.SUCCEEDED:
            self._record(run, report)
        if report.phase == NodePhase.SUCCEEDED and run.task.pin:
            report = report.model_copy(update={"message": f"{report.message}; {self._pin(run)}".lstrip("; ")})
        released = run.shutdown and report.phase is NodePhase.CANCELLED
        with self.tasks.lock:
            self.tasks.runs.pop(run.key, None)
            self.tasks.threads.pop(run.key, None)
            deliveries = list(run.deliveries)
            if not released:
                self.tasks.remember(run.key, report)
            if report.phase == NodePhase.SUCCEEDED and not run.cancelled.is_set():
                self.tasks.keep(run.key, run.task)
        if released:
            if run.pulling:
                # Not Cancelled: a final phase would finish the node's part (and a one-node `Always`
                # job) as failed, though the restarted agent pulls again. The node stays Pulling; if no
                # agent comes back, the control plane fails it as silent.
                self.reports.send(run.report(NodePhase.PULLING, message=SHUTDOWN_MESSAGE))
            self.reports.release(deliveries)
            self.log.info("released for a restarted agent (pulling: %s)", run.pulling, extra=_context(run))
            return
        self._count(report)
        self.log.info("%s %s", report.phase, report.message, extra=_context(run))
        self.startup.pull_ended(run.task.image, report)
        if self.reports.send(report):
            self.reports.delete(deliveries)

    def _record(self, run: TaskRun, report: StatusReport) -> None:
        """The record of what the agent pulled (`pulled`): a pull adds the image; an image that was there
        already is Prewarm's only if the agent pulled it before, and is wanted again."""
        names = tuple(n for n in (run.task.image, report.repo_digest) if n)
        if report.message == ALREADY_PRESENT:
            self.record.wanted(names)
        elif report.image_id:
            self.record.pulled(report.image_id, names, report.size_bytes or 0, report.finished_at or self.clock.time())

    def _pin(self, run: TaskRun) -> str:
        """Pins the pulled image (the job's `prewarm.dev/pin`); says how it went. A pin that fails
        leaves the pull Succeeded: the image is there, garbage collection may only take it sooner."""
        try:
            with ImagePins(self.cri_socket) as pins:
                records = pins.pin(run.task.image)
        except CriError as e:
            self.log.warning("image pulled but not pinned: %s", e, extra=_context(run))
            return f"not pinned: {e}"
        self.log.info("image pinned (%s on %d records)", PINNED_LABEL, len(records), extra=_context(run))
        return "pinned"

    def _count(self, report: StatusReport) -> None:
        self.metrics.pulls.labels(report.phase).inc()
        if report.started_at is not None and report.finished_at is not None:
            self.metrics.pull_seconds.labels(report.phase).observe(max(0.0, report.finished_at - report.started_at))
        if report.phase is NodePhase.SUCCEEDED and report.bytes_total:
            self.metrics.bytes_pulled.inc(report.bytes_total)


class RunnerEvents:
    """The runner's `PullEvents`: an attempt's Pulling report, a new pull's layers read for its byte
    progress, and the counts."""

    def __init__(self, *, reports: Reports, manifests: LayerSource, metrics: AgentMetrics, spawn: Spawn,
                 logger: NodeLogger) -> None:
        self.reports = reports
        self.manifests = manifests
        self.metrics = metrics
        self.spawn = spawn
        self.log = logger

    def attempt_started(self, run: TaskRun, report: StatusReport) -> None:
        self.log.info("attempt %d started", run.attempt, extra=_context(run))
        self.reports.send(report)

    def pull_started(self, shared: SharedPull, auth: Any) -> None:
        self.metrics.pull_calls.inc()

        def resolve() -> None:
            layers = None
            try:
                layers = self.manifests.layers(parse_image(shared.reference), auth)
            except ManifestError as e:
                self.log.info("layers of %s unknown, progress follows containerd only: %s", shared.reference, e)
            finally:
                shared.set_layers(layers)

        self.spawn(resolve, "agent-manifest")

    def disk_refused(self, run: TaskRun) -> None:
        self.metrics.disk_guard_refusals.inc()

    def throttled(self, run: TaskRun, report: StatusReport) -> None:
        self.metrics.registry_throttles.inc()
        self.reports.send(report)


def _context(run: TaskRun) -> dict[str, object]:
    return {"job": run.task.job, "image": run.task.image, "round": run.task.round, "attempt": run.attempt}
