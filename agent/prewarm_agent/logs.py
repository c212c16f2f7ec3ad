"""JSON log lines (stdlib logging), one object per line with the node, job and image when known."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

# Record attributes passed through `extra=` that belong in the JSON object.
CONTEXT_FIELDS = ("node", "job", "job_uid", "round", "image", "attempt", "message_id", "queue_url")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, context fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class NodeLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds the agent's node to every record, keeping the call's own `extra` fields."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def configure_logging(level: str) -> None:
    """Send every log record to stderr as JSON at `level` (boto and gRPC at WARNING)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
