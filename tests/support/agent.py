"""Fakes for the agent's unit tests: a runtime whose pulls end as scripted, credentials, a disk, what the
runner tells the agent, and an SQS client that counts every request. The clock is
`tests.support.clock.Clock`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.images import ImageRef, parse_image
from prewarm.domain.messages import PullTask, StatusReport
from prewarm.domain.registries import RegistryAuth
from prewarm_agent.credentials import Candidates
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import CriError, PullCancelledError
from prewarm_agent.pulls import Delivery, SharedPull, TaskRun

IMAGE_ID = "sha256:" + "c" * 64
REPO_DIGEST = "sha256:" + "d" * 64
NEVER = object()  # a pull that never finishes by itself


@dataclass(frozen=True)
class Ingest:
    """An in-flight download as containerd lists it."""

    ref: str
    offset: int
    total: int


class FakeCall:
    """A PullImage call that ends with `outcome` (an image ref, a CriError, or NEVER)."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome
        self.cancelled = False
        self._callbacks: list[Callable[[FakeCall], None]] = []

    def done(self) -> bool:
        return self.cancelled or self.outcome is not NEVER

    def cancel(self) -> bool:
        if self.done():
            return False
        self.cancelled = True
        for callback in self._callbacks:
            callback(self)
        return True

    def result(self, timeout: float | None = None) -> str:
        if self.cancelled:
            raise PullCancelledError("pulling was cancelled")
        if isinstance(self.outcome, CriError):
            raise self.outcome
        if self.outcome is NEVER:
            raise TimeoutError("still running")
        return str(self.outcome)

    def finish(self, outcome: object) -> None:
        self.outcome = outcome
        for callback in self._callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[FakeCall], None]) -> None:
        if self.done():
            callback(self)
        else:
            self._callbacks.append(callback)


@dataclass
class PullRequest:
    image: str
    auth: tuple[str, str] | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    call: FakeCall


