"""How long a job has left, and what bounds it: its registry budget, its nodes' throughput, or node disk.

Pure: from the round's node items (their phases, byte progress and times), the job's `parallelism`, and
what its registry's budget leaves it (`BudgetShare`, from the budget's reservations). Two bounds are
worked out and the longer one names the bottleneck:

- **node throughput**: each node pulls at the median rate observed so far (bytes over time since its pull
  started); the nodes in flight finish their bytes left, then the waiting ones go `parallelism` at a time.
- **registry budget**: the waiting nodes' pulls start no faster than the budget allows (each pull takes
  `pull_seconds` of it, `2 + layers` requests at the budget's rate), after what every job has reserved
  ahead already (`backlog`); the last one then still pulls.

**node disk**: nodes whose agent's disk guard refused the image (their message says how many bytes it
needs and how many are free) fail there whatever the time; the estimate names them as what bounds it.

>>> t = [NodeTaskRecord("a", 0, NodePhase.PULLING, dispatched_at=0, started_at=0, updated_at=10,
...                      bytes_done=50, bytes_total=100), NodeTaskRecord("b", 0)]
>>> str(estimate(t, parallelism=1, now=10))
'30s left, bound by node throughput: 5 B/s a node, 100 B an image, 1 waiting for 1 slot'
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord

# What the agent's disk guard fails a node with when the image does not fit (prewarm_agent.disk).
_DISK_REFUSAL = re.compile(r"^disk guard: .*the image needs (?P<needs>\d+) bytes, (?P<free>\d+) are free")


class Bottleneck(StrEnum):
    REGISTRY_BUDGET = "registry budget"
    NODE_THROUGHPUT = "node throughput"
    NODE_DISK = "node disk"


@dataclass(frozen=True)
class BudgetShare:
    """What the job's registry budget leaves it: each pull takes `pull_seconds` of the budget (its
    `requests` at `requests_per_second`, or its bytes at the byte rate), and `backlog` seconds of the
    budget are reserved ahead already, by every job drawing on it."""

    pull_seconds: float
    backlog: float
    requests_per_second: float
    requests: int
    bytes_per_second: float | None = None
    size_bytes: int | None = None

    def cost(self) -> str:
        """What a pull costs of the budget, by whichever rate bounds it."""
        by_requests = self.requests / self.requests_per_second if self.requests_per_second > 0 else 0.0
        if self.bytes_per_second and self.size_bytes and self.size_bytes / self.bytes_per_second > by_requests:
            return f"{_bytes(self.size_bytes)} a pull at {_bytes(self.bytes_per_second)}/s"
        return f"{self.requests} requests a pull at {self.requests_per_second:g}/s"


@dataclass(frozen=True)
class Estimate:
    """Seconds left from `at` (None: nothing observed yet to tell) and what bounds them."""

    seconds: float | None
    bottleneck: Bottleneck | None
    detail: str
    at: float

    def __str__(self) -> str:
        if self.seconds is None:
            return f"unknown: {self.detail}"
        if self.bottleneck is None:
            return self.detail
        return f"{duration(self.seconds)} left, bound by {self.bottleneck}: {self.detail}"

    def to_item(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> Estimate:
        bottleneck = item.get("bottleneck")
        seconds = item.get("seconds")
        return cls(None if seconds is None else float(seconds), None if bottleneck is None else Bottleneck(bottleneck),
                   str(item.get("detail", "")), float(item.get("at", 0)))

    def summary(self) -> str:
        """`1m30s (registry budget)`."""
        return "unknown" if self.seconds is None else f"{duration(self.seconds)} ({self.bottleneck or 'none'})"

    def against(self, finished_at: float) -> str:
        """The estimate made at its start against how long the job took from then."""
        took = finished_at - self.at
        if self.seconds is None:
            return f"took {duration(took)}; no estimate was made"
        return f"estimated {self.summary()}, took {duration(took)}"


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `2h10m`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def node_rate(tasks: Sequence[NodeTaskRecord]) -> float | None:
    """The median bytes a second one node pulls, over the nodes that have pulled bytes; None when none has."""
    rates = []
    for t in tasks:
        end = t.finished_at if t.finished else t.updated_at
        if t.started_at is not None and end is not None and end > t.started_at and t.bytes_done:
            rates.append(t.bytes_done / (end - t.started_at))
    return statistics.median(rates) if rates else None


def _disk_refusals(tasks: Sequence[NodeTaskRecord]) -> str:
    refused = [(t.node, m) for t in tasks if t.phase is NodePhase.FAILED and (m := _DISK_REFUSAL.match(t.message))]
    if not refused:
        return ""
    node, match = min(refused)
    first = f"{node} has {_bytes(int(match['free']))} free for {_bytes(int(match['needs']))}"
    more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
    return f"{len(refused)} node{'s' if len(refused) > 1 else ''} cannot hold the image ({first}{more})"


def estimate(tasks: Sequence[NodeTaskRecord], *, parallelism: int, now: float,
             budget: BudgetShare | None = None, waiting: int | None = None) -> Estimate:
    """The time left for the round's node items `tasks` to finish, and what bounds it. `waiting`: how many
    nodes wait for a slot, when `tasks` holds only the nodes in flight (else counted from `tasks`)."""
    remaining = [t for t in tasks if not t.finished]
    disk = _disk_refusals(tasks)
    if waiting is None:
        waiting = sum(1 for t in remaining if t.dispatched_at is None)
    if not remaining and not waiting:
        return Estimate(0.0, Bottleneck.NODE_DISK if disk else None, disk or "nothing left to pull", now)
    if waiting and parallelism < 1:  # paused: the waiting nodes start only once parallelism is raised
        paused = f"parallelism 0: {waiting} node{'s' if waiting > 1 else ''} wait until it is raised"
        return Estimate(None, Bottleneck.NODE_DISK if disk else None, f"{disk}; {paused}" if disk else paused, now)
    size = max((t.bytes_total or 0 for t in tasks), default=0)
    rate = node_rate(tasks)
    bounds: list[tuple[float, Bottleneck, str]] = []
    pull = size / rate if rate and size else 0.0
    if rate and size:
        in_flight = max((max(0, (t.bytes_total or size) - (t.bytes_done or 0)) / rate
                         for t in remaining if t.dispatched_at is not None), default=0.0)
        slots = f"{parallelism} slot{'s' if parallelism > 1 else ''}"
        rounds = math.ceil(waiting / parallelism) if waiting else 0
        bounds.append((in_flight + rounds * pull, Bottleneck.NODE_THROUGHPUT,
                       f"{_bytes(rate)}/s a node, {_bytes(size)} an image, {waiting} waiting for {slots}"))
    if budget is not None and budget.pull_seconds > 0 and waiting:
        bounds.append((budget.backlog + waiting * budget.pull_seconds + pull, Bottleneck.REGISTRY_BUDGET,
                       f"{1 / budget.pull_seconds:.3g} pull starts/s ({budget.cost()}), {waiting} waiting, "
                       f"{duration(budget.backlog)} of it reserved ahead"))
    if not bounds:
        return Estimate(None, Bottleneck.NODE_DISK if disk else None,
                        disk or "no node has reported byte progress yet", now)
    seconds, bottleneck, detail = max(bounds, key=lambda b: b[0])
    if disk:
        return Estimate(seconds, Bottleneck.NODE_DISK, f"{disk}; the rest {detail}", now)
    return Estimate(seconds, bottleneck, detail, now)

