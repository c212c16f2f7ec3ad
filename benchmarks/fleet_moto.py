"""fleet.py's AWS: moto behind the limits layer, in a child process, on the simulated clock (`SimClock`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from typing import Any

from benchmarks.measure import BenchmarkError

ACCOUNT = "123456789012"
REGION = "us-west-2"

Json = dict[str, Any]


def _serve_moto(conn: Any, clock: Any) -> None:
    """The child: a moto server with the limits layer on `clock` (shared memory); answers `conn`."""
    from prewarm_devtools import aws_limits
    from prewarm_devtools.sam.aws import MotoServer

    layer = aws_limits.enable(clock=lambda: float(clock.value))
    with MotoServer(limits=True) as server:
        conn.send(server.url)
        while True:
            try:
                command, argument = conn.recv()
            except EOFError:
                return
            if command == "stop":
                return
            conn.send(_answer(layer, command, argument))


def _answer(layer: Any, command: str, argument: Any) -> Any:
    if command == "stats":
        s = layer.stats
        return {"keys": s.keys(), "throttles": s.throttles, "conflicts": s.transaction_conflicts,
                "refusals": dict(s.refusals)}
    if command == "reset":
        layer.stats.reset()
        return None
    if command == "busy":
        # What each agent's long poll would notice: the node queues holding a visible message.
        from moto.sqs.models import sqs_backends

        queues = sqs_backends[ACCOUNT][REGION].queues
        for _ in range(5):
            try:
                return [name for name, q in list(queues.items()) if name.startswith(argument) and q.messages]
            except RuntimeError:  # a queue was created meanwhile
                continue
        return []
    raise ValueError(f"unknown command {command!r}")


class SimClock:
    """Simulated seconds, shared with the moto child (the limits layer counts capacity by it)."""

    def __init__(self) -> None:
        self.shared = multiprocessing.get_context("fork").RawValue("d", 0.0)
        self.epoch = time.time()  # what agents write as started_at/finished_at for simulated second 0

    @property
    def now(self) -> float:
        return float(self.shared.value)

    def set(self, t: float) -> None:
        if t < self.shared.value:
            raise ValueError("the simulated clock never goes back")
        self.shared.value = t

    def epoch_of(self, t: float) -> float:
        return self.epoch + t


class LimitedMoto:
    """The moto child: `url`, capacity `stats()`, `reset()` of the counts, `busy(prefix)` node queues."""

    def __init__(self, clock: SimClock) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_moto, args=(child, clock.shared), daemon=True)
        self._lock = threading.Lock()
        self.url = ""

    def __enter__(self) -> LimitedMoto:
        self._process.start()
        if not self._conn.poll(120):
            raise BenchmarkError("the moto server did not start within 120 s")
        self.url = self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(("stop", None))
        self._process.join(timeout=15)
        if self._process.is_alive():
            self._process.kill()

    def _ask(self, command: str, argument: Any = None) -> Any:
        with self._lock:
            self._conn.send((command, argument))
            return self._conn.recv()

    def stats(self) -> Json:
        return self._ask("stats")  # type: ignore[no-any-return]

    def reset(self) -> None:
        self._ask("reset")

    def busy(self, prefix: str) -> list[str]:
        return self._ask("busy", prefix)  # type: ignore[no-any-return]
