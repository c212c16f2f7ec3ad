"""EventBridge's `TestEventPattern`, which moto answers with nothing: whether an event pattern matches an
event, decided by the matcher the local event bus delivers with (`prewarm_devtools.sam.events`)."""

from __future__ import annotations

import json
from typing import Any

from moto.core.exceptions import ServiceException

from prewarm_devtools.sam.events import matches_pattern


class InvalidEventPatternError(ServiceException):
    """EventBridge's answer to a pattern it cannot read."""

    code = "InvalidEventPatternException"


def event_pattern_test(handler: Any) -> dict[str, Any] | ServiceException | None:
    """EventBridge's answer to TestEventPattern; None for any other request."""
    if getattr(handler, "service_name", "") != "events" or handler._get_action() != "TestEventPattern":
        return None
    try:
        pattern, event = json.loads(handler._get_param("EventPattern")), json.loads(handler._get_param("Event"))
    except (TypeError, json.JSONDecodeError) as e:
        return InvalidEventPatternError("InvalidEventPatternException", f"Event pattern is not valid: {e}")
    if not isinstance(pattern, dict) or not isinstance(event, dict):
        return InvalidEventPatternError("InvalidEventPatternException", "Event pattern is not valid: not an object")
    try:
        return {"Result": matches_pattern(pattern, event)}
    except (ValueError, TypeError) as e:
        return InvalidEventPatternError("InvalidEventPatternException", f"Event pattern is not valid: {e}")
