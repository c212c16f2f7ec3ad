"""JSON log lines with the node, job and image."""

from __future__ import annotations

import json
import logging

from prewarm_agent.logs import JsonFormatter, NodeLogger


def record(**extra: object) -> logging.LogRecord:
    item = logging.LogRecord("prewarm_agent.agent", logging.INFO, __file__, 1, "pulled %s", ("x",), None)
    for key, value in extra.items():
        setattr(item, key, value)
    return item


def test_a_record_is_one_json_object_with_its_context() -> None:
    line = JsonFormatter().format(record(node="n1", job="default/warm", image="busybox:1", round=3))

    entry = json.loads(line)
    assert entry["message"] == "pulled x"
    assert (entry["level"], entry["logger"]) == ("INFO", "prewarm_agent.agent")
    assert (entry["node"], entry["job"], entry["image"], entry["round"]) == ("n1", "default/warm", "busybox:1", 3)
    assert entry["time"].endswith("+00:00")


def test_exceptions_are_kept_in_the_object() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        item = record()
        item.exc_info = sys.exc_info()

    entry = json.loads(JsonFormatter().format(item))
    assert "ValueError: boom" in entry["exception"]


def test_the_node_logger_keeps_the_calls_own_fields() -> None:
    captured: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    base = logging.getLogger("prewarm_agent.test_logs")
    base.addHandler(Capture())
    base.setLevel(logging.INFO)

    NodeLogger(base, {"node": "n1"}).info("hello", extra={"job": "default/warm"})

    assert (captured[0].node, captured[0].job) == ("n1", "default/warm")  # type: ignore[attr-defined]
