"""Each function's execution environment: a process of its own (`sam.runtime`), as Lambda runs each function
in environments of its own.

A function's environment has its own `os.environ`, handler module, settings, clients and logger, so a
handler stuck in one function holds up no other function, and no function sees another's keys or log keys.
It starts on the function's first invocation (a cold start) or when warmed, then serves every invocation
of that function; those sent while others run overlap on its threads, up to the function's
`ReservedConcurrentExecutions` when it has one (beyond, an invocation waits, as Lambda's event source
mappings wait out a throttle). An environment that ends (it crashed, or its handler could not load) fails
its invocations in flight, and the next invocation starts another. What the function prints reaches the
stack's function output, each line whole, before its invocation returns.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from prewarm_devtools.sam.invocation import Function

log = logging.getLogger(__name__)

RUNTIME = "prewarm_devtools.sam.runtime"


class FunctionError(Exception):
    """An invocation failed: the handler raised (its type and message), or its environment ended."""


class _NotTaken(FunctionError):
    """The environment had ended before the invocation reached it: another one takes it."""


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: str | None = None


class Environment:
    """One function's environment process, and the invocations in flight in it."""

    def __init__(self, fn: Function, environ: Mapping[str, str], spec: Mapping[str, Any], output: Output) -> None:
        self.fn, self._output = fn, output
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.ended: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", RUNTIME], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(environ),
            text=True, encoding="utf-8", bufsize=1)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin, self._stdout = self.process.stdin, self.process.stdout
        self._send({"function": dict(spec)})
        self._reader = threading.Thread(target=self._read, name=f"environment-{fn.name}", daemon=True)
        self._reader.start()

    def invoke(self, event: Any) -> Any:
        pending = _Pending()
        try:
            json.dumps(event)
        except (TypeError, ValueError) as e:
            raise FunctionError(f"{self.fn.name}: its event is not JSON, as Lambda wants it: {e}") from e
        with self._lock:
            if self.ended is not None:
                raise _NotTaken(f"{self.fn.name}: {self.ended}")
            request_id = next(self._ids)
            self._pending[request_id] = pending
            try:
                self._send({"id": request_id, "event": event})
            except OSError:
                del self._pending[request_id]
                self.ended = "its environment ended"
                raise _NotTaken(f"{self.fn.name}: its environment ended") from None
        pending.done.wait()
        if pending.error is not None:
            raise FunctionError(f"{self.fn.name}: {pending.error}")
        return pending.result

    def _send(self, frame: Mapping[str, Any]) -> None:
        self._stdin.write(json.dumps(frame) + "\n")
        self._stdin.flush()

    def _read(self) -> None:
        for line in self._stdout:
            try:
                frame = json.loads(line)
            except ValueError:  # not a frame: kept as output
                frame = {"out": line.rstrip("\n")}
            if "out" in frame:
                self._output.write(frame["out"])
            elif "id" in frame:
                with self._lock:
                    pending = self._pending.pop(frame["id"], None)
                if pending is None:  # already failed: its environment was taken for ended
                    continue
                error = frame.get("error")
                pending.result, pending.error = frame.get("result"), error and f"{error['type']}: {error['message']}"
                pending.done.set()
            elif "ready" in frame:
                self.fn.handler_file = frame["ready"]
            elif "failed" in frame:
                self._end(f"its handler did not load: {frame['failed']}")
        self._end(f"its environment ended (exit code {self.process.wait()})")

    def _end(self, why: str) -> None:
        with self._lock:
            self.ended = self.ended or why
            pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            p.error = why
            p.done.set()

    def retire(self) -> None:
        """No more invocations: the process exits once those in flight return."""
        with self._lock:
            self.ended = self.ended or "its environment was retired"
            with contextlib.suppress(OSError):
                self._stdin.close()

    def end(self, grace: float) -> None:
        """Retires it, gives its invocations `grace` seconds, then kills it; returns once it is gone."""
        self.retire()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s still inside its handler: its environment is killed", self.fn.name)
            self.process.kill()
            self.process.wait()
        self._reader.join()


class Output:
    """Where the functions' lines go (their logs and metrics; CloudWatch Logs on AWS), a line at a time."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self._lock = stream, threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except ValueError:  # closed: the stack's output ended before the function's last line
                log.warning("function output closed; dropped: %s", line[:200])


class Environments:
    """The stack's functions' environments, one per function, each started on demand."""

    def __init__(self, output: TextIO) -> None:
        self._output = Output(output)
        self._running: dict[str, Environment] = {}
        self._started: list[Environment] = []  # every one not known to have ended, retired ones too
        self._throttles: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()

    def invoke(self, fn: Function, event: Any, environ: Callable[[], Mapping[str, str]],
               spec: Callable[[], Mapping[str, Any]]) -> Any:
        with self._throttled(fn):
            try:
                return self._environment(fn, environ, spec).invoke(event)
            except _NotTaken:  # retired or ended meanwhile
                return self._environment(fn, environ, spec).invoke(event)

    def warm(self, fn: Function, environ: Callable[[], Mapping[str, str]],
             spec: Callable[[], Mapping[str, Any]]) -> None:
        """Starts the function's environment now, if none runs (its handler loads meanwhile)."""
        self._environment(fn, environ, spec)

    @contextlib.contextmanager
    def _throttled(self, fn: Function) -> Iterator[None]:
        if fn.reserved_concurrency is None:
            yield
            return
        with self._lock:
            throttle = self._throttles.setdefault(fn.logical_id, threading.BoundedSemaphore(
                max(1, fn.reserved_concurrency)))
        with throttle:
            yield

    def _environment(self, fn: Function, environ: Callable[[], Mapping[str, str]],
                     spec: Callable[[], Mapping[str, Any]]) -> Environment:
        with self._lock:
            running = self._running.get(fn.logical_id)
            if running is None or running.ended is not None:
                running = self._running[fn.logical_id] = Environment(fn, environ(), spec(), self._output)
                self._started = [e for e in self._started if e.process.poll() is None] + [running]
            return running

    def retire(self, fn: Function) -> None:
        """Its next invocation starts a new environment (new code or configuration); those in flight finish."""
        with self._lock:
            running = self._running.pop(fn.logical_id, None)
        if running is not None:
            running.retire()

    def processes(self) -> list[subprocess.Popen[str]]:
        """The processes of the environments started and not yet ended."""
        with self._lock:
            return [e.process for e in self._started]

    def end(self, grace: float = 5.0) -> None:
        """Ends every environment (see `Environment.end`); none is left running."""
        with self._lock:
            started, self._started, self._running = self._started, [], {}
        for environment in started:
            environment.end(grace)
