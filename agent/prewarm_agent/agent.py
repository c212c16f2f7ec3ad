"""The node agent: consumes its node's task queue, pulls through the CRI, reports to the status queue.

Threads: one consumer long-polls the queue; one thread per task runs its pull (`TaskRunner`); a
heartbeat keeps held messages invisible; a sampler sends byte progress; an HTTP server answers the
probes and `/metrics`. Nothing is global, so several agents (one per simulated node) can share a
process: each has its own settings, clients, metrics registry and threads.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from prewarm.adapters.secrets import AgentCredentials
from prewarm.adapters.sqs import NodeQueues, QueueError, QueueRetryableError, StatusQueue
from prewarm.domain.images import parse_image
from prewarm.domain.messages import (
    WARMED_MISSING_MAX,
    CancelTask,
    FromAgent,
    Hello,
    ImageGone,
    MessageError,
    NodePhase,
    PullTask,
    RequiredImages,
    StatusReport,
    Warmed,
    parse_node_message,
)
from prewarm.services.ports import RegistryTokenSource
from prewarm_agent.attempts import CredentialSource, TaskRunner
from prewarm_agent.clock import Clock, SystemClock
from prewarm_agent.credentials import RegistryCredentials, registry_credentials
from prewarm_agent.cri.client import ContentStatusReader, CriImageClient
from prewarm_agent.cri.errors import CriError
from prewarm_agent.cri.pinning import PINNED_LABEL, ImagePins
from prewarm_agent.disk import DiskGuard
from prewarm_agent.endpoints import OpsServer
from prewarm_agent.logs import NodeLogger
from prewarm_agent.manifests import ManifestError, ManifestResolver
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.node import KubeApiAccess, NodeFacts, node_facts
from prewarm_agent.progress import Ingest
from prewarm_agent.pulls import Delivery, PullCoordinator, SharedPull, TaskRun
from prewarm_agent.queue import Received, TaskQueue
from prewarm_agent.settings import AgentSettings
from prewarm_agent.warming import KubeNodeWrites, NodeWrites, StartupTaintHold

log = logging.getLogger(__name__)

# Outcomes remembered per (job_uid, round), so a redelivered task is answered without a second pull.
OUTCOMES_KEPT = 4096
# Succeeded pulls watched for garbage collection (the newest; a node holds far fewer images).
KEPT_IMAGES = 1024
SHUTDOWN_REASON = "agent shutting down"
_REPORT_TRIES = 3
# Waiting for a node queue name SQS refuses for 60 s after a deletion: retries back off to this.
QUEUE_RETRY_MAX_SECONDS = 15.0


def agent_version() -> str:
    try:
        return version("prewarm")
    except PackageNotFoundError:
        return "0+unknown"


class StatusSink(Protocol):
    """Where reports and the hello go (`StatusQueue`)."""

    def send(self, message: FromAgent) -> None: ...


class IngestSource(Protocol):
    def list_statuses(self, filters: Sequence[str] = ()) -> Sequence[Ingest]: ...


class LayerSource(Protocol):
    def layers(self, image: Any, auth: Any) -> dict[str, int]: ...


def aws_client(service: str, settings: AgentSettings, pool: int = 10) -> Any:
    """A boto3 client for `service` in the agent's region, at `AWS_ENDPOINT_URL` when set."""
    import boto3
    from botocore.config import Config

    # A session of its own: agents built on several threads must not share boto3's default one.
    return boto3.session.Session().client(
        service,
        region_name=settings.aws_region,
        endpoint_url=settings.aws_endpoint_url,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=pool),
    )


