"""Capacity counted per DynamoDB key (table or index, and partition key value), and token buckets.

Every read and write the layer lets through is counted against the partition key value it lands on:
the base table's and each GSI's. `CapacityStats.hottest_key()` answers which key took the most
write units, how many writes, and at what rate; each key's `writers` says which base-table partition
keys its writes came from (an index key written for many items shows who shares it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`. `take` may overdraw: the debt refills first."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self._at = now

    def available(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
        self._at = now
        return self.tokens

    def can_take(self, amount: float, now: float) -> bool:
        return self.available(now) >= min(amount, self.burst)

    def take(self, amount: float, now: float) -> None:
        self.available(now)
        self.tokens -= amount


class CapacityKey(NamedTuple):
    """A partition: a table, the GSI (None for the base table), and the partition key value."""

    table: str
    index_name: str | None
    value: str

    def __str__(self) -> str:
        return f"{self.table}{'/' + self.index_name if self.index_name else ''}:{self.value}"


@dataclass
class KeyUsage:
    """What one partition key took: requests, capacity units and the busiest second."""

    key: CapacityKey
    writes: int = 0
    reads: int = 0
    wcu: float = 0.0
    rcu: float = 0.0
    throttles: int = 0
    first_at: float = math.inf
    last_at: float = -math.inf
    peak_wcu_per_s: float = 0.0
    writers: set[str] = field(default_factory=set)  # the base-table partition keys whose writes landed here
    _second: int = field(default=-1, repr=False)
    _second_wcu: float = field(default=0.0, repr=False)

    def wcu_per_s(self) -> float:
        """Average write units a second from this key's first to its last write (1 s at least)."""
        if self.writes == 0:
            return 0.0
        return self.wcu / max(1.0, self.last_at - self.first_at)

    def _touch(self, now: float) -> None:
        self.first_at = min(self.first_at, now)
        self.last_at = max(self.last_at, now)

    def _write(self, units: float, now: float, writer: str | None) -> None:
        self.writes += 1
        if writer is not None:
            self.writers.add(writer)
        self.wcu += units
        self._touch(now)
        second = int(now)
        if second != self._second:
            self._second, self._second_wcu = second, 0.0
        self._second_wcu += units
        self.peak_wcu_per_s = max(self.peak_wcu_per_s, self._second_wcu)


class CapacityStats:
    """Counts per key since the layer was enabled or `reset()`; thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[CapacityKey, KeyUsage] = {}
        self.throttles = 0
        self.transaction_conflicts = 0
        self.refusals: dict[str, int] = {}

    def reset(self) -> None:
        with self._lock:
            self._keys.clear()
            self.throttles = 0
            self.transaction_conflicts = 0
            self.refusals = {}

    def key(self, table: str, value: str, index_name: str | None = None) -> KeyUsage:
        """The usage of one partition key value (zeros if it was never touched)."""
        wanted = CapacityKey(table, index_name, value)
        with self._lock:
            return self._keys.get(wanted) or KeyUsage(wanted)

    def keys(self) -> list[KeyUsage]:
        with self._lock:
            return list(self._keys.values())

    def hottest_key(self, by: str = "wcu") -> KeyUsage | None:
        """The key with the most `wcu` (or `rcu`, `writes`, `reads`, `peak_wcu_per_s`); None before any."""
        with self._lock:
            if not self._keys:
                return None
            return max(self._keys.values(), key=lambda usage: getattr(usage, by))

    def record_write(self, key: CapacityKey, units: float, writer: str | None = None) -> None:
        """`units` written on `key` for an item of base-table partition key `writer`."""
        with self._lock:
            self._usage(key)._write(units, self._clock(), writer)

    def record_read(self, key: CapacityKey, units: float) -> None:
        with self._lock:
            usage = self._usage(key)
            usage.reads += 1
            usage.rcu += units
            usage._touch(self._clock())

    def record_refusal(self, code: str, key: CapacityKey | None = None) -> None:
        """An error the layer answered (`ProvisionedThroughputExceededException`, `TransactionConflict`, ...)."""
        with self._lock:
            self.refusals[code] = self.refusals.get(code, 0) + 1
            if code == "TransactionConflict":
                self.transaction_conflicts += 1
            elif key is not None:
                self.throttles += 1
                self._usage(key).throttles += 1

    def _usage(self, key: CapacityKey) -> KeyUsage:
        usage = self._keys.get(key)
        if usage is None:
            usage = self._keys[key] = KeyUsage(key)
        return usage
