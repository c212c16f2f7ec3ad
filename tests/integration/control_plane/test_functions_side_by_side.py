"""Each event source polls on its own thread (tests/unit/devtools/test_event_source_threads.py), but two
different functions still take turns in local mode's one process (`InvocationGate`: one `os.environ`, one set
of cached clients), so a handler stuck in one function holds up every other function's invocations, where
AWS runs each function in environments of its own. Kept as a strict xfail until functions overlap."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.events import load_event

pytestmark = pytest.mark.integration


@pytest.mark.xfail(strict=True, reason="different functions take turns in local mode's one process")
def test_a_stuck_status_function_does_not_hold_up_the_push_function() -> None:
    stuck, release, pushed = threading.Event(), threading.Event(), threading.Event()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
        status, push = stack.function("record_status"), stack.function("on_image_push")
        for fn in (status, push):
            stack.invoke(fn.logical_id, {"Records": []} if fn is status else load_event("ecr_push_failed"))

        def stuck_handler(event: dict[str, Any], context: Any) -> Any:
            stuck.set()
            release.wait(30)
            return {"batchItemFailures": []}

        status.module.lambda_handler = stuck_handler
        push.module.lambda_handler = lambda event, context: pushed.set()
        stack.start(schedules=False, interval=0.05)
        try:
            stack.sqs.send_message(QueueUrl=stack.physical["StatusQueue"].ref, MessageBody="{}")
            assert stuck.wait(10)
            started = time.monotonic()
            stack.sqs.send_message(QueueUrl=stack.event_bus_url, MessageBody=json.dumps(load_event("ecr_push")))
            delivered = pushed.wait(5)
        finally:
            release.set()
            stack.stop()
        assert delivered and time.monotonic() - started < 5

