"""Pulls in flight on the node: the per-node cap, shared pulls, and one task's run state.

A `TaskRun` is one task (job, job_uid, round) on this node. A `SharedPull` is one CRI PullImage call;
runs that need the same pull reference with the same credentials wait on the same call instead of
starting another. The call is cancelled only when the last run waiting on it leaves (cancelled or
timed out), which makes containerd stop downloading. At most `max_concurrent` calls run at once;
runs that need a new call queue for a slot in arrival order.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prewarm.domain.messages import NodePhase, PullTask, StatusReport
from prewarm_agent.clock import Clock
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.progress import Ingest, Progress, ProgressTracker


class PullCall(Protocol):
    """An in-flight PullImage call (`PullHandle` is one)."""

    def cancel(self) -> bool: ...

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> str: ...

    def add_done_callback(self, callback: Callable[[PullCall], None]) -> None: ...


class ImageRuntime(Protocol):
    """The CRI calls a pull needs (`CriImageClient` has them)."""

    def image_status(self, image: str) -> ImageInfo | None: ...

    def pull_image(
        self,
        image: str,
        auth: tuple[str, str] | None = None,
        sandbox_labels: Mapping[str, str] | None = None,
        sandbox_annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> PullCall: ...


@dataclass(frozen=True)
class Delivery:
    """One receipt of an SQS message: deleting or releasing it needs its receipt handle."""

    message_id: str
    receipt_handle: str = field(repr=False)


class TaskRun:
    """One task's pull on this node, from the first message to the final report.

    `deliveries` are every receipt of the task's messages (duplicates join the run); they are kept
    invisible while the run lives and deleted once the outcome is reported.
    """

    def __init__(self, task: PullTask, delivery: Delivery, *, after: StatusReport | None = None,
                 first_seq: int = 0) -> None:
        """`after`: the last report of an earlier run of the same task (a pull again after the image was
        removed): this run's reports number on from it, so the control plane takes them as newer.
        `first_seq`: where a fresh run's `seq` starts; the agent passes the time in milliseconds, so a
        run of a restarted agent (the task came back after a drain) reports newer than the old one's."""
        self.task = task
        self.key = (task.job_uid, task.round)
        self.deliveries = [delivery]
        self.cancelled = threading.Event()
        self.cancel_reason = ""
        #: Cancelled because the agent stops: its messages are released for a restarted agent.
        self.shutdown = False
        #: Set whenever the run should look at its pull again (finished, cancelled, a slot freed).
        self.wake = threading.Event()
        self.attempt = 0
        self.last_error = ""  # the last failed attempt's, while the run retries
        self.throttled = ""  # while the run waits out a registry's 429: what its reports say
        self.started_at: float | None = None
        self.attempt_started_at: float | None = None
        self.shared: SharedPull | None = None
        self._seq = max(after.seq if after is not None else 0, first_seq)
        self._attempt_base = after.attempt if after is not None else 0
        self._lock = threading.Lock()

    def cancel(self, reason: str, *, shutdown: bool = False) -> None:
        """Ask the run to stop; its pull is cancelled unless another run still waits on it."""
        with self._lock:
            if not self.cancelled.is_set():
                self.cancel_reason = reason
                self.shutdown = shutdown
        self.cancelled.set()
        self.wake.set()

    @property
    def pulling(self) -> bool:
        """True once an attempt has started (a Pulling report was sent)."""
        return self.attempt > 0

    def begin_attempt(self, number: int, now: float) -> None:
        self.attempt = number
        self.attempt_started_at = now
        if self.started_at is None:
            self.started_at = now

    def report(self, phase: NodePhase, **fields: object) -> StatusReport:
        """The next report of this run: same job, round and node, the current attempt, a higher `seq`."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        return StatusReport.model_validate(
            {
                "job": self.task.job, "job_uid": self.task.job_uid, "round": self.task.round,
                "node": self.task.node, "phase": phase, "seq": seq, "attempt": self._attempt_base + self.attempt,
                "started_at": self.started_at, **fields,
            }
        )


class SharedPull:
    """One PullImage call, the runs waiting on it, and its byte progress."""

    def __init__(self, key: tuple[str, str], call: PullCall) -> None:
        #: (pull reference, credential identity): runs with the same key share this call.
        self.key = key
        self.reference = key[0]
        self.call = call
        self.waiters: set[TaskRun] = set()
        self._tracker = ProgressTracker()
        self._layers: dict[str, int] | None = None
        self._lock = threading.Lock()
        #: Set once the manifest's layers are known, or known to be unknowable.
        self.layers_resolved = threading.Event()

    def set_layers(self, layers: Mapping[str, int] | None) -> None:
        """The layers of the resolved manifest, None when it could not be read (from another thread)."""
        with self._lock:
            if layers is not None:
                self._layers = dict(layers)
        self.layers_resolved.set()

    def _apply_layers(self) -> None:
        if self._layers is not None and not self._tracker.layers_known:
            self._tracker.expect(self._layers)

    def observe(self, ingests: Iterable[Ingest], *, exclusive: bool) -> Progress | None:
        """Progress after one sample of containerd's downloads (see `ProgressTracker.observe`)."""
        with self._lock:
            self._apply_layers()
            return self._tracker.observe(ingests, exclusive=exclusive)

    def finished(self) -> Progress | None:
        """Progress of the pull once it succeeded: all its layers are there."""
        with self._lock:
            self._apply_layers()
            return self._tracker.finished()


