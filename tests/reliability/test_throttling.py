"""Throttling on DynamoDB and SQS, answered before moto sees the request (a botocore `before-send` hook).

The adapters' clients are the ones they build in Lambda (standard retry mode, 8 retries), so
botocore's own retries run for real, with their backoff set to zero. What botocore absorbs must
leave no trace; what it gives up on must reach the use case as a retryable error, so the event
source delivers the input again, and the redelivery must end where an unthrottled run ends.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.retries.standard import ExponentialBackoff

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.services.ports import StoreRetryableError
from tests.reliability.invariants import invariant_problems
from tests.reliability.scenarios import KEY, SCENARIOS, differences
from tests.reliability.simulation import REGION, Driver, Plane, moto_aws
from tests.support.manifests import job_doc

MAX_ATTEMPTS = 9  # the adapters' botocore config: retries={"max_attempts": 8} counts retries after the first
DYNAMODB_ERROR = "com.amazonaws.dynamodb.v20120810#"


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data

    def read(self, *_: Any, **__: Any) -> bytes:
        return self.data


class Throttle:
    """Fails chosen calls of one operation: the first `attempts` attempts of call `only_call` (or of every
    call). Counts the calls, so a run without failures tells how many there are."""

    def __init__(self, client: Any, operation: str, error: dict[str, Any], *, attempts: int = 0,
                 only_call: int | None = None) -> None:
        self.error, self.attempts, self.only_call = error, attempts, only_call
        self.calls = 0
        self.failed = 0
        self._numbers: dict[str, int] = {}
        self._lock = threading.Lock()
        self.service = client.meta.service_model.service_name
        client.meta.events.register(f"before-send.{client.meta.service_model.service_id.hyphenize()}.{operation}",
                                    self)

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        retries = request.context["retries"]
        with self._lock:
            if retries["invocation-id"] not in self._numbers:
                self.calls += 1
                self._numbers[retries["invocation-id"]] = self.calls
            number = self._numbers[retries["invocation-id"]]
            if retries["attempt"] > self.attempts or self.only_call not in (None, number):
                return None
            self.failed += 1
        code = self.error["__type"].rpartition("#")[2]
        headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-ErrorType": code,
                   "x-amzn-query-error": f"{code};Sender"}
        response = AWSResponse(request.url, 400, headers, _Body(json.dumps(self.error).encode()))
        # botocore runs every before-send handler and keeps the first answer: steer moto's (which runs
        # after this more specific one) away from the request, or the throttled call would still happen.
        request.url = "https://throttled.invalid/"
        return response


def throughput_exceeded() -> dict[str, Any]:
    return {"__type": DYNAMODB_ERROR + "ProvisionedThroughputExceededException",
            "message": "The level of configured provisioned throughput for the table was exceeded."}


def transaction_cancelled(reason: str) -> dict[str, Any]:
    return {"__type": DYNAMODB_ERROR + "TransactionCanceledException",
            "Message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [None, "
                       f"{reason}]",
            "CancellationReasons": [{"Code": "None"}, {"Code": reason, "Message": "Throughput exceeds the limit"}]}


REQUEST_THROTTLED = {"__type": "com.amazonaws.sqs#RequestThrottled", "message": "Request is throttled."}


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # botocore sleeps up to 2**attempt seconds between throttled attempts; the count is what is tested.
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    for name, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)


def adapter_plane(ddb: Any, sqs: Any, run: str) -> Plane:
    """A plane whose store and queues use the clients the adapters build for Lambda."""
    return Plane(ddb, sqs, run, store_client=DynamoJobStore("unused").client,
                 sqs_client=NodeQueues("unused", "https://sqs/123456789012/unused").client)


def play(ddb: Any, sqs: Any, run: str, throttles: list[tuple[str, str, dict[str, Any], dict[str, Any]]],
         retry_on: tuple[type[Exception], ...] = ()) -> tuple[dict[str, Any], list[str], Driver, list[Throttle]]:
    """Runs the always-job scenario with `throttles` (service, operation, error, options) in place."""
    plane = adapter_plane(ddb, sqs, run)
    clients = {"dynamodb": plane.real_store.client, "sqs": plane.real_queues.client}
    installed = [Throttle(clients[service], op, error, **options) for service, op, error, options in throttles]
    try:
        driver = Driver(plane, retry_on=retry_on)
        SCENARIOS["always_job_with_a_failing_node"](driver)
        return driver.outcome(KEY), invariant_problems(plane.real_store, KEY), driver, installed
    finally:
        plane.close()


def test_throttling_within_the_retry_budget_is_absorbed_without_a_trace() -> None:
    with moto_aws() as (ddb, sqs):
        # Given the end state of an unthrottled run
        expected, _, _, _ = play(ddb, sqs, "base", [])
        # When every DynamoDB and SQS call the control plane makes is throttled once (more than once a
        # call drains botocore's retry quota, which then lets throttling through: the next tests)
        once = {"attempts": 1}
        throttles = [("dynamodb", op, throughput_exceeded(), once)
                     for op in ("GetItem", "PutItem", "UpdateItem", "Query", "BatchWriteItem", "TransactWriteItems")]
        throttles += [("sqs", op, REQUEST_THROTTLED, once) for op in ("SendMessage", "CreateQueue")]
        got, problems, driver, installed = play(ddb, sqs, "throttled", throttles)
    # Then botocore retried them all: nothing failed, nothing was redelivered, the end state is the same
    assert all(t.failed == t.calls > 0 for t in installed), [(t.service, t.calls, t.failed) for t in installed]
    assert driver.redeliveries == 0 and not problems
    assert differences(expected, got) == []


@pytest.mark.parametrize("operation", ["TransactWriteItems", "UpdateItem", "BatchWriteItem"])
def test_throttling_past_the_retry_budget_is_a_retryable_error_and_the_redelivery_converges(operation: str) -> None:
    with moto_aws() as (ddb, sqs):
        # Given the end state of an unthrottled run, and how many calls of the operation it makes
        expected, _, _, (counter,) = play(ddb, sqs, "base", [("dynamodb", operation, throughput_exceeded(), {})])
        failures = {}
        for n in range(1, counter.calls + 1):
            # When call n stays throttled through all of botocore's attempts
            options = {"attempts": MAX_ATTEMPTS, "only_call": n}
            got, problems, driver, (throttle,) = play(
                ddb, sqs, f"{operation}-{n}", [("dynamodb", operation, throughput_exceeded(), options)],
                retry_on=(StoreRetryableError,))
            assert throttle.failed == MAX_ATTEMPTS
            # Then the use case failed with StoreRetryableError and its redelivery converged, or (a report
            # batch backs off and tries again by itself) it converged without a redelivery
            if found := problems + differences(expected, got) + (
                    [] if driver.redelivered in ([], ["StoreRetryableError"])
                    else [f"redelivered: {driver.redelivered}"]):
                failures[n] = found
    assert counter.calls >= 1
    assert not failures, failures


# Every transaction for one reason; the first three (two reports and a claim) for the other.
@pytest.mark.parametrize(("reason", "first"), [("ThrottlingError", None), ("TransactionConflict", 3)])
def test_a_transaction_cancelled_for_throttling_or_conflict_is_redelivered_and_converges(
    reason: str, first: int | None
) -> None:
    # botocore does not retry TransactionCanceledException: the store must call it retryable itself.
    with moto_aws() as (ddb, sqs):
        expected, _, _, (counter,) = play(ddb, sqs, "base", [("dynamodb", "TransactWriteItems",
                                                               transaction_cancelled(reason), {})])
        failures = {}
        for n in range(1, min(counter.calls, first or counter.calls) + 1):
            # When transaction n (a report, a claim) is cancelled for the reason
            options = {"attempts": 1, "only_call": n}
            got, problems, driver, _ = play(
                ddb, sqs, f"{reason}-{n}", [("dynamodb", "TransactWriteItems", transaction_cancelled(reason), options)],
                retry_on=(StoreRetryableError,))
            # Then it reaches the event source as StoreRetryableError and the redelivery converges, or a
            # report batch, which backs off and tries again by itself, converges without one
            if found := problems + differences(expected, got) + (
                    [] if driver.redelivered in ([], ["StoreRetryableError"])
                    else [f"redelivered: {driver.redelivered}"]):
                failures[n] = found
    assert counter.calls >= 4
    assert not failures, failures


def test_task_sends_throttled_past_the_retry_budget_are_sent_again() -> None:
    with moto_aws() as (ddb, sqs):
        expected, _, _, (counter,) = play(ddb, sqs, "base", [("sqs", "SendMessage", REQUEST_THROTTLED, {})])
        failures = {}
        for n in range(1, counter.calls + 1):
            # When send n (a planned task or one handed a freed slot) stays throttled through every attempt
            options = {"attempts": MAX_ATTEMPTS, "only_call": n}
            got, problems, driver, _ = play(ddb, sqs, f"send-{n}", [("sqs", "SendMessage", REQUEST_THROTTLED, options)])
            # Then the stream retries the plan, or the sweep re-sends the claimed task: the job ends the same
            if found := problems + differences(expected, got):
                failures[n] = found
            elif not (driver.redelivered or driver.sweeps):
                failures[n] = ["the failed send was neither retried nor re-sent"]
    assert counter.calls >= 4
    assert not failures, failures


ACCESS_DENIED = {"__type": "com.amazonaws.sqs#AccessDenied", "message": "Access to the resource is denied."}


def test_a_task_send_refused_for_good_is_logged_naming_the_node_and_the_error(caplog: pytest.LogCaptureFixture) -> None:
    with moto_aws() as (ddb, sqs):
        # Given a planned job with one of its two nodes waiting for the slot the other holds
        plane = adapter_plane(ddb, sqs, "denied")
        plane.add_nodes("n0", "n1")
        driver = Driver(plane)
        driver.apply(job_doc(parallelism=1))
        (task,) = driver.agents.take()
        # When the node queues start refusing sends (a policy gone wrong) and the first node finishes
        Throttle(plane.real_queues.client, "SendMessage", ACCESS_DENIED, attempts=MAX_ATTEMPTS)
        caplog.set_level(logging.WARNING, logger="prewarm")
        for report in driver.agents.reports(task):
            driver.report(report)
    # Then the slot went to the other node, and the send that failed says so, naming the node and why
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "n1" in r.getMessage()]
    assert refused and "AccessDenied" in refused[0], [r.getMessage() for r in caplog.records]
