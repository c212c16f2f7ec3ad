"""A function of the template as the stack knows it, and the gate that keeps principals of this process apart.

Each function runs in execution environments of its own (`environments`: a process each, as Lambda's);
what runs in this process and signs from `os.environ` (agents in-process) goes through `InvocationGate`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    #: Its ReservedConcurrentExecutions: at most this many invocations at once.
    reserved_concurrency: int | None = None
    #: The file its handler was loaded from, once an environment has loaded it.
    handler_file: str | None = None
    invocations: int = 0
    errors: int = 0


def shown(path: Path) -> Path:
    """`path` as the template names it: relative to the project's files when it lies under them."""
    root = project_files().root
    return path.relative_to(root) if path.is_relative_to(root) else path


class InvocationGate:
    """Lets blocks of one principal overlap while keeping different principals apart (one `os.environ`).

    The first block of a principal to enter sets up its environment; the last to leave takes it down;
    then another principal may enter. A block entered from inside another (the same thread) enters at once.
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
