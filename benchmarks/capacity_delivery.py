"""capacity.py's event source mapping in modeled time: a batch closes when full or when its window has
passed, runs on the first free slot of `MaximumConcurrency`, and comes back after the visibility timeout
when it outlasts the function's timeout (`deliver`)."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.capacity_calls import Invocation
from benchmarks.capacity_stack import FunctionConfig


@dataclass
class Delivery:
    """What the event source did with the messages: when each was stored, and each invocation."""

    stored_at: dict[int, float] = field(default_factory=dict)
    starts: list[float] = field(default_factory=list)  # each invocation's, in modeled time
    invocations: list[Invocation] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    trips: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    calls: int = 0
    dlq: int = 0
    returned: int = 0
    timed_out: int = 0


def deliver(visible: Sequence[float], run: Callable[[list[int]], tuple[Invocation, set[int]]],
            config: FunctionConfig, *, verbose: bool = False) -> Delivery:
    """Messages visible at `visible[i]` (sorted) through batches of the event source in modeled time."""
    from prewarm.domain.retry import redelivery_seconds

    out = Delivery()
    pending: list[tuple[float, int, int]] = [(t, i, 1) for i, t in enumerate(visible)]  # (visible, index, receive)
    heapq.heapify(pending)
    slots = [0.0] * config.concurrency
    started = time.perf_counter()
    while pending:
        free = heapq.heappop(slots)
        start = max(free, pending[0][0])
        # The poller gathers until the batch is full or its window has passed since it began.
        ready = sorted(m[0] for m in heapq.nsmallest(config.batch_size, pending))
        full_at = ready[-1] if len(ready) == config.batch_size else float("inf")
        close = max(start, min(full_at, start + config.window_s))
        batch = []
        while pending and pending[0][0] <= close and len(batch) < config.batch_size:
            batch.append(heapq.heappop(pending))
        inv, returned = run([i for _, i, _ in batch])
        seconds = inv.modeled_s(config.memory_mb)
        trips, _ = inv.sequential()
        out.starts.append(close)
        out.invocations.append(inv)
        out.durations.append(seconds)
        out.trips.append(trips)
        out.sizes.append(len(batch))
        out.calls += len(inv.calls)
        end = close + seconds
        timed_out = seconds > config.timeout_s
        if timed_out:
            out.timed_out += 1
            returned = set(range(len(batch)))
            end = close + config.timeout_s
        for n, (_, i, receives) in enumerate(batch):
            if n not in returned:
                out.stored_at.setdefault(i, end)
            elif receives >= config.max_receives:
                out.dlq += 1
            else:
                out.returned += 1
                # A timed-out batch's messages wait out the queue's visibility timeout; those a finished
                # batch hands back are hidden for record_status's own backoff (ChangeMessageVisibility).
                hidden = config.visibility_s if timed_out else redelivery_seconds(receives, cap=config.visibility_s)
                heapq.heappush(pending, ((close if timed_out else end) + hidden, i, receives + 1))
        heapq.heappush(slots, end)
        if verbose and len(out.durations) % 50 == 0:
            print(f"    {len(out.durations)} batches, modeled t={end:.1f}s, {len(pending)} pending, "
                  f"wall {time.perf_counter() - started:.0f}s", flush=True)
    return out
