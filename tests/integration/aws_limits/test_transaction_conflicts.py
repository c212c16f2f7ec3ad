"""DynamoDB's transaction conflicts in the limits layer: the window a transaction holds its items, and the
injected rate fault tests run with; then the job store meeting them (it tries a refused single write
again, as botocore does not)."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import ClientError

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.job import JobRound
from prewarm.domain.status import NodeUpdate
from prewarm_devtools.sam.template import create_table, load_template
from tests.integration.aws_limits.test_aws_limits import TABLE, Aws, aws, error, item, make_table, reasons

pytestmark = pytest.mark.integration

__all__ = ["aws"]  # the fixture, for pytest


def update(key: str, value: str) -> dict[str, object]:
    return {"TableName": TABLE, "Key": item(key), "UpdateExpression": "SET v = :v",
            "ExpressionAttributeValues": {":v": {"S": value}}}


class Gate:
    """Stands in for the limits layer's `time` module: a transaction holds its items until `open()`, not
    for a span of the wall clock a loaded machine may stretch or skip past."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self.monotonic = time.monotonic

    def sleep(self, seconds: float) -> None:
        assert self._open.wait(30), "the transaction was never let go"

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    from prewarm_devtools.aws_limits import dynamodb as layer_dynamodb

    gate = Gate()
    monkeypatch.setattr(layer_dynamodb, "time", gate)
    return gate


def hold_in_a_transaction(aws: Aws, key: str, item: dict[str, object] | None = None) -> threading.Thread:
    """A transaction on `key` (or `item`, a key) started on another thread; returns once the layer holds
    its item, which it holds until the gate opens."""
    update_args = update(key, "tx") if item is None else {
        "TableName": TABLE, "Key": item, "UpdateExpression": "SET v = :v",
        "ExpressionAttributeValues": {":v": {"S": "claimed"}}}
    held = threading.Thread(target=lambda: aws.client("dynamodb").transact_write_items(
        TransactItems=[{"Update": update_args}]))
    held.start()
    deadline = time.monotonic() + 30
    while not aws.layer.dynamodb._held:
        assert time.monotonic() < deadline and held.is_alive(), "the transaction never held its item"
        time.sleep(0.01)
    return held


def test_a_single_write_on_an_item_a_transaction_holds_is_refused_with_transaction_conflict(aws: Aws, gate: Gate
                                                                                            ) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job", v="0"))
    # Given a transaction in flight on the job item
    held = hold_in_a_transaction(aws, "job")
    # When single writes reach it: an update, a put, a delete, and an update of another item
    refused = []
    for call, args in (("update_item", update("job", "1")), ("put_item", {"TableName": TABLE, "Item": item("job")}),
                       ("delete_item", {"TableName": TABLE, "Key": item("job")})):
        with pytest.raises(ClientError) as e:
            getattr(dynamodb, call)(**args)
        refused.append(error(e))
    dynamodb.update_item(**update("other", "1"))
    gate.open()
    held.join()
    # Then each of the three is refused as DynamoDB refuses it, the other item is written, and once the
    # transaction committed the same update goes through
    assert refused == [("TransactionConflictException", "Transaction is ongoing for the item")] * 3
    assert aws.layer.stats.transaction_conflicts == 3
    dynamodb.update_item(**update("job", "2"))
    assert dynamodb.get_item(TableName=TABLE, Key=item("job"))["Item"]["v"] == {"S": "2"}


def test_a_transaction_on_an_item_another_transaction_holds_is_cancelled_with_transaction_conflict(
        aws: Aws, gate: Gate) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    # Given a transaction in flight on the job item
    held = hold_in_a_transaction(aws, "job")
    # When another transaction writes a free item and the job item
    with pytest.raises(ClientError) as e:
        dynamodb.transact_write_items(TransactItems=[
            {"Put": {"TableName": TABLE, "Item": item("other")}}, {"Update": update("job", "2")}])
    gate.open()
    held.join()
    # Then it is cancelled for the held item only, and writes nothing
    assert error(e)[0] == "TransactionCanceledException"
    assert reasons(e) == ["None", "TransactionConflict"]
    assert aws.layer.stats.transaction_conflicts == 1
    assert "Item" not in dynamodb.get_item(TableName=TABLE, Key=item("other"))
    # and once the first committed, the same transaction goes through: a caller that waits never conflicts
    dynamodb.transact_write_items(TransactItems=[{"Update": update("job", "3")}])
    assert dynamodb.get_item(TableName=TABLE, Key=item("job"))["Item"]["v"] == {"S": "3"}


