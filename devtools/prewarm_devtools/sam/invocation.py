"""How a function of the template runs in this process: its module, its environment, its logs and stdout.

Every function shares this process, where each would have its own Lambda environment: `InvocationGate`
lets invocations of one function overlap and keeps different functions apart (one `os.environ`); what a
function's thread prints goes to the functions' output (`RoutedStdout`), and its logs and metrics are named
after its own service (`name_the_service`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, cast

from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import LocalIdentity
from prewarm_devtools.sam.template import TemplateError


class WiringError(TemplateError):
    """The template's wiring of a function is broken (caught before anything runs)."""


@dataclass
class Function:
    logical_id: str
    name: str
    code_dir: Path
    handler: str
    env: dict[str, str]
    timeout: int
    memory: int
    events: dict[str, dict[str, Any]]
    identity: LocalIdentity | None = None
    module: ModuleType | None = None
    invocations: int = 0
    errors: int = 0


def load_handler(fn: Function) -> ModuleType:
    module_file = fn.handler.rpartition(".")[0]
    path = fn.code_dir / f"{module_file}.py"
    spec = importlib.util.spec_from_file_location(f"prewarm_function_{fn.code_dir.name}", path)
    if spec is None or spec.loader is None:
        raise WiringError(f"{fn.logical_id}: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shown(path: Path) -> Path:
    """`path` as the template names it: relative to the project's files when it lies under them."""
    root = project_files().root
    return path.relative_to(root) if path.is_relative_to(root) else path


@contextlib.contextmanager
def logs_to(stream: TextIO) -> Iterator[None]:
    """Points the functions' log handler at this invocation's stdout, then back.

    Its StreamHandler kept the stdout of whatever imported `prewarm.observability` first.
    """
    import prewarm.observability as observability

    handlers = [h for h in observability.logger.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    before = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, before, strict=True):
            # A stack's routed stdout ends with that stack (its function log is closed): hand the handler
            # back the real stdout behind it, so no later stack flushes into a closed file.
            while isinstance(old, RoutedStdout):
                old = old.normal
            if old is not None:
                handler.setStream(old)


class _ServiceAsLoggerName(logging.Filter):
    """Names the functions' own Logger's records after this invocation's service. On AWS its logger is
    named after the one service of the process; here it keeps the name of the function loaded first."""

    service = ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = self.service or record.name
        return True


_OWN_LOGGER_NAME = _ServiceAsLoggerName()


def name_the_service(service: str) -> None:
    """Labels the functions' logs and metrics with this invocation's `POWERTOOLS_SERVICE_NAME`.

    Powertools reads the variable once, when `prewarm.observability` builds its Logger and Metrics. In
    AWS one process runs one function; here every function shares one process, so each invocation
    names its own service (its environment is already in force).
    """
    import prewarm.observability as observability

    observability.logger.service = service
    # What each handler's `inject_lambda_context(clear_state=True)` starts its invocation from.
    observability.logger._default_log_keys["service"] = service
    observability.logger.append_keys(service=service)
    _OWN_LOGGER_NAME.service = service
    own = observability.logger._logger  # the stdlib logger it writes through (Powertools proxies to it)
    if _OWN_LOGGER_NAME not in own.filters:
        own.addFilter(_OWN_LOGGER_NAME)
    provider = getattr(observability.metrics, "provider", None)
    if provider is not None and hasattr(provider, "service"):
        provider.service = service


invocation = threading.local()


class RoutedStdout:
    """This process's stdout while functions run: what a function's thread writes (its logs, its
    metrics) goes to the functions' output; what any other thread writes (the CLI, the demo's report,
    a benchmark) still reaches the real stdout, whenever it happens to print."""

    def __init__(self, normal: TextIO, functions: TextIO) -> None:
        self.normal, self.functions = normal, functions

    def _target(self) -> TextIO:
        return self.functions if getattr(invocation, "active", False) else self.normal

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.normal, name)

    @contextlib.contextmanager
    def in_place(self) -> Iterator[None]:
        """sys.stdout for the block; put back after it unless someone else (a CliRunner that began before the
        block and ended inside it) replaced it meanwhile: their restore stands, no stale stream comes back."""
        sys.stdout = cast(TextIO, self)
        try:
            yield
        finally:
            if cast(object, sys.stdout) is self:
                sys.stdout = self.normal


class InvocationGate:
    """Lets invocations of one function overlap while keeping different functions apart.

    The first invocation of a function to enter sets up its environment; the last to leave takes it
    down; then another function may enter. An invocation made from inside another (the same thread)
    enters at once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: str | None = None
        self._inside = 0
        self._setup: contextlib.AbstractContextManager[None] | None = None
        self._local = threading.local()

    @contextlib.contextmanager
    def enter(self, name: str, setup: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            self._local.depth += 1
            try:
                with setup():
                    yield
            finally:
                self._local.depth -= 1
            return
        with self._cond:
            while self._owner not in (None, name):
                self._cond.wait()
            self._owner = name
            self._inside += 1
            if self._setup is None:
                self._setup = setup()
                try:
                    self._setup.__enter__()
                except BaseException:
                    self._setup, self._owner, self._inside = None, None, 0
                    self._cond.notify_all()
                    raise
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cond:
                self._inside -= 1
                if self._inside == 0:
                    setup_done, self._setup, self._owner = self._setup, None, None
                    if setup_done is not None:
                        setup_done.__exit__(None, None, None)
                    self._cond.notify_all()
