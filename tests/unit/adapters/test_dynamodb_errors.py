"""DynamoDB's answers become the job store's error types: what may pass is retryable, a failed condition
is a conflict (re-read, decide again), anything else is an error naming the operation."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.job import JobRound
from prewarm.domain.status import NodeUpdate
from prewarm.services.ports import StoreConflictError, StoreError, StoreRetryableError

REF = JobRound("default/web", "uid-1", 0, 1)
NODE_UPDATE = NodeUpdate("node-a", 3, {"bytes_done": 10})


def store_answering(code: str, message: str = "", *, times: int = 1, then_ok: bool = False,
                    slept: list[float] | None = None) -> tuple[DynamoJobStore, Stubber]:
    client = boto3.client("dynamodb", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
    stubber = Stubber(client)
    for _ in range(times):
        stubber.add_client_error("update_item", service_error_code=code, service_message=message,
                                 http_status_code=400)
    if then_ok:
        stubber.add_response("update_item", {})
    stubber.activate()
    store = DynamoJobStore("jobs", client=client, sleep=(slept if slept is not None else []).append)
    return store, stubber


@pytest.mark.parametrize(("code", "error"), [
    ("ProvisionedThroughputExceededException", StoreRetryableError),
    ("ThrottlingException", StoreRetryableError),
    ("ConditionalCheckFailedException", StoreConflictError),
    ("ValidationException", StoreError),
])
def test_a_progress_write_refused_by_dynamodb_raises_the_stores_error(code: str, error: type[Exception]) -> None:
    store, stubber = store_answering(code, "refused")
    with pytest.raises(error) as raised:
        store.update_task(REF, NodeUpdate("node-a", 3, {"bytes_done": 10}))
    assert type(raised.value) is error
    assert "record node-a in default/web" in str(raised.value)
    stubber.assert_no_pending_responses()


def test_a_single_write_meeting_a_transaction_in_flight_is_tried_again_after_a_jittered_backoff() -> None:
    # Given DynamoDB refusing a progress write twice with TransactionConflictException (an in-flight
    # transaction holds the node item; botocore does not retry that code), then taking it
    slept: list[float] = []
    store, stubber = store_answering("TransactionConflictException", "Transaction is ongoing for the item", times=2,
                                     then_ok=True, slept=slept)
    # When the write is made
    store.update_task(REF, NODE_UPDATE)
    # Then it was tried three times, sleeping below 10 ms, then below 20 ms, between them
    stubber.assert_no_pending_responses()
    assert len(slept) == 2 and 0 <= slept[0] <= 0.01 and 0 <= slept[1] <= 0.02, slept


def test_a_single_write_refused_by_transactions_eight_times_raises_the_retryable_error() -> None:
    slept: list[float] = []
    store, stubber = store_answering("TransactionConflictException", "Transaction is ongoing for the item", times=8,
                                     slept=slept)
    with pytest.raises(StoreRetryableError, match="record node-a in default/web: TransactionConflictException"):
        store.update_task(REF, NODE_UPDATE)
    stubber.assert_no_pending_responses()
    assert len(slept) == 7 and max(slept) <= 0.5
