"""Event shapes and pattern matching as AWS delivers them to Lambda, for local mode's event sources."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any


def matches_pattern(pattern: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """EventBridge / Lambda filter pattern matching (exact values, prefix, exists, anything-but, numeric)."""
    for key, expected in pattern.items():
        present = isinstance(event, Mapping) and key in event
        actual = event.get(key) if isinstance(event, Mapping) else None
        if isinstance(expected, Mapping):
            if not present or not isinstance(actual, Mapping) or not matches_pattern(expected, actual):
                return False
            continue
        if not isinstance(expected, list):
            raise ValueError(f"pattern value for {key!r} must be a list or an object, got {expected!r}")
        values = actual if isinstance(actual, list) else [actual]
        if not any(_matches_one(rule, v, present) for rule in expected for v in values):
            return False
    return True


def _matches_one(rule: Any, value: Any, present: bool) -> bool:
    if not isinstance(rule, Mapping):
        return present and rule == value
    if "exists" in rule:
        return bool(rule["exists"]) == present
    if not present:
        return False
    if "prefix" in rule:
        return isinstance(value, str) and value.startswith(rule["prefix"])
    if "anything-but" in rule:
        excluded = rule["anything-but"]
        return value not in (excluded if isinstance(excluded, list) else [excluded])
    if "numeric" in rule:
        ops = rule["numeric"]
        checks = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__, "=": float.__eq__}
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return all(checks[op](number, float(arg)) for op, arg in zip(ops[::2], ops[1::2], strict=True))
    raise ValueError(f"pattern rule {rule!r} is not supported locally")


def sqs_event(messages: list[dict[str, Any]], queue_arn: str, region: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {
                    "ApproximateReceiveCount": m.get("Attributes", {}).get("ApproximateReceiveCount", "1"),
                    "SentTimestamp": m.get("Attributes", {}).get("SentTimestamp", str(int(time.time() * 1000))),
                    "SenderId": "local",
                    "ApproximateFirstReceiveTimestamp": str(int(time.time() * 1000)),
                },
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for m in messages
        ]
    }


def stream_event(records: list[dict[str, Any]], stream_arn: str, region: str) -> dict[str, Any]:
    out = []
    for r in records:
        dynamodb = dict(r["dynamodb"])
        created = dynamodb.get("ApproximateCreationDateTime")
        if created is not None and not isinstance(created, int | float):
            dynamodb["ApproximateCreationDateTime"] = created.timestamp()
        out.append(
            {
                "eventID": r.get("eventID", uuid.uuid4().hex),
                "eventName": r["eventName"],
                "eventVersion": r.get("eventVersion", "1.1"),
                "eventSource": "aws:dynamodb",
                "awsRegion": region,
                "dynamodb": dynamodb,
                "eventSourceARN": stream_arn,
            }
        )
    return {"Records": out}


def schedule_event(schedule_arn: str, region: str, account: str, payload: Any = None) -> dict[str, Any]:
    """What EventBridge Scheduler hands a Lambda target: the Input if one is set, else a small envelope."""
    if payload is not None:
        return payload if isinstance(payload, dict) else json.loads(payload)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": account,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": region,
        "resources": [schedule_arn],
        "detail": {},
    }


class LambdaContext:
    """The parts of the Lambda context object the handlers and Powertools read."""

    def __init__(self, function_name: str, region: str, account: str, memory_mb: int, timeout_s: int,
                 request_id: str | None = None) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account}:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))