class Agent:
    """One node's agent. `start()`, then `stop(grace)`; or `run_forever()` until SIGTERM.

    Every collaborator is injectable; the defaults are built from `settings`.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        cri: Any = None,
        content: IngestSource | None = None,
        sqs: Any = None,
        status: StatusSink | None = None,
        clock: Clock | None = None,
        credentials: CredentialSource | None = None,
        manifests: LayerSource | None = None,
        node: Callable[[], NodeFacts] | None = None,
        ecr_tokens: RegistryTokenSource | None = None,
        node_writes: NodeWrites | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.log = NodeLogger(log, {"node": settings.node_name})
        self._owned: list[Any] = []
        if cri is None:
            cri = CriImageClient(settings.cri_socket)
            self._owned.append(cri)
        if content is None:
            content = ContentStatusReader(settings.cri_socket)
            self._owned.append(content)
        self.cri = cri
        self.content = content
        self.sqs = sqs or aws_client("sqs", settings, pool=2 * settings.max_concurrent_pulls + 8)
        self.status = status or StatusQueue(settings.status_queue_url, client=self.sqs)
        self.node_queues = NodeQueues(
            settings.node_queue_prefix, settings.status_queue_url, dlq_arn=settings.node_dlq_arn,
            visibility_seconds=settings.node_queue_visibility_seconds, sender_arns=settings.node_queue_sender_arns,
            client=self.sqs,
        )
        self.credentials: CredentialSource = credentials or registry_credentials(
            settings, secrets=AgentCredentials(client=aws_client("secretsmanager", settings), clock=self.clock.time),
            clock=self.clock.time, token_source=ecr_tokens,
            # A throttled token request backs off on the agent's clock; a stop cuts the wait short.
            wait=lambda seconds: self.clock.wait(self._background_stop, seconds),
        )
        self.manifests = manifests or ManifestResolver(settings.registry_config_path)
        self._node = node or (lambda: node_facts(settings.node_name, self._kube_access()))
        self.node_writes = node_writes or KubeNodeWrites(settings.node_name, self._kube_access())
        # Held while the node has the startup taint (docs/agent.md, "Startup taint").
        self.warming: StartupTaintHold | None = None
        # Why the last pull of each image did not end with the image: for the warm deadline's Event.
        self._pull_failures: dict[str, str] = {}
        self.pulls = PullCoordinator(settings.max_concurrent_pulls, self.clock)
        self.metrics = AgentMetrics(lambda: self.pulls.in_flight)
        self.runner = TaskRunner(
            runtime=self.cri, pulls=self.pulls, credentials=self.credentials,
            disk=DiskGuard(self.cri, settings.disk_threshold_percent), clock=self.clock, events=self,
            allowlist=settings.registry_allowlist,
        )
        self.queue: TaskQueue | None = None
        self.http: OpsServer | None = None
        self._runs: dict[tuple[str, int], TaskRun] = {}
        self._run_threads: dict[tuple[str, int], threading.Thread] = {}
        self._outcomes: OrderedDict[tuple[str, int], StatusReport] = OrderedDict()
        # Tasks whose pull succeeded, watched in case the image disappears (docs/agent.md, "Garbage
        # collection"); and those reported gone, whose task, when it comes again, pulls again.
        self._kept: OrderedDict[tuple[str, int], PullTask] = OrderedDict()
        self._reported_gone: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.start_problem = ""  # why the node queue could not be set up yet, for /readyz
        self._stop_requested = threading.Event()
        self._background_stop = threading.Event()
        self._consumer: threading.Thread | None = None
        self._background: list[threading.Thread] = []
        self._hello: Hello | None = None
        self.hello_at: float | None = None  # when the first hello went out
        self._warmed: Warmed | None = None  # how the taint came off, until sent
        self._content_warned = False
        self._stopped = False

    # --- life cycle ------------------------------------------------------------------------------

    def _kube_access(self) -> KubeApiAccess:
        s = self.settings
        return KubeApiAccess(endpoint=s.kube_api_endpoint, token=s.kube_bearer_token,
                             token_file=s.kube_token_file, ca_file=s.kube_ca_file)

    @property
    def http_port(self) -> int | None:
        """The port `/healthz`, `/readyz` and `/metrics` answer on (useful with `HTTP_PORT=0`)."""
        return self.http.port if self.http is not None else None

    def start(self) -> None:
        """Serve the probes, ensure the node queue, say hello, and start consuming."""
        s = self.settings
        self.http = OpsServer(s.http_bind_address, s.http_port, healthy=self.liveness, ready=self.readiness,
                              registry=self.metrics.registry)
        self.http.start()
        if not s.node_dlq_arn:
            self.log.warning("NODE_DLQ_ARN is empty: the node queue gets no dead-letter queue, poison messages "
                             "come back until SQS drops them")
        url = self._ensure_queue()
        if url is None:
            return  # stopped while waiting for the queue
        if isinstance(self.credentials, RegistryCredentials):
            self.credentials.prepare(s.aws_region)
        self.queue = TaskQueue(self.sqs, url)
        facts = self._node()
        self.warming = self._startup_taint_hold(facts)
        self._hello = self._make_hello(url, facts)
        self._send_hello()
        self._consumer = self._spawn(self._consume, "agent-consumer")
        self._background = [
            self._spawn(self._heartbeat, "agent-heartbeat"),
            self._spawn(self._sample_progress, "agent-progress"),
        ]
        if s.image_check_interval_seconds > 0:
            self._background.append(self._spawn(self._watch_images, "agent-images"))
        if self.warming is not None:
            hold = self.warming
            self._background.append(self._spawn(lambda: self._warm(hold), "agent-warming"))
        self.log.info("consuming %s (%d pulls at a time)", url, s.max_concurrent_pulls, extra={"queue_url": url})

    def _ensure_queue(self) -> str | None:
        """The node's queue, waiting out what may pass: SQS refuses a deleted queue's name for 60 s, and
        EKS gives a new node the name of one that left (its IP). Exiting would only crash-loop the pod."""
        delay = 1.0
        while True:
            try:
                return self.node_queues.ensure_queue(self.settings.node_name)
            except QueueRetryableError as e:
                self.start_problem = str(e)
                self.log.warning("node queue not available yet, trying again in %.0f s: %s", delay, e)
                if self._stop_requested.wait(delay) or self._stopping.is_set():
                    return None
                delay = min(delay * 2, QUEUE_RETRY_MAX_SECONDS)

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"{name}-{self.settings.node_name}", daemon=True)
        thread.start()
        return thread

    def _startup_taint_hold(self, facts: NodeFacts) -> StartupTaintHold | None:
        """A hold when the node joined with the startup taint (and still has it), else None."""
        taint = self.settings.startup_taint
        if not any(taint.matches(t) for t in facts.taints):
            return None
        # From the node's join, not the agent's start: a restarted agent must not hold the node longer.
        joined_at = facts.created_at if facts.created_at is not None else self.clock.time()
        until = joined_at + self.settings.max_warm_seconds
        self.log.info("node holds the startup taint %s: removing it once its images are present, at the latest "
                      "%.0f s after it joined", taint, self.settings.max_warm_seconds)
        return StartupTaintHold(
            node=self.settings.node_name, taint=taint, joined_at=joined_at, until=until, images=self.cri,
            api=self.node_writes, clock=self.clock, metrics=self.metrics, why=self.why_missing, logger=self.log,
        )

    def why_missing(self, image: str) -> str:
        """Why `image` is not on the node, as far as this agent knows."""
        for run in self._current_runs():
            if run.task.image != image:
                continue
            if run.last_error:
                return f"pull failed (attempt {run.attempt}, retrying): {run.last_error}"
            return f"pull running (attempt {run.attempt})" if run.pulling else "pull waiting for a slot"
        if image in self._pull_failures:
            return f"pull failed: {self._pull_failures[image]}"
        return "no pull task received"

    def _make_hello(self, queue_url: str, facts: NodeFacts) -> Hello:
        try:
            images = sorted({digest for image in self.cri.list_images() for digest in image.repo_digests})
        except CriError as e:
            self.log.warning("cannot list the node's images for the hello: %s", e)
            images = []
        return Hello(node=self.settings.node_name, labels=dict(facts.labels), architecture=facts.architecture,
                     os=facts.os, queue_url=queue_url, images=images, agent_version=agent_version(),
                     warm_until=self.warming.until if self.warming is not None else None)

    def _send_once(self, message: FromAgent, what: str) -> bool:
        """Sends a message the heartbeat retries until it goes (the hello, the warm-up)."""
        try:
            self.status.send(message)
        except QueueError as e:
            self.log.warning("%s not sent, retrying with the next heartbeat: %s", what, e)
            return False
        return True

    def _send_hello(self) -> None:
        hello = self._hello
        if hello is None or not self._send_once(hello, "hello"):
            return
        self._hello = None
        self.hello_at = self.clock.time()
        self.log.info("hello sent: %s/%s, %d images present", hello.os, hello.architecture, len(hello.images))

    def _warm(self, hold: StartupTaintHold) -> None:
        """Hold the taint, then tell the control plane how it came off (`prewarm describe node` shows it)."""
        hold.run(self._background_stop)
        released = hold.released
        # Without a list the control plane may predate `Warmed` (it would be a poison message there).
        if released is None or hold.required is None:
            return
        missing = sorted(released.missing)
        self._warmed = Warmed(node=self.settings.node_name, joined_at=hold.joined_at,
                              hello_at=self.hello_at if self.hello_at is not None else hold.joined_at,
                              warm_at=released.at, outcome=released.outcome,
                              missing=missing[:WARMED_MISSING_MAX], missing_total=len(missing))
        self._send_warmed()

    def _send_warmed(self) -> None:
        warmed = self._warmed
        if warmed is not None and self._send_once(warmed, "warm-up"):
            self._warmed = None

    def request_stop(self) -> None:
        """Ask `run_forever` to stop (what SIGTERM does)."""
        self._stop_requested.set()

    def run_forever(self) -> int:
        """Run until SIGTERM/SIGINT (or `request_stop`), drain within `SHUTDOWN_GRACE_SECONDS`; returns 0."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.request_stop())
        self.start()
        self._stop_requested.wait()
        self.log.info("stop requested; draining for up to %gs", self.settings.shutdown_grace_seconds)
        self.stop(self.settings.shutdown_grace_seconds)
        return 0

    def stop(self, grace: float) -> None:
        """Stop taking messages; let pulls finish for `grace` seconds, then cancel them.

        Cancelled pulls report Cancelled (when they had started) and their messages become visible
        again at once, so a restarted agent retries them. Tasks still waiting for a slot are released
        without a report.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        for run in self._current_runs():
            if not run.pulling:
                run.cancel(SHUTDOWN_REASON, shutdown=True)
        ends = self.clock.monotonic() + grace
        while self._current_runs() and self.clock.monotonic() < ends:
            self.clock.wait(self._background_stop, min(0.1, max(0.0, ends - self.clock.monotonic())))
        # Only now: a run between attempts may start its next one within the grace period.
        self.pulls.close()
        for run in self._current_runs():
            run.cancel(SHUTDOWN_REASON, shutdown=True)
        for thread in self._current_threads():
            thread.join(timeout=10)
        if self._consumer is not None:
            self._consumer.join(timeout=self.settings.receive_wait_seconds + 10)
        self._background_stop.set()
        for thread in self._background:
            thread.join(timeout=10)
        if self.http is not None:
            self.http.stop()
        for closable in self._owned:
            closable.close()
        self.log.info("stopped")

    def _current_runs(self) -> list[TaskRun]:
        with self._lock:
            return list(self._runs.values())

    def _current_threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._run_threads.values())

    # --- probes --------------------------------------------------------------------------------

    def liveness(self) -> str | None:
        """What `/healthz` answers: None while the queue consumer is alive, else why not."""
        if self._consumer is not None and not self._consumer.is_alive() and not self._stopping.is_set():
            return "the queue consumer has stopped"
        return None

    def readiness(self) -> str | None:
        """What `/readyz` answers: None when containerd answers and the last receive did, else why not."""
        if self.queue is None:
            why = f": {self.start_problem}" if self.start_problem else ""
            return f"starting: the node queue is not set up yet{why}"
        if self._stopping.is_set():
            return "stopping"
        try:
            self.cri.version()
        except CriError as e:
            return str(e)
        # The outcome of the last long poll: a probe must not cost an SQS request of its own.
        return self.queue.problem

    # --- consuming -----------------------------------------------------------------------------

    def _consume(self) -> None:
        assert self.queue is not None
        pause = 1.0
        while not self._stopping.is_set():
            try:
                received = self.queue.receive(
                    wait_seconds=self.settings.receive_wait_seconds,
                    visibility_seconds=self.settings.node_queue_visibility_seconds,
                )
            except QueueError as e:
                self.log.warning("receiving from the node queue failed, retrying in %gs: %s", pause, e)
                self._stopping.wait(pause)
                pause = min(pause * 2, 30.0)
                continue
            pause = 1.0
            for message in received:
                if self._stopping.is_set():
                    self._release([message.delivery])
                    continue
                try:
                    self._handle(message)
                except Exception:
                    # One bad message must not stop the node; it comes back after its visibility timeout.
                    self.log.exception("message %s could not be handled", message.delivery.message_id,
                                       extra={"message_id": message.delivery.message_id})

    def _handle(self, message: Received) -> None:
        delivery = message.delivery
        try:
            parsed = parse_node_message(message.body)
        except MessageError as e:
            self._poison(message, str(e))
            return
        if parsed.node != self.settings.node_name:
            self._poison(message, f"message for node {parsed.node!r} on the queue of {self.settings.node_name!r}")
            return
        if isinstance(parsed, CancelTask):
            self._cancel(parsed, delivery)
        elif isinstance(parsed, RequiredImages):
            self._required(parsed, delivery)
        else:
            self._task(parsed, delivery)

    def _required(self, required: RequiredImages, delivery: Delivery) -> None:
        self.metrics.messages.labels("required").inc()
        hold = self.warming
        if hold is None or hold.done.is_set():
            self.log.info("list of %d required images ignored: the node holds no startup taint",
                          len(required.images))
        elif hold.offer(required):
            self.log.info("node must have %d images before its startup taint comes off: %s", len(required.images),
                          ", ".join(sorted({i.image for i in required.images})) or "none")
        else:
            self.log.info("an older list of required images ignored")
        self._delete([delivery])

    def _poison(self, message: Received, reason: str) -> None:
        # Never deleted: after maxReceiveCount receives SQS moves it to the dead-letter queue.
        self.metrics.messages.labels("poison").inc()
        self.log.error(
            "poison message %s (received %d times) left for the dead-letter queue: %s",
            message.delivery.message_id, message.receive_count, reason,
            extra={"message_id": message.delivery.message_id},
        )

    def _task(self, task: PullTask, delivery: Delivery) -> None:
        key = (task.job_uid, task.round)
        context = {"job": task.job, "image": task.image, "round": task.round}
        finished: StatusReport | None = None
        with self._lock:
            run = self._runs.get(key)
            if self._stopping.is_set() and run is None:
                # Checked under the lock `stop()` takes to list the runs, so no run starts unseen.
                kind = "released"
            elif run is not None:
                run.deliveries.append(delivery)
                kind = "duplicate"
            elif key in self._reported_gone:
                self._reported_gone.discard(key)
                again = TaskRun(task, delivery, after=self._outcomes.pop(key, None))
                self._runs[key] = again
                self._run_threads[key] = self._spawn(lambda: self._run(again), f"pull-{task.job_uid[:8]}")
                kind = "again"
            elif key in self._outcomes:
                finished = self._outcomes[key]
                kind = "finished"
            else:
                run = TaskRun(task, delivery)
                self._runs[key] = run
                self._run_threads[key] = self._spawn(lambda: self._run(run), f"pull-{task.job_uid[:8]}")
                kind = "task"
        if kind == "released":
            self._release([delivery])
            return
        self.metrics.messages.labels(kind).inc()
        if kind == "duplicate":
            self.log.info("task already running here; the duplicate joins it", extra=context)
        elif finished is not None:
            self.log.info("task already finished here (%s); reporting it again", finished.phase, extra=context)
            if self._send(finished):
                self._delete([delivery])
        elif kind == "again":
            self.log.info("task received again after its image was removed: pulling it again", extra=context)
        else:
            self.log.info("task received (%s)", task.image_pull_policy, extra=context)

    def _cancel(self, cancel: CancelTask, delivery: Delivery) -> None:
        key = (cancel.job_uid, cancel.round)
        reason = cancel.reason or "cancelled by the control plane"
        context = {"job": cancel.job, "round": cancel.round}
        unknown: StatusReport | None = None
        with self._lock:
            self._kept.pop(key, None)
            self._reported_gone.discard(key)
            run = self._runs.get(key)
            mismatched = run is not None and run.task.job != cancel.job
            if mismatched:
                run = None
            elif run is None and key not in self._outcomes:
                # The task may still be on its way (SQS does not keep order): it will not run.
                unknown = StatusReport(job=cancel.job, job_uid=cancel.job_uid, round=cancel.round, node=cancel.node,
                                       phase="Cancelled", attempt=0, seq=1, message=reason,
                                       finished_at=self.clock.time())
                self._remember(key, unknown)
        self.metrics.messages.labels("cancel").inc()
        if mismatched:
            self.log.warning("cancel names job %s but uid %s runs another job here; ignored", cancel.job,
                             cancel.job_uid, extra=context)
        elif run is not None:
            self.log.info("cancelling the pull: %s", reason, extra=context)
            run.cancel(reason)
        elif unknown is not None:
            self.log.info("cancel for a task not seen here; it is recorded as Cancelled", extra=context)
            self._send(unknown)
        self._delete([delivery])

    def _remember(self, key: tuple[str, int], report: StatusReport) -> None:
        self._outcomes[key] = report
        self._outcomes.move_to_end(key)
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    # --- running tasks -------------------------------------------------------------------------

    def _run(self, run: TaskRun) -> None:
        try:
            report = self.runner.run(run)
        except Exception as e:
            self.log.exception("the pull failed unexpectedly", extra=_context(run))
            report = run.report(NodePhase.FAILED, message=f"agent error: {type(e).__name__}: {e}",
                                finished_at=self.clock.time())
        self._finish(run, report)

    def _finish(self, run: TaskRun, report: StatusReport) -> None:
        if report.phase == NodePhase.SUCCEEDED and run.task.pin:
            report = report.model_copy(update={"message": f"{report.message}; {self._pin(run)}".lstrip("; ")})
        released = run.shutdown and report.phase == "Cancelled"
        with self._lock:
            self._runs.pop(run.key, None)
            self._run_threads.pop(run.key, None)
            deliveries = list(run.deliveries)
            if not released:
                self._remember(run.key, report)
            if report.phase == NodePhase.SUCCEEDED and not run.cancelled.is_set():
                self._kept[run.key] = run.task
                self._kept.move_to_end(run.key)
                while len(self._kept) > KEPT_IMAGES:
                    self._kept.popitem(last=False)
        if released:
            if run.pulling:
                self._send(report)
            self._release(deliveries)
            self.log.info("released for a restarted agent (pulling: %s)", run.pulling, extra=_context(run))
            return
        self._count(report)
        self.log.info("%s %s", report.phase, report.message, extra=_context(run))
        if self.warming is not None and not self.warming.done.is_set():
            if report.phase == "Succeeded":
                self._pull_failures.pop(run.task.image, None)
            else:
                self._pull_failures[run.task.image] = report.message
            self.warming.poke()
        if self._send(report):
            self._delete(deliveries)

    def _pin(self, run: TaskRun) -> str:
        """Pins the pulled image (the job's `prewarm.dev/pin`); says how it went. A pin that fails
        leaves the pull Succeeded: the image is there, garbage collection may only take it sooner."""
        try:
            with ImagePins(self.settings.cri_socket) as pins:
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
        if report.phase == "Succeeded" and report.bytes_total:
            self.metrics.bytes_pulled.inc(report.bytes_total)

    def _send(self, report: StatusReport) -> bool:
        for attempt in range(1, _REPORT_TRIES + 1):
            try:
                self.status.send(report)
                return True
            except QueueError as e:
                if attempt == _REPORT_TRIES:
                    self.metrics.reports_failed.inc()
                    self.log.error("%s report not sent, the task message will come back: %s", report.phase, e,
                                   extra={"job": report.job, "round": report.round})
                    return False
                self.clock.wait(self._background_stop, 0.5 * attempt)
        return False

    def _delete(self, deliveries: Sequence[Delivery]) -> None:
        if self.queue is not None and deliveries:
            for failure in self.queue.delete(deliveries):
                self.log.warning("message not deleted, it will come back and be answered again: %s", failure)

    def _release(self, deliveries: Sequence[Delivery]) -> None:
        if self.queue is not None and deliveries:
            for failure in self.queue.set_visibility(deliveries, 0):
                self.log.warning("message not released: %s", failure)

    # --- PullEvents, called by the runner --------------------------------------------------------

    def attempt_started(self, run: TaskRun, report: StatusReport) -> None:
        self.log.info("attempt %d started", run.attempt, extra=_context(run))
        self._send(report)

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

        self._spawn(resolve, "agent-manifest")

    def disk_refused(self, run: TaskRun) -> None:
        self.metrics.disk_guard_refusals.inc()

    # --- background ----------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        interval = self.settings.heartbeat_interval_seconds
        while not self._background_stop.wait(interval):
            with self._lock:
                held = [delivery for run in self._runs.values() for delivery in run.deliveries]
            if held and self.queue is not None:
                for failure in self.queue.set_visibility(held, self.settings.node_queue_visibility_seconds):
                    self.log.warning("visibility not extended: %s", failure)
            self._send_hello()
            self._send_warmed()

    def _watch_images(self) -> None:
        while not self._background_stop.wait(self.settings.image_check_interval_seconds):
            try:
                self.check_images()
            except Exception:
                self.log.exception("image check failed")

    def check_images(self) -> list[ImageGone]:
        """One ListImages: report each image a task pulled here (Succeeded) that is no longer on the node,
        with the disk guard's verdict, so the control plane pulls it again or marks the node."""
        with self._lock:
            kept = list(self._kept.items())
        if not kept:
            return []
        try:
            present = {name for image in self.cri.list_images() for name in (*image.repo_tags, *image.repo_digests)}
        except CriError as e:
            self.log.warning("image check skipped: containerd did not list its images: %s", e)
            return []
        gone = []
        for key, task in kept:
            if task.image in present or self._still_there(task.image):
                continue
            disk = self.runner.disk.check(task.size_bytes) or ""
            message = ImageGone(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node,
                                image=task.image, seen_at=self.clock.time(), disk=disk)
            try:
                self.status.send(message)
            except QueueError as e:
                self.log.warning("gone image not reported, trying again at the next check: %s", e)
                continue
            with self._lock:
                self._kept.pop(key, None)
                self._reported_gone.add(key)
            self.metrics.images_gone.inc()
            self.log.warning("image removed from the node since it was pulled (image garbage collection?)%s",
                             f"; not enough room to pull it again: {disk}" if disk else "",
                             extra={"job": task.job, "image": task.image, "round": task.round})
            gone.append(message)
        return gone

    def _still_there(self, image: str) -> bool:
        """ListImages names images as containerd stored them; ask once more by the task's own reference."""
        try:
            return self.cri.image_status(image) is not None
        except CriError:
            return True  # unknown: not reported as gone

    def _sample_progress(self) -> None:
        while not self._background_stop.wait(self.settings.progress_interval_seconds):
            try:
                self.report_progress()
            except Exception:
                self.log.exception("progress sampling failed")

    def report_progress(self) -> None:
        """Send one Pulling report for every task past its first attempt (the sampler's tick): the bytes so
        far of a running pull, or that the next attempt waits. The control plane reads silence as a gone
        agent (docs/agent.md, "Progress"), so a run between attempts reports too.
        """
        running = self.pulls.running()
        waiting = [run for run in self._current_runs()
                   if run.pulling and not run.cancelled.is_set() and not any(run in runs for _, runs in running)]
        for run in waiting:
            self._send(run.report(NodePhase.PULLING, message=f"attempt {run.attempt} ended; waiting for the next"))
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
                self._send(report)


def _context(run: TaskRun) -> dict[str, object]:
    return {"job": run.task.job, "image": run.task.image, "round": run.task.round, "attempt": run.attempt}
