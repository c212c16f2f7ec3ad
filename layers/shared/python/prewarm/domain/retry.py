"""Trying again: the doubling back-off every retry in Prewarm uses, and the one loop that re-runs an
attempt refused by a conflict (a conditional write that lost a race, a resourceVersion gone stale).

The attempt re-reads what it decides on each time, so running it again is always safe; the caller
chooses which errors mean "decide again" and what is raised once the attempts are used up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


def doubling(initial: float, cap: float, steps: int) -> float:
    """`initial` doubled `steps` times, at most `cap`."""
    # Capping the exponent keeps huge step counts from overflowing a float.
    return min(initial * 2.0 ** min(steps, 64), cap)


@dataclass(frozen=True)
class Backoff:
    """The sleep after refusal `number` (1-based): `initial` doubling to `cap`; with `jitter`, a uniform
    draw below that, so writers refused together do not come back together."""

    initial: float
    cap: float
    jitter: bool = False
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, number: int) -> float:
        ceiling = doubling(self.initial, self.cap, number - 1)
        return self.rng.uniform(0, ceiling) if self.jitter else ceiling


def retry_on_conflict(
    attempt: Callable[[], T],
    *,
    conflict: type[Exception] | tuple[type[Exception], ...],
    attempts: int,
    exhausted: Callable[[], Exception] | None = None,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Runs `attempt` until it returns, at most `attempts` times while it raises `conflict`.

    Between refusals it sleeps as `backoff` says (no sleep without one). When the last attempt is refused
    too, `exhausted()` is raised from that refusal, or the refusal itself without `exhausted`.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except conflict as refused:
            if number == attempts:
                if exhausted is None:
                    raise
                raise exhausted() from refused
            if backoff is not None:
                sleep(backoff.delay(number))
    raise AssertionError("unreachable: the last attempt returns or raises")
