"""Local mode's functions as Lambda runs them: an invocation past the function's `Timeout` is killed with its
environment, the next one cold-starts in a new process, and the SQS event source treats it as a failure
(the batch comes back after its visibility timeout); two concurrent batches of one function run in two
environments (processes) at once. Before, the timeout was not enforced and one process served them all."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest

from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.local_functions import FUNCTIONS

pytestmark = pytest.mark.integration


def answers(output: io.StringIO) -> list[dict[str, Any]]:
    """What the echo function printed for each message it handled."""
    return [json.loads(line) for line in output.getvalue().splitlines() if line.startswith('{"pid"')]


def test_a_function_past_its_timeout_is_killed_and_its_sqs_batch_returns_after_the_visibility_timeout() -> None:
    output = io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=output).deploy()
        try:
            # Given the status function with a 1 s timeout, warm, and its queue's visibility timeout 5 s
            stack.update_function("record_status", code_dir=FUNCTIONS / "echo", handler="app.lambda_handler",
                                  timeout=1)
            queue = stack.physical["StatusQueue"].ref
            stack.sqs.set_queue_attributes(QueueUrl=queue, Attributes={"VisibilityTimeout": "5"})
            first = stack.invoke("record_status", {})["pid"]
            (process,) = stack.environments.processes(stack.function("record_status"))
            # When a message makes it sleep 10 s
            stack.sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"sleep": 10}))
            started = time.monotonic()
            assert stack.pump_sqs() == 1
            took = time.monotonic() - started
            # Then the invocation was killed at 1 s, with its process, as Lambda logs it
            assert 1 <= took < 5, took  # killed at 1 s, not after its 10 s sleep
            assert process.wait(5) is not None
            assert "Task timed out after 1.00 seconds" in output.getvalue()
            assert stack.function("record_status").errors == 1
            # and the next invocation cold-starts in a new process
            assert stack.invoke("record_status", {})["pid"] != first
            # and the message is invisible until its visibility timeout has passed, then back, received twice
            assert not stack.sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages")
            back = stack.sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=6, AttributeNames=["All"])["Messages"]
            assert time.monotonic() - started >= 4.9
            assert back[0]["Attributes"]["ApproximateReceiveCount"] == "2"
        finally:
            stack.stop()


def test_two_concurrent_sqs_batches_of_one_function_run_in_two_processes_at_once() -> None:
    output = io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url):
        # Given the status function's source: batches of 10, up to 10 at once (StatusConcurrency)
        stack = LocalStack(aws.url, parameters={"ClusterName": "local", "StatusBatchSize": "10"},
                           function_output=output).deploy()
        try:
            stack.update_function("record_status", code_dir=FUNCTIONS / "echo", handler="app.lambda_handler")
            queue = stack.physical["StatusQueue"].ref
            # When 20 messages are waiting, each taking 0.4 s
            for start in (0, 10):
                stack.sqs.send_message_batch(QueueUrl=queue, Entries=[
                    {"Id": str(i), "MessageBody": json.dumps({"sleep": 0.4})} for i in range(start, start + 10)])
            assert stack.pump_sqs() == 20
            # Then two batches ran at once, each in a process of its own
            by_pid: dict[int, list[list[float]]] = {}
            for answer in answers(output):
                by_pid.setdefault(answer["pid"], []).append(answer["ran"])
            assert len(by_pid) == 2 and all(len(ran) == 10 for ran in by_pid.values()), by_pid
            first, second = ([min(r[0] for r in ran), max(r[1] for r in ran)] for ran in by_pid.values())
            assert first[0] < second[1] and second[0] < first[1], by_pid  # their spans overlap
            assert len(stack.environments.processes(stack.function("record_status"))) == 2
        finally:
            stack.stop()
