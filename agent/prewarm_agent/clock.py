"""Time as the agent sees it, injectable so retry loops and caches are tested without sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for reports and deadlines, monotonic time for timeouts, and waits that can be woken."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait until `event` is set or `timeout` seconds pass; True when the event is set."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))
