"""Bounded calls to clusters' APIs, for the paths that must not wait on a cluster: the status function.

A bounded `KubeCluster` makes one try per call (no connect retries), with short connect and read
timeouts, within a deadline per invocation; and it does not call a cluster whose API just failed: each
cluster's circuit breaker (the rule: `prewarm.domain.clusters.ClusterCircuit`; the state: here, per API
host, kept for the process) fails such a call at once, without the network, until the circuit's time is up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prewarm.domain.clusters import ClusterCircuit
from prewarm.services.ports import ClusterAuthError, ClusterConfigError, ClusterError, ClusterUnavailableError

# (connect, read) seconds of one status-path call: a GET of one Node or one node's pods answers in
# milliseconds on a healthy API server; one that takes seconds is treated as down.
STATUS_REQUEST_TIMEOUT = (2.0, 5.0)
# Of an invocation of the status function (30 s), at most this long goes to calls to clusters.
STATUS_CALL_SECONDS = 15.0
# And never the last seconds of an invocation: its writes and the batch's answer need them.
STATUS_RESERVE_SECONDS = 10.0
# A plan (the table stream's) lists a cluster's nodes, pods and the agent DaemonSet: pages of 500 nodes
# answer within a second or two; one plan's calls get a minute at most.
PLAN_REQUEST_TIMEOUT = (2.0, 15.0)
PLAN_CALL_SECONDS = 60.0


class InvocationDeadline:
    """Until when the calls of one invocation may run; `begin` starts an invocation's. One deadline serves the
    threads of an invocation (the status path's clusters, a stream batch's plans side by side): a plan that
    begins renews it for the plans already running, whose every request still has its own timeouts."""

    def __init__(self, most: float = STATUS_CALL_SECONDS, reserve: float = STATUS_RESERVE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._most, self._reserve, self._clock = most, reserve, clock
        self._until: float | None = None

    def begin(self, time_left: Callable[[], float] | None = None) -> None:
        """An invocation starts: `time_left()` is the seconds it has (Lambda's remaining time), None: no
        limit but `most`."""
        seconds = self._most if time_left is None else min(self._most, time_left() - self._reserve)
        self._until = self._clock() + max(0.0, seconds)

    def left(self) -> float | None:
        """Seconds left for calls; None before any invocation began."""
        return None if self._until is None else self._until - self._clock()


class CircuitBreakers:
    """Each cluster API's circuit (by host), thread-safe: the status function's calls run side by side."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._circuits: dict[str, ClusterCircuit] = {}
        self._lock = threading.Lock()

    def before(self, host: str, *, probe: bool = False) -> str | None:
        """None when a call to `host` may go now (a trial after an open spell counts as going), else why not.
        `probe`: a probe's call, at the circuit's first pace (`ClusterCircuit.allows_probe`)."""
        now = self._clock()
        with self._lock:
            circuit = self._circuits.get(host, ClusterCircuit())
            if circuit.allows(now):
                self._circuits[host] = circuit.trial(now)
                return None
            if probe and circuit.allows_probe(now):
                self._circuits[host] = circuit.probe_trial(now)
                return None
            return circuit.skipped(now)

    def answered(self, host: str) -> None:
        with self._lock:
            self._circuits.pop(host, None)

    def failed(self, host: str, error: ClusterError) -> None:
        """Opens the circuit when `error` says the API cannot serve us now (unreachable, throttled, a 5xx,
        access refused, TLS refused); any other answer is an answer."""
        if not isinstance(error, ClusterUnavailableError | ClusterAuthError | ClusterConfigError):
            self.answered(host)
            return
        retry_after = error.retry_after if isinstance(error, ClusterUnavailableError) else None
        with self._lock:
            circuit = self._circuits.get(host, ClusterCircuit())
            self._circuits[host] = circuit.failed(self._clock(), error.message, retry_after)

    def circuit(self, host: str) -> ClusterCircuit:
        with self._lock:
            return self._circuits.get(host, ClusterCircuit())


@dataclass(frozen=True)
class BoundedCalls:
    """What a bounded client is given: its timeouts, the invocation's deadline and the circuits (both shared
    by every cluster's client of the process)."""

    timeout: tuple[float, float] = STATUS_REQUEST_TIMEOUT
    deadline: InvocationDeadline = field(default_factory=InvocationDeadline)
    breakers: CircuitBreakers = field(default_factory=CircuitBreakers)
    # Calls that ask whether a parked job's cluster is back (a probe, a parked job's plan again): through an
    # open circuit at its first pace, not its doubled one.
    probe: bool = False

    def before(self, host: str, who: str, what: str) -> tuple[float, float]:
        """The timeouts of a call to `host` now; `ClusterUnavailableError` when its circuit is open or the
        invocation has no time left for it. `who` names the cluster, `what` the call."""
        left = self.deadline.left()
        if left is not None and left <= 0:
            raise ClusterUnavailableError(f"{who} not called: this invocation's time for cluster calls is up "
                                          f"({what} not sent)")
        if (why := self.breakers.before(host, probe=self.probe)) is not None:
            raise ClusterUnavailableError(why)
        if left is None:
            return self.timeout
        return (min(self.timeout[0], left), min(self.timeout[1], left))