class PullCoordinator:
    """Starts, shares and cancels pulls under the node's cap (see the module docstring)."""

    def __init__(self, max_concurrent: int, clock: Clock) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self.clock = clock
        self._lock = threading.RLock()
        self._pulls: dict[tuple[str, str], SharedPull] = {}
        self._running = 0
        self._queue: deque[TaskRun] = deque()
        self._closed = False

    @property
    def in_flight(self) -> int:
        """PullImage calls running now."""
        with self._lock:
            return self._running

    @property
    def closed(self) -> bool:
        """True once `close()` was called: no pull starts any more."""
        return self._closed

    @property
    def waiting(self) -> int:
        """Runs queued for a slot."""
        with self._lock:
            return len(self._queue)

    def running(self) -> list[tuple[SharedPull, list[TaskRun]]]:
        """The pulls running now, each with the runs waiting on it."""
        with self._lock:
            return [(shared, list(shared.waiters)) for shared in self._pulls.values() if not shared.call.done()]

    def join(
        self,
        run: TaskRun,
        key: tuple[str, str],
        start: Callable[[], PullCall],
        *,
        not_after: float | None = None,
    ) -> SharedPull | None:
        """The running pull for `key`, joined, or a new one started by `start()` once a slot is free.

        Returns None when `run` is cancelled or the monotonic time `not_after` passes while it waits.
        """
        try:
            while True:
                run.wake.clear()
                with self._lock:
                    shared = self._join_or_start(run, key, start)
                    if shared is not None:
                        return shared
                    if run not in self._queue:
                        self._queue.append(run)
                if run.cancelled.is_set() or self._closed:
                    return None
                remaining = None if not_after is None else not_after - self.clock.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self.clock.wait(run.wake, 1.0 if remaining is None else min(remaining, 1.0))
        finally:
            with self._lock:
                if run in self._queue:
                    self._queue.remove(run)
                    self._wake_next()

    def _join_or_start(self, run: TaskRun, key: tuple[str, str], start: Callable[[], PullCall]) -> SharedPull | None:
        existing = self._pulls.get(key)
        if existing is not None and not existing.call.done():
            existing.waiters.add(run)
            run.shared = existing
            return existing
        if self._closed or self._running >= self.max_concurrent or (self._queue and self._queue[0] is not run):
            return None
        call = start()
        shared = SharedPull(key, call)
        shared.waiters.add(run)
        run.shared = shared
        self._pulls[key] = shared
        self._running += 1
        if run in self._queue:
            self._queue.remove(run)
        call.add_done_callback(lambda _call: self._finished(shared))
        return shared

    def _finished(self, shared: SharedPull) -> None:
        # Runs on a gRPC thread, or on the caller's thread when the call had already ended.
        with self._lock:
            self._running -= 1
            if self._pulls.get(shared.key) is shared:
                del self._pulls[shared.key]
            waiters = list(shared.waiters)
            self._wake_next()
        for run in waiters:
            run.wake.set()

    def _wake_next(self) -> None:
        if self._queue:
            self._queue[0].wake.set()

    def leave(self, shared: SharedPull, run: TaskRun) -> None:
        """`run` stops waiting on `shared`; the call is cancelled when nobody else waits on it."""
        with self._lock:
            shared.waiters.discard(run)
            if run.shared is shared:
                run.shared = None
            abandon = not shared.waiters and not shared.call.done()
        if abandon:
            shared.call.cancel()

    def close(self) -> None:
        """Start no more pulls (runs waiting for a slot give up); running ones are left alone."""
        with self._lock:
            self._closed = True
            queued = list(self._queue)
        for run in queued:
            run.wake.set()
