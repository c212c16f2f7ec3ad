"""One fake clock for every clock the code under test takes."""

from __future__ import annotations

import threading
from collections.abc import Callable

# 2026-01-01T00:00:00Z; ECR tokens live 12 hours.
T0 = 1_767_225_600.0
HOUR = 3600.0


class Clock:
    """Time that moves only when the test moves it (`advance`, or set `now`).

    Called, it reads the wall time as the credential refresher, the secret mirror and the token sources
    take it; with `tick`, every reading first moves it `tick` seconds, so that successive use cases
    see distinct, increasing times. `time()`, `monotonic()` and `wait()` are the agent's `Clock`: a wait
    that times out moves the clock by its timeout instead of sleeping, and every wait is recorded.

    >>> clock = Clock(100.0, tick=1)
    >>> clock(), clock()
    (101.0, 102.0)
    """

    def __init__(self, now: float = T0, *, tick: float = 0.0) -> None:
        self.now = now
        self.started = now
        self.tick = tick
        self.waits: list[tuple[threading.Event, float]] = []
        self.on_wait: Callable[[threading.Event, float], None] | None = None

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        """Seconds moved since the clock was made."""
        return self.now - self.started

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.waits.append((event, timeout))
        if self.on_wait is not None:
            self.on_wait(event, timeout)
        if not event.is_set():
            self.advance(max(0.0, timeout))
        return event.is_set()

    def waits_on(self, event: threading.Event) -> list[float]:
        return [timeout for waited, timeout in self.waits if waited is event]
