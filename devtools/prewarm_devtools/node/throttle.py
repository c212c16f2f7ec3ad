"""A TCP proxy on 127.0.0.1 that limits download bandwidth and records every connection.

Put it in front of a registry to make pulls slow enough to watch progress, hit deadlines or cancel
mid-download, and to see from the registry's side when the puller hung up.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Self

from prewarm_devtools.node.process import LoopbackEndpoint

_CHUNK = 64 * 1024
_POLL = 0.05
# A peer that stops reading for this long is treated as gone.
_IO_TIMEOUT = 30.0


@dataclass
class ConnectionRecord:
    """One proxied connection. Times are ``time.monotonic()`` values; None means not yet."""

    id: int
    opened_at: float
    bytes_to_client: int = 0
    bytes_to_upstream: int = 0
    closed_by: str | None = None  # "client", "upstream" or "proxy"
    upstream_closed_at: float | None = None

    @property
    def open(self) -> bool:
        return self.upstream_closed_at is None


class ByteBucket:
    """Bytes-per-second budget shared by every connection of one proxy; rate None means unlimited."""

    def __init__(self, rate: int | None) -> None:
        self._lock = threading.Lock()
        self._rate = rate
        self._tokens = 0.0
        self._stamp = time.monotonic()

    def set_rate(self, rate: int | None) -> None:
        with self._lock:
            self._rate, self._tokens, self._stamp = rate, 0.0, time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        if self._rate is not None:
            # A burst of a tenth of a second keeps reads reasonably sized without overshooting.
            burst = max(self._rate / 10, 1024.0)
            self._tokens = min(burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def available(self) -> int:
        """Bytes that may be forwarded now."""
        with self._lock:
            if self._rate is None:
                return _CHUNK
            self._refill()
            return int(self._tokens)

    def spend(self, count: int) -> None:
        with self._lock:
            if self._rate is not None:
                self._refill()
                self._tokens -= count


def _forward(source: socket.socket, sink: socket.socket, limit: int, names: tuple[str, str]) -> int | str:
    """Move up to ``limit`` bytes; returns the count, or the name of the side that hung up."""
    try:
        data = source.recv(limit)
    except OSError:
        return names[0]
    if not data:
        return names[0]
    try:
        sink.sendall(data)
    except OSError:
        return names[1]
    return len(data)


class ThrottlingProxy(LoopbackEndpoint):
    """Forwards 127.0.0.1:<port> to ``upstream`` (host, port), at most ``bytes_per_second`` downstream.

    Only the upstream-to-client direction (the download) is limited. ``bytes_per_second=None`` lets
    data through at full speed; ``set_rate`` changes the limit while connections are open.
    """

    def __init__(self, upstream: tuple[str, int], bytes_per_second: int | None) -> None:
        self.upstream = upstream
        self._bucket = ByteBucket(bytes_per_second)
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._records: list[ConnectionRecord] = []
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count(1)
        self.port = 0

    def set_rate(self, bytes_per_second: int | None) -> None:
        """Change the download limit (None: unlimited)."""
        self._bucket.set_rate(bytes_per_second)

    def connections(self) -> list[ConnectionRecord]:
        """A snapshot of every connection so far, oldest first."""
        with self._lock:
            return [replace(record) for record in self._records]

    @property
    def open_connections(self) -> int:
        """Connections whose upstream side is still open."""
        return sum(1 for record in self.connections() if record.open)

    @property
    def bytes_to_client(self) -> int:
        """Bytes forwarded downstream over all connections."""
        return sum(record.bytes_to_client for record in self.connections())

    def wait_for(self, condition: Callable[[ThrottlingProxy], bool], timeout: float) -> bool:
        """Poll ``condition(self)`` until true or ``timeout`` seconds pass; returns its last value."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL / 2)
        return True

    def start(self) -> Self:
        """Listen on a free port of 127.0.0.1 and start accepting."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(_POLL)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, "throttle-accept")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and join the threads."""
        self._stopping.set()
        for thread in list(self._threads):
            thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = ConnectionRecord(id=next(self._ids), opened_at=time.monotonic())
            with self._lock:
                self._records.append(record)
            self._spawn(self._serve, f"throttle-conn-{record.id}", client, record)

    def _serve(self, client: socket.socket, record: ConnectionRecord) -> None:
        closed_by = "proxy"
        try:
            upstream = socket.create_connection(self.upstream, timeout=_IO_TIMEOUT)
        except OSError:
            client.close()
            with self._lock:
                record.closed_by, record.upstream_closed_at = "upstream", time.monotonic()
            return
        client.settimeout(_IO_TIMEOUT)
        try:
            closed_by = self._pump(client, upstream, record)
        finally:
            upstream.close()
            client.close()
            with self._lock:
                record.closed_by, record.upstream_closed_at = closed_by, time.monotonic()

    def _pump(self, client: socket.socket, upstream: socket.socket, record: ConnectionRecord) -> str:
        """Forward until one side hangs up or the proxy stops; returns who ended it."""
        while not self._stopping.is_set():
            allowance = self._bucket.available()
            watched = [client, upstream] if allowance > 0 else [client]
            readable, _, _ = select.select(watched, [], [], _POLL)
            if client in readable:
                ended = _forward(client, upstream, _CHUNK, ("client", "upstream"))
                if isinstance(ended, str):
                    return ended
                with self._lock:
                    record.bytes_to_upstream += ended
            if upstream in readable:
                ended = _forward(upstream, client, min(allowance, _CHUNK), ("upstream", "client"))
                if isinstance(ended, str):
                    return ended
                self._bucket.spend(ended)
                with self._lock:
                    record.bytes_to_client += ended
        return "proxy"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
