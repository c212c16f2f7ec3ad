"""Each function runs in execution environments of its own (`sam.environments`: a process each, as Lambda's),
so a handler stuck in one function holds up no other function's invocations. Before, the functions took
turns in local mode's one process (one `os.environ`, one set of cached clients)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.events import load_event
from tests.support.local_functions import intercept, invoking, make_wait

pytestmark = pytest.mark.integration


def test_a_stuck_status_function_does_not_hold_up_the_push_function(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pushed = threading.Event()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
        # Given a status function stuck in its handler, and the real push function (warm)
        stuck = make_wait(stack, "record_status", tmp_path)
        stack.invoke("on_image_push", load_event("ecr_push_failed"))
        push = invoking(stack, "on_image_push")
        intercept(stack, "on_image_push", lambda event, context: (push(event, context), pushed.set())[0],
                  monkeypatch)
        stack.start(schedules=False, interval=0.05)
        try:
            stack.sqs.send_message(QueueUrl=stack.physical["StatusQueue"].ref, MessageBody="{}")
            stuck.wait_started()
            # When a push arrives while it is stuck
            started = time.monotonic()
            stack.sqs.send_message(QueueUrl=stack.event_bus_url, MessageBody=json.dumps(load_event("ecr_push")))
            # The status function stays stuck until `release` below (or its own 30 s), so a push that waited
            # on it would not arrive within 25 s: the wait is generous for a loaded machine, not a latency bound.
            delivered = pushed.wait(25)
            took = time.monotonic() - started
        finally:
            stuck.release()
            stack.stop()
    # Then the push function handled it while the status function was stuck, in a process of its own
    assert delivered, f"no push handled within {took:.1f} s while the status function was stuck"
    assert stack.function("on_image_push").handler_file == str(stack.function("on_image_push").code_dir / "app.py")


def test_each_function_has_its_own_process_and_stopping_the_stack_ends_them_all() -> None:
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
        stack.fire("sweep")
        stack.fire("repull_daily")
        processes = stack.environments.processes()
        pids = {p.pid for p in processes}
        assert len(pids) == 2 and os.getpid() not in pids
        stack.stop()
    assert all(p.poll() is not None for p in processes)
    assert not stack.environments.processes()


def test_a_handler_error_is_the_invocations_and_the_next_invocation_still_runs() -> None:
    from prewarm_devtools.sam.environments import FunctionError

    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
        try:
            # Given the push function, sent an event it cannot parse
            with pytest.raises(FunctionError, match="on_image_push: "):
                stack.invoke("on_image_push", {"detail-type": "ECR Image Action", "detail": "not an object"})
            # Then the next invocation runs in the same environment
            answer: Any = stack.invoke("on_image_push", load_event("ecr_push_failed"))
            assert answer is not None
            assert stack.function("on_image_push").errors == 1
        finally:
            stack.stop()
