"""Each function's execution environments: processes of their own (`sam.runtime`), as Lambda runs each
function in environments of its own, one per invocation in flight.

An environment has its own `os.environ`, handler module, settings, clients and logger, so a handler stuck
in one function holds up no other function, no function sees another's keys or log keys, and two
concurrent invocations of one function never share a process. Each function has a pool: an invocation
takes a warm environment that is free, or starts one (a cold start), up to the function's
`ReservedConcurrentExecutions` when it has one (beyond, it waits, as Lambda's event source mappings wait
out a throttle); how many run at once is the event sources' to say (a queue's `MaximumConcurrency`
batches, one batch per stream shard). The stack as a whole keeps at most `ENVIRONMENT_LIMIT`
environments (the account's concurrency, scaled to one machine's memory): past it an idle environment of
another function is ended to make room, else the invocation waits for one to be free.

An invocation still running at the function's `Timeout` is killed with its environment, as Lambda's
"Task timed out after N seconds" (logged so in the function's output), and fails as
`Sandbox.Timedout`: each event source treats it as any other failure. An environment that ends (it
crashed, timed out, or its handler could not load) fails its invocation, and the next one starts
another. What the function prints reaches the stack's function output, each line whole, before its
invocation returns.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from prewarm_devtools.sam.invocation import Function

log = logging.getLogger(__name__)

RUNTIME = "prewarm_devtools.sam.runtime"

# Lambda's Init phase gets 10 s; past it, the init is retried within the first invocation, under its
# timeout ("Lambda execution environment lifecycle"): so an invocation's clock starts at the latest then.
INIT_LIMIT = 10.0
# Most environments of one stack at once (the account's concurrency, 1,000 by default on AWS, scaled to
# one machine). Each is a Python process that imported boto3, Powertools and the shared package, 65-90 MB
# RSS (docs/performance.md, "Local mode's execution environments"): 24 hold ~2 GB at most, under an
# eighth of a 24 GB machine shared by several stacks. `PREWARM_LOCAL_ENVIRONMENTS` sets another.
ENVIRONMENT_LIMIT = int(os.environ.get("PREWARM_LOCAL_ENVIRONMENTS", "24"))


class FunctionError(Exception):
    """An invocation failed: the handler raised (its type and message), it timed out, or its environment ended."""


class _NotTaken(FunctionError):
    """The environment had ended before the invocation reached it: another one takes it."""


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: str | None = None


class Environment:
    """One execution environment of a function: its process, serving one invocation at a time."""

    def __init__(self, fn: Function, environ: Mapping[str, str], spec: Mapping[str, Any], output: Output) -> None:
        self.fn, self._output = fn, output
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ready = threading.Event()
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
        request = str(uuid.uuid4())
        with self._lock:
            if self.ended is not None:
                raise _NotTaken(f"{self.fn.name}: {self.ended}")
            request_id = next(self._ids)
            self._pending[request_id] = pending
            try:
                self._send({"id": request_id, "request_id": request, "event": event})
            except OSError:
                del self._pending[request_id]
                self.ended = "its environment ended"
                raise _NotTaken(f"{self.fn.name}: its environment ended") from None
        self._ready.wait(INIT_LIMIT)
        if not pending.done.wait(self.fn.timeout):
            self._time_out(request)
        if pending.error is not None:
            raise FunctionError(f"{self.fn.name}: {pending.error}")
        return pending.result

    def loaded(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for its handler to load (or its environment to end)."""
        return self._ready.wait(timeout)

    def _time_out(self, request: str) -> None:
        """Past the function's timeout: its environment is killed and discarded, as Lambda's is."""
        with self._lock:
            if not self._pending:  # its answer came just now
                return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        self._output.write(f"{stamp} {request} Task timed out after {self.fn.timeout:.2f} seconds")
        self._end(f"Sandbox.Timedout: Task timed out after {self.fn.timeout:.2f} seconds")
        self.process.kill()

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
                self._ready.set()
            elif "failed" in frame:
                self._end(f"its handler did not load: {frame['failed']}")
        self._end(f"its environment ended (exit code {self.process.wait()})")

    def _end(self, why: str) -> None:
        with self._lock:
            self.ended = self.ended or why
            pending, self._pending = list(self._pending.values()), {}
        self._ready.set()
        for p in pending:
            p.error = why
            p.done.set()

    def retire(self) -> None:
        """No more invocations: the process exits once the one in flight returns."""
        with self._lock:
            self.ended = self.ended or "its environment was retired"
            with contextlib.suppress(OSError):
                self._stdin.close()

    def end(self, grace: float) -> None:
        """Retires it, gives its invocation `grace` seconds, then kills it; returns once it is gone."""
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
    """The stack's functions' environments: a pool per function, each environment started on demand."""

    def __init__(self, output: TextIO, limit: int = ENVIRONMENT_LIMIT) -> None:
        self._output, self._limit = Output(output), max(1, limit)
        self._started: list[Environment] = []  # every one not known to have ended, retired ones too
        self._idle: list[Environment] = []  # warm and free, the least recently used first
        self._busy: set[Environment] = set()  # each inside an invocation
        self._throttles: dict[str, threading.BoundedSemaphore] = {}
        self._cold_starts: dict[str, int] = {}
        self._cond = threading.Condition()

    def invoke(self, fn: Function, event: Any, environ: Callable[[], Mapping[str, str]],
               spec: Callable[[], Mapping[str, Any]]) -> Any:
        with self._throttled(fn):
            for attempt in (1, 2):
                environment = self._take(fn, environ, spec)
                try:
                    return environment.invoke(event)
                except _NotTaken:  # retired or ended meanwhile
                    if attempt == 2:
                        raise
                finally:
                    self._give_back(environment)
        raise AssertionError("unreachable")

    def warm(self, fn: Function, environ: Callable[[], Mapping[str, str]],
             spec: Callable[[], Mapping[str, Any]], count: int = 1, *, wait: bool = False) -> None:
        """Starts environments of the function now until it has `count` (as Lambda's provisioned
        concurrency), within the stack's limit; their handlers load meanwhile, or before it returns with
        `wait` (provisioned concurrency is ready once allocated)."""
        started = []
        with self._cond:
            have = sum(e.fn.logical_id == fn.logical_id for e in (*self._idle, *self._busy) if e.ended is None)
            for _ in range(count - have):
                if len(self._busy) + len(self._idle) >= self._limit:
                    break
                started.append(self._start(fn, environ, spec))
                self._idle.append(started[-1])
            self._cond.notify_all()
        if wait:
            for environment in started:
                environment.loaded(INIT_LIMIT)

    def cold_starts(self, fn: Function) -> int:
        """How many environments of the function were started so far (warmed ones too)."""
        with self._cond:
            return self._cold_starts.get(fn.logical_id, 0)

    def _start(self, fn: Function, environ: Callable[[], Mapping[str, str]],
               spec: Callable[[], Mapping[str, Any]]) -> Environment:
        environment = Environment(fn, environ(), spec(), self._output)
        self._started = [e for e in self._started if e.process.poll() is None] + [environment]
        self._cold_starts[fn.logical_id] = self._cold_starts.get(fn.logical_id, 0) + 1
        return environment

    @contextlib.contextmanager
    def _throttled(self, fn: Function) -> Iterator[None]:
        if fn.reserved_concurrency is None:
            yield
            return
        with self._cond:
            throttle = self._throttles.setdefault(fn.logical_id, threading.BoundedSemaphore(
                max(1, fn.reserved_concurrency)))
        with throttle:
            yield

    def _take(self, fn: Function, environ: Callable[[], Mapping[str, str]],
              spec: Callable[[], Mapping[str, Any]]) -> Environment:
        """A free warm environment of `fn`, or a new one once the stack has room for it."""
        with self._cond:
            while True:
                self._idle = [e for e in self._idle if e.ended is None and e.process.poll() is None]
                environment = next((e for e in reversed(self._idle) if e.fn.logical_id == fn.logical_id), None)
                if environment is not None:
                    self._idle.remove(environment)
                elif len(self._busy) + len(self._idle) >= self._limit and self._idle:
                    self._idle.pop(0).retire()  # the least recently used, another function's, makes room
                if environment is None and len(self._busy) + len(self._idle) < self._limit:
                    environment = self._start(fn, environ, spec)
                if environment is not None:
                    self._busy.add(environment)
                    return environment
                self._cond.wait()

    def _give_back(self, environment: Environment) -> None:
        with self._cond:
            self._busy.discard(environment)
            if environment.ended is None:
                self._idle.append(environment)
            self._cond.notify_all()

    def retire(self, fn: Function) -> None:
        """Its next invocation starts a new environment (new code or configuration); those in flight finish."""
        with self._cond:
            for environment in self._started:
                if environment.fn.logical_id == fn.logical_id:
                    environment.retire()
            self._idle = [e for e in self._idle if e.fn.logical_id != fn.logical_id]
            self._cond.notify_all()

    def processes(self, fn: Function | None = None) -> list[subprocess.Popen[str]]:
        """The processes of the environments (of `fn`, or all) started and not yet ended."""
        with self._cond:
            return [e.process for e in self._started
                    if (fn is None or e.fn.logical_id == fn.logical_id) and e.process.poll() is None]

    def end(self, grace: float = 5.0) -> None:
        """Ends every environment (see `Environment.end`); none is left running."""
        with self._cond:
            started, self._started, self._idle, self._busy = self._started, [], [], set()
        for environment in started:
            environment.end(grace)
