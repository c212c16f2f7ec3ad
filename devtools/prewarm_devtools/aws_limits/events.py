"""EventBridge's `TestEventPattern`, which moto answers with nothing: whether an event pattern matches an
event, decided by moto's own matcher, the one its event buses deliver with."""

from __future__ import annotations

import json
from typing import Any

from moto.core.exceptions import ServiceException


class InvalidEventPatternError(ServiceException):
    """EventBridge's answer to a pattern, or an event, it cannot read."""


def event_pattern_test(handler: Any) -> dict[str, Any] | ServiceException | None:
    """EventBridge's answer to TestEventPattern; None for any other request."""
    from moto.events.exceptions import InvalidEventPatternException
    from moto.events.models import EventPattern

    if getattr(handler, "service_name", "") != "events" or handler._get_action() != "TestEventPattern":
        return None
    try:
        pattern = EventPattern.load(handler._get_param("EventPattern"))
        event = json.loads(handler._get_param("Event") or "")
    except InvalidEventPatternException as e:
        return InvalidEventPatternError("InvalidEventPatternException", e.message)
    except (TypeError, json.JSONDecodeError) as e:
        return InvalidEventPatternError("InvalidEventPatternException", f"Event is not valid JSON: {e}")
    return {"Result": isinstance(event, dict) and pattern.matches_event(event)}  # type: ignore[arg-type]
