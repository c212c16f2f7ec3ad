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


def store_answering(code: str, message: str = "") -> tuple[DynamoJobStore, Stubber]:
    client = boto3.client("dynamodb", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
    stubber = Stubber(client)
    stubber.add_client_error("update_item", service_error_code=code, service_message=message, http_status_code=400)
    stubber.activate()
    return DynamoJobStore("jobs", client=client), stubber


@pytest.mark.parametrize(("code", "error"), [
    # A single write on an item an in-flight transaction holds: DynamoDB refuses it until that commits
    ("TransactionConflictException", StoreRetryableError),
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
