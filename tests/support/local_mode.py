"""A local stack (LocalMode) for a module of end-to-end tests, and driving it as its scheduler would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from prewarm_devtools.localmode import LocalMode


@contextmanager
def running_local_mode(tmp_path_factory: pytest.TempPathFactory, name: str, **options: Any) -> Iterator[LocalMode]:
    """`LocalMode(**options)` running, with a state file of its own (`PREWARM_LOCAL_STATE`, which the CLI
    reads) under a temporary directory named after `name`."""
    state = tmp_path_factory.mktemp(name) / "local.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREWARM_LOCAL_STATE", str(state))
        with LocalMode(**options) as mode:
            yield mode


def sync_until(local: LocalMode, condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Fires `sync_resources` (moto's schedules never fire) until `condition()` gives something, and returns
    it; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        local.fire("sync")
        if found := condition():
            return found
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.5)
