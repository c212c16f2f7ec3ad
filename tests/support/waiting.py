"""Waiting on real things (containerd, a proxy, an agent thread) without sleeping longer than needed."""

from __future__ import annotations

import time
from collections.abc import Callable

from prewarm_devtools.node.throttle import ConnectionRecord, ThrottlingProxy


def eventually(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """True as soon as `condition()` is; False when it is still false after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Returns as soon as `condition()` holds; fails the test naming `what` after `timeout` seconds."""
    assert eventually(lambda: bool(condition()), timeout), f"not within {timeout:g} s: {what}"


def busiest(proxy: ThrottlingProxy) -> ConnectionRecord:
    """The proxy's connection that carried the most bytes to the client: the layer download."""
    return max(proxy.connections(), key=lambda record: record.bytes_to_client)
