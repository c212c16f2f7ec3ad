"""A function for tests of local mode's environments: it prints a line, notes it started (touches $STARTED),
then returns once $RELEASE exists (30 s at most), its answer a batch with no failures."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    print("printed by the function")
    Path(os.environ["STARTED"]).touch()
    deadline = time.monotonic() + 30
    while not Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"batchItemFailures": []}
