"""Tests' hold on a local stack's functions, which run in processes of their own (`sam.environments`): what
a test puts in place of a function, or around it, is seen at the stack's invoke, as an event source calls it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prewarm_devtools.sam.stack import LocalStack
from tests.support.waiting import wait_until

Handler = Callable[[Any, Any], Any]
FUNCTIONS = Path(__file__).parent / "functions"


def invoking(stack: LocalStack, name: str) -> Handler:
    """Function `name` as a handler: `(event, context)` invokes it in its environment (the context unused),
    whatever `intercept` put in place."""
    return lambda event, _context: LocalStack.invoke(stack, name, event)


def intercept(stack: LocalStack, name: str, handler: Handler, monkeypatch: pytest.MonkeyPatch) -> None:
    """Has the stack call `handler(event, None)` for function `name`'s invocations, for the test
    (`invoking(stack, name)` inside it still reaches the function)."""
    fn = stack.function(name)

    def routed(target: str, event: Any) -> Any:
        return handler(event, None) if stack.function(target) is fn else LocalStack.invoke(stack, target, event)

    monkeypatch.setattr(stack, "invoke", routed)


@dataclass
class Waiting:
    """Function code that waits (tests/support/functions/waiting): it started once `started` exists, and
    returns once `release()` was called."""

    started: Path
    released: Path

    def wait_started(self, timeout: float = 10) -> None:
        wait_until(self.started.exists, timeout, "the waiting function started")

    def release(self) -> None:
        self.released.touch()


def make_wait(stack: LocalStack, name: str, tmp_path: Path) -> Waiting:
    """Deploys the waiting code as function `name` (as UpdateFunctionCode would), for its next invocations."""
    waiting = Waiting(tmp_path / f"{name}.started", tmp_path / f"{name}.released")
    stack.update_function(name, code_dir=FUNCTIONS / "waiting", handler="app.lambda_handler",
                          environment={"STARTED": str(waiting.started), "RELEASE": str(waiting.released)})
    return waiting
