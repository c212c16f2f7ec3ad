"""The canonical events of `events/`, as AWS delivers them to the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prewarm_devtools.sam.template import ROOT

EVENTS = ROOT / "events"


def event_path(name: str) -> Path:
    return EVENTS / f"{name}.json"


def load_event(name: str) -> dict[str, Any]:
    """`load_event("ecr_push")`: the parsed `events/ecr_push.json`."""
    return json.loads(event_path(name).read_text())  # type: ignore[no-any-return]
