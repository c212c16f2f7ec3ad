"""A function for tests of local mode's environments: it prints `say`, sleeps `sleep` seconds, then raises
when asked (`raise`), dies when asked (`exit`), answers what is not JSON when asked (`not_json`), or answers
its process id, its $GREETING and when it ran. Given an SQS batch, it does so for each message's body and
prints each answer as a line of JSON."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "Records" in event:
        for record in event["Records"]:
            print(json.dumps(lambda_handler(json.loads(record["body"]), context)))
        return {"batchItemFailures": []}
    if "say" in event:
        print(event["say"])
    began = time.time()
    time.sleep(float(event.get("sleep", 0)))
    if "raise" in event:
        raise ValueError(event["raise"])
    if event.get("exit"):
        os._exit(3)
    if event.get("not_json"):
        return {"answer": object()}
    return {"pid": os.getpid(), "greeting": os.environ.get("GREETING"),
            "remaining_ms": context.get_remaining_time_in_millis(), "ran": [began, time.time()]}
