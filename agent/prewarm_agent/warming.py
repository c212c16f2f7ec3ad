"""The startup taint on the agent's side: hold it until the node's required images are present, then
remove it from the node; remove it anyway at the warm deadline, and say what was missing and why.

The control plane's `RequiredImages` says what the node must have (docs/agent.md, "Startup taint").
It may come before or after the pulls finish, and a later one replaces it, so the check runs when a
list arrives, when a pull ends, and every `CHECK_INTERVAL_SECONDS` besides, asking containerd
(`ImageStatus`) each time rather than trusting what the agent remembers: an image that was already
on the node, or that the kubelet pulled, counts too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prewarm.domain.messages import RequiredImages
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.warming import StartupTaint, missing_summary, node_event
from prewarm_agent.clock import Clock
from prewarm_agent.cri.errors import CriError
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.node import KubeApiAccess, NodeReadError, create_event, patch_node, read_node

log = logging.getLogger(__name__)

# The fallback check between wake-ups (a list or a finished pull wakes the check at once).
CHECK_INTERVAL_SECONDS = 5.0
# Removing the taint again after the API refused: from 1 s, doubling to this.
RETRY_MAX_SECONDS = 30.0
NO_LIST = "the control plane sent no list of required images (is record_status running?)"
EVENT_REASON = "PrewarmWarmTimeout"


class _NodeChanged(Exception):
    """The Node changed between the read and the taint's removal: read it again."""


