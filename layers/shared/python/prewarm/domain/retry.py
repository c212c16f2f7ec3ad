"""Trying again: the doubling back-off every retry in Prewarm uses, the one loop that re-runs an
attempt refused by a conflict (a conditional write that lost a race, a resourceVersion gone stale), and
when a message a batch hands back to its queue is delivered again (`redelivery_seconds`).

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


# The status queue's VisibilityTimeout (template.yaml: 6 x record_status' 30 s timeout, as Lambda asks
# of SQS event sources); a test keeps the two equal.
STATUS_QUEUE_VISIBILITY_SECONDS = 180


@dataclass(frozen=True)
class Delivery:
    """One message as SQS delivered it in a batch: its id, the receipt handle that changes its visibility,
    and how many times it was received (`ApproximateReceiveCount`, 1 the first time)."""

    message_id: str
    receipt_handle: str
    receive_count: int = 1


def redelivery_seconds(receive_count: int, *, poison: bool = False,
                       cap: int = STATUS_QUEUE_VISIBILITY_SECONDS) -> int:
    """How long a message its batch hands back (`batchItemFailures`) stays hidden before SQS delivers it
    again, given how many times it was received: 2 s after the first receive, four times longer after
    each one since (2, 8, 32, 128 s), never longer than the queue's own `cap`.

    Left to the queue, every returned message waits its visibility timeout (180 s), though what returns
    it (another writer's transaction, throttling that outlasted the retries, a warm-up ahead of its
    hello) mostly passes within seconds; growing by four keeps about 6 minutes between the first receive
    and the DLQ (maxReceiveCount 5). A `poison` message (it does not parse) will not parse later: it is
    back at once, so it reaches the DLQ, and its alarm, after its five receives in seconds.

    >>> [redelivery_seconds(n) for n in range(1, 7)]
    [2, 8, 32, 128, 180, 180]
    """
    if receive_count < 1:
        raise ValueError(f"receive_count must be >= 1, got {receive_count}")
    if poison:
        return 0
    return int(min(doubling(2.0, float(cap), 2 * (receive_count - 1)), cap))
