"""The node agent: consumes its node's task queue, pulls through the CRI, reports to the status queue.

Threads: one consumer long-polls the queue (`receiving`); one thread per task runs its pull
(`running`); a heartbeat keeps held messages invisible and a sampler sends byte progress
(`heartbeat`); the image check watches pulled images (`image_checks`); the startup taint is held
until the node is warm (`startup`); an HTTP server answers the probes and `/metrics`. `Agent` builds
the parts, starts them and stops them. Nothing is global, so several agents (one per simulated node)
can share a process: each has its own settings, clients, metrics registry and threads.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from prewarm.adapters.secrets import AgentCredentials
from prewarm.adapters.sqs import NodeQueues, QueueError, QueueRetryableError, StatusQueue
from prewarm.domain.messages import ImageGone
from prewarm.services.ports import RegistryTokenSource
from prewarm_agent.attempts import CredentialSource, TaskRunner
from prewarm_agent.clock import Clock, SystemClock
from prewarm_agent.credentials import RegistryCredentials, registry_credentials
from prewarm_agent.cri.client import ContentStatusReader, CriImageClient
from prewarm_agent.cri.errors import CriError
from prewarm_agent.disk import DiskGuard
from prewarm_agent.endpoints import OpsServer
from prewarm_agent.heartbeat import Heartbeat, IngestSource, ProgressReports
from prewarm_agent.image_checks import ImageChecks
from prewarm_agent.logs import NodeLogger
from prewarm_agent.manifests import ManifestResolver
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.node import KubeApiAccess, NodeFacts, node_facts
from prewarm_agent.pulled import PullRecord
from prewarm_agent.pulls import PullCoordinator, TaskRun
from prewarm_agent.queue import TaskQueue
from prewarm_agent.receiving import Receiver
from prewarm_agent.removals import Removals
from prewarm_agent.reporting import Reports, StatusSink
from prewarm_agent.running import LayerSource, RunnerEvents, TaskRuns
from prewarm_agent.settings import AgentSettings
from prewarm_agent.startup import NodeStartup
from prewarm_agent.tasks import NodeTasks, TaskKey
from prewarm_agent.warming import KubeNodeWrites, NodeWrites, StartupTaintHold

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "agent shutting down"
# Waiting for the node queue the control plane makes: GetQueueUrl retries back off to this.
QUEUE_RETRY_MAX_SECONDS = 15.0
# While it waits, the agent says hello again this often: the control plane makes the queue on a hello
# its cluster's API vouches for, and an API that could not show the node then may show it now.
HELLO_AGAIN_SECONDS = 30.0
WAITING_FOR_QUEUE = "the control plane makes it once the cluster's API shows this node (hello sent)"


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
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        # Ends the background loops, and cuts their waits (report retries, token backoff) short.
        self._background_stop = threading.Event()
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
        # Found, never made: only the control plane creates node queues (docs/operations.md, "Trust boundaries").
        self.node_queues = NodeQueues(settings.node_queue_prefix, settings.status_queue_url, client=self.sqs,
                                      cluster=settings.cluster)
        self.credentials: CredentialSource = credentials or registry_credentials(
            settings, secrets=AgentCredentials(client=aws_client("secretsmanager", settings), clock=self.clock.time),
            clock=self.clock.time, token_source=ecr_tokens,
            # A throttled token request backs off on the agent's clock; a stop cuts the wait short.
            wait=lambda seconds: self.clock.wait(self._background_stop, seconds),
        )
        self.manifests = manifests or ManifestResolver(settings.registry_config_path)
        self._node = node or (lambda: node_facts(settings.node_name, self._kube_access()))
        self.node_writes = node_writes or KubeNodeWrites(settings.node_name, self._kube_access())
        self.pulls = PullCoordinator(settings.max_concurrent_pulls, self.clock)
        self.metrics = AgentMetrics(lambda: self.pulls.in_flight)
        self.tasks = NodeTasks()
        self.reports = Reports(self.status, metrics=self.metrics, clock=self.clock, stop=self._background_stop,
                               logger=self.log)
        self.startup = NodeStartup(
            settings, images=self.cri, node_writes=self.node_writes, status=self.status, tasks=self.tasks,
            clock=self.clock, metrics=self.metrics, stop=self._background_stop, logger=self.log,
        )
        events = RunnerEvents(reports=self.reports, manifests=self.manifests, metrics=self.metrics,
                              spawn=self._spawn, logger=self.log)
        self.runner = TaskRunner(
            runtime=self.cri, pulls=self.pulls, credentials=self.credentials,
            disk=DiskGuard(self.cri, settings.disk_threshold_percent), clock=self.clock, events=events,
            allowlist=settings.registry_allowlist,
        )
        self.record = PullRecord(settings.state_dir)
        self.task_runs = TaskRuns(
            self.runner, tasks=self.tasks, reports=self.reports, startup=self.startup, cri_socket=settings.cri_socket,
            record=self.record, metrics=self.metrics, clock=self.clock, logger=self.log,
        )
        self.removals = Removals(self.cri, self.record, settings, tasks=self.tasks, status=self.status,
                                 clock=self.clock, stop=self._background_stop, logger=self.log)
        self.progress = ProgressReports(
            self.content, settings, pulls=self.pulls, tasks=self.tasks, reports=self.reports, clock=self.clock,
            stop=self._background_stop, logger=self.log,
        )
        self.image_checks = ImageChecks(
            self.cri, interval=settings.image_check_interval_seconds, tasks=self.tasks, disk=self.runner.disk,
            status=self.status, metrics=self.metrics, clock=self.clock, stop=self._background_stop, logger=self.log,
        )
        self.http: OpsServer | None = None
        self.start_problem = ""  # why the node queue could not be set up yet, for /readyz
        self._consumer: threading.Thread | None = None
        self._background: list[threading.Thread] = []
        self._stopped = False

    @property
    def queue(self) -> TaskQueue | None:
        """The node queue, once `start()` has set it up."""
        return self.reports.queue

    @property
    def warming(self) -> StartupTaintHold | None:
        """The startup taint's hold while the node had it at start (docs/agent.md, "Startup taint")."""
        return self.startup.hold

    @property
    def hello_at(self) -> float | None:
        """When the first hello went out."""
        return self.startup.hello_at

    @property
    def _runs(self) -> dict[TaskKey, TaskRun]:
        """The runs in flight (tests add their own)."""
        return self.tasks.runs

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
        """Serve the probes, say hello, and start consuming the node queue once it exists: at once when it
        does, else from a thread that waits for the control plane to make it (`_wait_for_queue`)."""
        s = self.settings
        self.http = OpsServer(s.http_bind_address, s.http_port, healthy=self.liveness, ready=self.readiness,
                              registry=self.metrics.registry)
        self.http.start()
        facts = self._node()
        # The startup taint's deadline runs from here, whatever AWS answers: a node whose agent cannot
        # reach its queue (no VPC endpoint, no policy) becomes schedulable at the deadline.
        if (hold := self.startup.hold_taint(facts)) is not None:
            self._background.append(self._spawn(lambda: self.startup.warm(hold), "agent-warming"))
        elif not facts.from_api:
            # Whether the node holds the startup taint is unknown until its Node is read: read it again.
            started = self.clock.time()
            self._background.append(self._spawn(
                lambda: self.startup.read_node_until_deadline(self._node, started_at=started), "agent-warming"))
        # The hello goes first: the control plane makes the node's queue on it, and on a node with every required
        # image releases its startup taint; looking up the queue and building the ECR client wait until it is sent.
        self.startup.begin(self.node_queues.queue_url(s.node_name), facts)
        try:
            url = self.node_queues.find_queue(s.node_name)
        except QueueRetryableError as e:
            url, self.start_problem = None, str(e)
        except QueueError as e:
            self.startup.give_up(f"the agent cannot start: {e}")
            raise
        if isinstance(self.credentials, RegistryCredentials):
            self.credentials.prepare(s.aws_region)
        if url is not None:
            self._consume(url)
            return
        self._background.append(self._spawn(self._consume_once_made, "agent-queue-wait"))

    def _consume_once_made(self) -> None:
        url = self._wait_for_queue()
        if url is not None and not self._stopping.is_set():
            self._consume(url)

    def _consume(self, url: str) -> None:
        s = self.settings
        queue = self.reports.queue = TaskQueue(self.sqs, url)
        receiver = Receiver(
            queue, s, stopping=self._stopping, tasks=self.tasks, task_runs=self.task_runs, reports=self.reports,
            hold=lambda: self.warming, metrics=self.metrics, clock=self.clock, spawn=self._spawn, logger=self.log,
            record=self.record,
            recreate=lambda: self._wait_for_queue(gone=True),
        )
        heartbeat = Heartbeat(queue, s, tasks=self.tasks, startup=self.startup, stop=self._background_stop,
                              logger=self.log)
        self._consumer = self._spawn(receiver.consume, "agent-consumer")
        self._background += [
            self._spawn(heartbeat.run, "agent-heartbeat"),
            self._spawn(self.progress.run, "agent-progress"),
        ]
        if s.image_check_interval_seconds > 0:
            self._background.append(self._spawn(self.image_checks.watch, "agent-images"))
        self._background.append(self._spawn(self.removals.watch, "agent-removals"))
        self.log.info("consuming %s (%d pulls at a time)", url, s.max_concurrent_pulls, extra={"queue_url": url})

    def _wait_for_queue(self, *, gone: bool = False) -> str | None:
        """The node's queue once the control plane has made it: GetQueueUrl again, backing off, saying why,
        and saying hello again every `HELLO_AGAIN_SECONDS` (at once when the queue is `gone` under the
        running agent). None when stopped meanwhile. Exiting would only crash-loop the pod."""
        delay = 1.0
        hello_at = -HELLO_AGAIN_SECONDS if gone else self.clock.monotonic()
        while not self._stopping.is_set() and not self._stop_requested.is_set():
            if self.clock.monotonic() - hello_at >= HELLO_AGAIN_SECONDS:
                self.startup.say_hello_again()
                hello_at = self.clock.monotonic()
            else:
                self.startup.send_hello()  # a hello the status queue refused so far
            try:
                url = self.node_queues.find_queue(self.settings.node_name)
            except QueueError as e:
                why = str(e)
            else:
                if url is not None:
                    self.start_problem = ""
                    return url
                why = WAITING_FOR_QUEUE
            self.start_problem = f"waiting for the node queue: {why}"
            self.log.warning("node queue not available yet, trying again in %.0f s: %s", delay, why)
            if self._stopping.wait(delay):
                return None
            delay = min(delay * 2, QUEUE_RETRY_MAX_SECONDS)
        return None

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"{name}-{self.settings.node_name}", daemon=True)
        thread.start()
        return thread

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

        Cancelled pulls that had started report Pulling (`SHUTDOWN_MESSAGE`), not a final phase, and
        their messages become visible again at once, so a restarted agent retries them. Tasks still
        waiting for a slot are released without a report.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        for run in self.tasks.current_runs():
            if not run.pulling:
                run.cancel(SHUTDOWN_REASON, shutdown=True)
        ends = self.clock.monotonic() + grace
        while self.tasks.current_runs() and self.clock.monotonic() < ends:
            self.clock.wait(self._background_stop, min(0.1, max(0.0, ends - self.clock.monotonic())))
        # Only now: a run between attempts may start its next one within the grace period.
        self.pulls.close()
        for run in self.tasks.current_runs():
            run.cancel(SHUTDOWN_REASON, shutdown=True)
        for thread in self.tasks.current_threads():
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

    # --- one round of a background loop, on demand -----------------------------------------------

    def check_images(self) -> list[ImageGone]:
        """One image check now (`ImageChecks.check`)."""
        return self.image_checks.check()

    def report_progress(self) -> None:
        """One progress tick now (`ProgressReports.report`)."""
        self.progress.report()