class NodeWrites(Protocol):
    """The agent's reads and writes of its own Node (`KubeNodeWrites`)."""

    def read(self) -> dict[str, Any]: ...
    def patch(self, ops: list[dict[str, Any]]) -> dict[str, Any]: ...
    def event(self, body: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class KubeNodeWrites:
    """`NodeWrites` over the Kubernetes API, with the pod's service account."""

    name: str
    access: KubeApiAccess

    def read(self) -> dict[str, Any]:
        return read_node(self.name, self.access)

    def patch(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return patch_node(self.name, self.access, ops)

    def event(self, body: dict[str, Any]) -> None:
        create_event(self.access, body)


class ImagePresence(Protocol):
    def image_status(self, image: str) -> Any: ...


@dataclass(frozen=True)
class Released:
    """How the hold ended: `warm` (every image present) or `timeout`, and what was missing then."""

    outcome: Literal["warm", "timeout"]
    seconds: float  # from the node's join to the taint's removal
    missing: Mapping[str, str]
    at: float = 0.0  # epoch seconds of the removal


class StartupTaintHold:
    """Holds the startup taint of one node until its required images are present or `until` passes.

    `why(image)` tells why a missing image is missing (the agent knows its pulls). `run(stop)` checks
    until the taint is removed or `stop` is set.
    """

    def __init__(
        self,
        *,
        node: str,
        taint: StartupTaint,
        joined_at: float,
        until: float,
        images: ImagePresence,
        api: NodeWrites,
        clock: Clock,
        metrics: AgentMetrics,
        why: Callable[[str], str],
        logger: logging.LoggerAdapter[logging.Logger] | logging.Logger = log,
    ) -> None:
        self.node, self.taint, self.joined_at, self.until = node, taint, joined_at, until
        self.images, self.api, self.clock, self.metrics, self.why = images, api, clock, metrics, why
        self.log = logger
        self._lock = threading.Lock()
        self._required: RequiredImages | None = None
        self._wake = threading.Event()
        self.released: Released | None = None
        self.done = threading.Event()
        # One removal: the deadline check and an early release (`release_now`) may meet.
        self._releasing = threading.Lock()

    @property
    def required(self) -> RequiredImages | None:
        with self._lock:
            return self._required

    def offer(self, required: RequiredImages) -> bool:
        """Takes a list unless a newer one is held (SQS does not keep order); True when taken."""
        with self._lock:
            if self._required is not None and required.as_of < self._required.as_of:
                return False
            self._required = required
        self._wake.set()
        return True

    def poke(self) -> None:
        """Check now: a pull ended."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        delay = 1.0
        while not stop.is_set() and not self.done.is_set():
            self._wake.clear()
            try:
                self.check()
                delay = 1.0
                pause = min(CHECK_INTERVAL_SECONDS, max(0.0, self.until - self.clock.time()))
            except NodeReadError as e:
                self.log.error("cannot remove the startup taint %s yet, trying again in %.0f s: %s", self.taint,
                               delay, e)
                pause, delay = delay, min(delay * 2, RETRY_MAX_SECONDS)
            if self.done.is_set():
                return
            # Woken by a list, a finished pull or the stop; the stop event is checked by the loop.
            self._wait(stop, pause)

    def _wait(self, stop: threading.Event, seconds: float) -> None:
        ends = self.clock.monotonic() + seconds
        while not stop.is_set() and not self._wake.is_set():
            left = ends - self.clock.monotonic()
            if left <= 0:
                return
            self.clock.wait(self._wake, min(left, 0.5))

    def check(self) -> Released | None:
        """Removes the taint when every required image is present, or when the deadline has passed."""
        required = self.required
        now = self.clock.time()
        missing: dict[str, str] = {}
        if required is None:
            if now < self.until:
                return None
        else:
            missing = self._missing(required)
            if missing and now < self.until:
                return None
        outcome: Literal["warm", "timeout"] = "warm" if required is not None and not missing else "timeout"
        with self._releasing:
            if self.done.is_set():
                return self.released
            removed = self._remove()
            released = Released(outcome, max(0.0, now - self.joined_at), missing, at=now)
            self.released = released
            self.done.set()
        self.metrics.startup_taint_removals.labels(outcome).inc()
        self.metrics.startup_taint_seconds.set(released.seconds)
        if outcome == "warm":
            count = len(required.images) if required is not None else 0
            self.log.info("node warm after %.1f s (%d required images present): startup taint %s %s",
                          released.seconds, count, self.taint, "removed" if removed else "was already gone")
            return released
        what = missing_summary(missing) if required is not None else NO_LIST
        self.log.warning("node not warm after %.0f s (MAX_WARM_SECONDS): startup taint %s %s anyway; missing: %s",
                         released.seconds, self.taint, "removed" if removed else "was already gone", what)
        self._event(released, what)
        return released

    def release_now(self, why: str) -> Released | None:
        """Removes the taint before the deadline: the agent cannot do its work on this node (it cannot
        reach or may not use its queue), and holding the node would only keep pods off it. None when
        the taint had come off already."""
        now = self.clock.time()
        with self._releasing:
            if self.done.is_set():
                return None
            removed = self._remove()
            released = Released("timeout", max(0.0, now - self.joined_at), {}, at=now)
            self.released = released
            self.done.set()
        self._wake.set()
        self.metrics.startup_taint_removals.labels("timeout").inc()
        self.metrics.startup_taint_seconds.set(released.seconds)
        self.log.warning("startup taint %s %s after %.0f s: %s", self.taint,
                         "removed" if removed else "was already gone", released.seconds, why)
        self._event(released, why, early=True)
        return released

    def _missing(self, required: RequiredImages) -> dict[str, str]:
        missing: dict[str, str] = {}
        for entry in required.images:
            if entry.image in missing:
                continue
            try:
                present = self.images.image_status(entry.image) is not None
            except CriError as e:
                missing[entry.image] = f"containerd did not answer: {e}"
                continue
            if not present:
                missing[entry.image] = self.why(entry.image)
        return missing

    def _remove(self) -> bool:
        """Removes the taint; False when it was gone already. A Node changed meanwhile is read again."""
        return retry_on_conflict(
            self._remove_once, conflict=_NodeChanged, attempts=5,
            exhausted=lambda: NodeReadError("the Node kept changing while its startup taint was being removed"),
        )

    def _remove_once(self) -> bool:
        ops = self.taint.removal_patch(self.api.read())
        if ops is None:
            return False
        try:
            self.api.patch(ops)
        except NodeReadError as e:
            if e.status == 422:  # the patch's test of the taint list failed: the Node changed
                raise _NodeChanged from e
            raise
        return True

    def _event(self, released: Released, what: str, *, early: bool = False) -> None:
        message = (f"startup taint {self.taint} removed after {released.seconds:.0f}s, before maxWarmSeconds, "
                   f"so pods can schedule: {what}" if early else
                   f"startup taint {self.taint} removed after {released.seconds:.0f}s (maxWarmSeconds) "
                   f"with images missing: {what}")
        body = node_event(self.node, reason=EVENT_REASON, message=message, component="prewarm-agent",
                          at=self.clock.time())
        try:
            self.api.event(body)
        except NodeReadError as e:
            # The taint is off and the log line says the same: an Event refused is not worth holding anything.
            self.log.warning("the Event about the startup taint was not recorded: %s", e)