def test_an_injected_rate_refuses_writes_on_items_transactions_write_and_no_others(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job", v="0"))
    # Given every write on an item a transaction writes refused (rate 1)
    aws.layer.dynamodb.inject_conflicts(1.0)
    # When a transaction writes the job item, then single writes reach it and an item no transaction writes
    with pytest.raises(ClientError) as cancelled:
        dynamodb.transact_write_items(TransactItems=[{"Update": update("job", "tx")}])
    with pytest.raises(ClientError) as single:
        dynamodb.update_item(**update("job", "1"))
    dynamodb.update_item(**update("node", "1"))
    # Then the transaction is cancelled for TransactionConflict and the single write refused with
    # TransactionConflictException; the other item is written
    assert error(cancelled)[0] == "TransactionCanceledException" and reasons(cancelled) == ["TransactionConflict"]
    assert error(single)[0] == "TransactionConflictException"
    assert aws.layer.stats.transaction_conflicts == 2
    # and with the rate back at 0 the job item is written again
    aws.layer.dynamodb.inject_conflicts(0)
    dynamodb.update_item(**update("job", "2"))


def test_injected_conflicts_fall_on_the_same_writes_of_a_run_repeated_on_a_fresh_table(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    aws.layer.dynamodb.inject_conflicts(0.5, seed=7)

    def run(table: str) -> list[bool]:
        dynamodb.create_table(**{**_table_args(), "TableName": table})
        outcomes = []
        for n in range(24):
            try:
                if n % 4 == 0:
                    dynamodb.transact_write_items(TransactItems=[{"Update": {**update("job", str(n)),
                                                                             "TableName": table}}])
                else:
                    dynamodb.update_item(**{**update("job", str(n)), "TableName": table})
                outcomes.append(True)
            except ClientError:
                outcomes.append(False)
        return outcomes

    first, second = run("first"), run("second")
    # Half refused, more or less, and the same ones each time
    assert first == second and 4 <= first.count(False) <= 20, first


def test_a_conflict_rate_outside_0_to_1_is_refused_naming_it(aws: Aws) -> None:
    with pytest.raises(ValueError, match=r"between 0 and 1, got 1\.5"):
        aws.layer.dynamodb.inject_conflicts(1.5)


def _table_args() -> dict[str, object]:
    return {"TableName": TABLE, "BillingMode": "PAY_PER_REQUEST",
            "AttributeDefinitions": [{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}


# --- the job store meeting them --------------------------------------------------------------------


# The transaction holds the job item until the table's backoff lets it go: the test proves the refused
# write is tried again and then written, not a race against the jittered waits.
def test_finish_job_meeting_a_transaction_in_flight_on_the_job_item_is_written_once_it_commits(aws: Aws, gate: Gate
                                                                                              ) -> None:
    dynamodb = aws.client("dynamodb")
    create_table(dynamodb, load_template(), TABLE)
    waits: list[float] = []

    def backoff(seconds: float) -> None:
        waits.append(seconds)
        gate.open()
        held.join()

    store = DynamoJobStore(TABLE, client=dynamodb, sleep=backoff)
    key = {"pk": {"S": "JOB#default/web"}, "sk": {"S": "JOB"}}
    dynamodb.put_item(TableName=TABLE, Item={**key, "state": {"S": "Running"}, "v": {"S": "0"}})
    # Given a claim's transaction in flight on the job item
    held = hold_in_a_transaction(aws, "", item=key)
    # When finish_job writes the job item meanwhile (before: StoreRetryableError, the batch failed)
    finished = store.finish_job("default/web", {"state": "Completed"}, require_done=False)
    held.join()
    # Then it was refused while the transaction held the item, and written after it committed
    assert finished is True and aws.layer.stats.transaction_conflicts >= 1 and len(waits) >= 1
    stored = dynamodb.get_item(TableName=TABLE, Key=key)["Item"]
    assert (stored["state"], stored["v"]) == ({"S": "Completed"}, {"S": "claimed"})


def test_a_progress_write_refused_by_injected_conflicts_is_tried_again_until_written(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    create_table(dynamodb, load_template(), TABLE)
    ref = JobRound("default/web", "uid-1", 0, 1)
    key = {"pk": {"S": "JOB#default/web#0"}, "sk": {"S": "NODE#n0"}}
    dynamodb.put_item(TableName=TABLE, Item={**key, "round": {"N": "0"}, "version": {"N": "1"},
                                             "phase": {"S": "Pulling"}})
    # Given a node item that transactions write, and half the writes on it refused as held by one
    aws.layer.dynamodb.inject_conflicts(0.5, seed=3)
    aws.layer.dynamodb._transacted.add((TABLE, _key_text(key)))
    store = DynamoJobStore(TABLE, client=dynamodb)
    # When ten progress writes follow one another
    for n in range(10):
        version = int(dynamodb.get_item(TableName=TABLE, Key=key)["Item"]["version"]["N"])
        store.update_task(ref, NodeUpdate("n0", version, {"bytes_done": n}))
    # Then every one was written, some after a refusal
    assert dynamodb.get_item(TableName=TABLE, Key=key)["Item"]["bytes_done"] == {"N": "9"}
    assert aws.layer.stats.transaction_conflicts >= 1


def _key_text(key: dict[str, dict[str, str]]) -> str:
    import json

    return json.dumps(key, sort_keys=True, default=str)