class FakeRuntime:
    """Pulls end with the next of `outcomes`; a successful pull makes the image present."""

    def __init__(self, outcomes: Sequence[object] = (IMAGE_ID,), present: Mapping[str, ImageInfo] | None = None):
        self.outcomes = list(outcomes)
        self.present = dict(present or {})
        self.pulls: list[PullRequest] = []

    def image_status(self, image: str) -> ImageInfo | None:
        return self.present.get(image)

    def version(self) -> str:
        return "fake-runtime"

    def list_images(self) -> list[ImageInfo]:
        return list(self.present.values())

    def pull_image(
        self,
        image: str,
        auth: tuple[str, str] | None = None,
        sandbox_labels: Mapping[str, str] | None = None,
        sandbox_annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> FakeCall:
        outcome = self.outcomes.pop(0) if self.outcomes else IMAGE_ID
        call = FakeCall(outcome)
        self.pulls.append(PullRequest(image, auth, dict(sandbox_labels or {}), dict(sandbox_annotations or {}), call))
        if isinstance(outcome, str):
            digest = f"{parse_image(image).name}@{REPO_DIGEST}"
            self.present[image] = ImageInfo(id=outcome, repo_tags=(image,), repo_digests=(digest,), size=4096)
        return call


class NoContent:
    """containerd's content store with no download in progress (the agent's progress source)."""

    def list_statuses(self, filters: object = ()) -> list[object]:
        return []


class NoLayers:
    """A registry whose manifests say nothing of layer sizes (the agent's layer source)."""

    def layers(self, image: object, auth: object) -> dict[str, int]:
        return {}


@dataclass
class FakeCredentials:
    """`auths` are the task's secrets' matches (None: anonymous); `node_auths` the node's shared credential,
    offered only when the task may use it (`shared`, which `shared_asked` records)."""

    auths: Sequence[RegistryAuth | None] = (None,)
    problems: Sequence[str] = ()
    asked: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    node_auths: Sequence[RegistryAuth] = ()
    shared_asked: list[bool] = field(default_factory=list)

    def candidates(self, image: ImageRef, pull_secret_arns: Sequence[str], *, shared: bool = True) -> Candidates:
        self.asked.append((str(image), tuple(pull_secret_arns)))
        self.shared_asked.append(shared)
        if not shared:
            return Candidates([a for a in self.auths if a is not None], list(self.problems))
        return Candidates([*self.auths, *self.node_auths], list(self.problems))


@dataclass
class FakeDisk:
    refusal: str | None = None
    checked: list[int | None] = field(default_factory=list)

    def check(self, size_bytes: int | None) -> str | None:
        self.checked.append(size_bytes)
        return self.refusal


@dataclass
class RecordedEvents:
    """What the runner told the agent: Pulling reports, started pulls, disk refusals."""

    reports: list[StatusReport] = field(default_factory=list)
    started: list[SharedPull] = field(default_factory=list)
    refused: int = 0
    #: What the manifest says the started pulls' layers are (None: it could not be read).
    layers: dict[str, int] | None = None

    def attempt_started(self, run: TaskRun, report: StatusReport) -> None:
        self.reports.append(report)

    def pull_started(self, shared: SharedPull, auth: RegistryAuth | None) -> None:
        self.started.append(shared)
        shared.set_layers(self.layers)

    def disk_refused(self, run: TaskRun) -> None:
        self.refused += 1

    def throttled(self, run: TaskRun, report: StatusReport) -> None:
        self.reports.append(report)


def make_task(image: str = "registry.example.com/team/app:v1", **fields: object) -> PullTask:
    values: dict[str, object] = {"job": "default/warm", "job_uid": "uid-1", "round": 2, "node": "node-a",
                                 "image": image, **fields}
    return PullTask.model_validate(values)


def make_run(task: PullTask | None = None) -> TaskRun:
    return TaskRun(task or make_task(), Delivery("m-1", "receipt-1"))


class CountingSqs:
    """An SQS client that counts every request by operation, as SQS bills them.

    `receive_message` is an empty long poll: it moves `clock` by its `WaitTimeSeconds` (what the poll
    lasts when nothing arrives), then calls `on_receive`; `failures` (exceptions) are raised by the next
    receives, one each. Every other operation answers what the agent needs at start.
    """

    def __init__(self, clock: Any, on_receive: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.on_receive = on_receive
        self.failures: list[Exception] = []
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, operation: str) -> None:
        with self._lock:
            self.requests[operation] += 1

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        self._count("ReceiveMessage")
        if self.failures:
            raise self.failures.pop(0)
        self.clock.advance(float(kwargs.get("WaitTimeSeconds", 0)))
        if self.on_receive is not None:
            self.on_receive()
        return {}

    def get_queue_url(self, **kwargs: Any) -> dict[str, Any]:
        self._count("GetQueueUrl")
        return {"QueueUrl": f"https://sqs.us-west-2.amazonaws.com/123456789012/{kwargs['QueueName']}"}

    def send_message(self, **kwargs: Any) -> dict[str, Any]:
        self._count("SendMessage")
        return {"MessageId": "m-1"}

    def __getattr__(self, operation: str) -> Callable[..., dict[str, Any]]:
        # Any other request (GetQueueAttributes, ChangeMessageVisibilityBatch, ...) is counted too.
        if operation.startswith("_"):
            raise AttributeError(operation)
        name = "".join(part.capitalize() for part in operation.split("_"))

        def call(**kwargs: Any) -> dict[str, Any]:
            self._count(name)
            return {}

        return call


def agent_on_queues(sqs: Any, status_url: str, *, node: str = "node-a", prefix: str = "prewarm-node") -> Any:
    """An `Agent` of `node` on these SQS queues (moto), with a runtime, content store and registry that
    have nothing to say: for tests of how it finds, waits for and keeps its node queue."""
    from prewarm_agent.agent import Agent
    from prewarm_agent.node import NodeFacts
    from prewarm_agent.settings import AgentSettings

    settings = AgentSettings.from_env({
        "NODE_NAME": node, "NODE_QUEUE_PREFIX": prefix, "AWS_REGION": "us-west-2",
        "STATUS_QUEUE_URL": status_url, "HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": "0",
        "RECEIVE_WAIT_SECONDS": "1",
    })
    return Agent(settings, cri=FakeRuntime(), content=NoContent(), sqs=sqs, credentials=FakeCredentials(),
                 manifests=NoLayers(), node=lambda: NodeFacts(name=node))
