"""The limits layer's moto patches change how moto computes its answers, never what they are: the same
attributes (counts of visible, in-flight and delayed messages) and the same retention rule as moto's
own code, on one queue in every state; and the fixes of moto's races: deletes against sends on a queue,
reads against writes on a table."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm_devtools import aws_limits
from prewarm_devtools.aws_limits import patches
from tests.support.aws import Answers

pytestmark = pytest.mark.integration


def original(owner: Any, name: str) -> Any:
    """moto's own code the layer replaced."""
    found = [value for patched_owner, patched_name, value in patches._originals
             if patched_owner is owner and patched_name == name]
    assert found, f"{owner.__name__}.{name} is not patched"
    return found[0]


def create_table(ddb: Any, name: str, index: str, index_keys: tuple[str, ...], projection: str, **extra: Any) -> None:
    """A table keyed `pk`/`sk` with one index on `index_keys` (hash, then range), every key a string."""
    def schema(keys: tuple[str, ...]) -> list[dict[str, str]]:
        return [{"AttributeName": k, "KeyType": t} for k, t in zip(keys, ("HASH", "RANGE"), strict=False)]

    attributes = dict.fromkeys(("pk", "sk", *index_keys))  # in order, once each
    ddb.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST", KeySchema=schema(("pk", "sk")),
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in attributes],
        GlobalSecondaryIndexes=[{"IndexName": index, "KeySchema": schema(index_keys),
                                 "Projection": {"ProjectionType": projection}}],
        **extra,
    )


@pytest.fixture
def queue() -> Iterator[Any]:
    """A queue with 7 visible messages, 3 in flight, 2 delayed and one past its retention period."""
    if aws_limits.active() is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off)")
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-west-2")
        url = sqs.create_queue(QueueName="patched", Attributes={"MessageRetentionPeriod": "600"})["QueueUrl"]
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)])
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"d{i}", "DelaySeconds": 300}
                                                      for i in range(2)])
        assert len(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=300)["Messages"]) == 3
        from moto.sqs.models import sqs_backends

        backend = sqs_backends["123456789012"]["us-west-2"]
        yield backend, backend.get_queue("patched")


def test_the_attributes_are_moto_s_own(queue: Any) -> None:
    from moto.sqs.models import Queue

    _, q = queue
    patched = q.attributes

    assert patched == original(Queue, "attributes").fget(q)
    assert (patched["ApproximateNumberOfMessages"], patched["ApproximateNumberOfMessagesNotVisible"],
            patched["ApproximateNumberOfMessagesDelayed"]) == (7, 3, 2)


def test_the_retention_rule_is_moto_s_own(queue: Any) -> None:
    from moto.sqs.models import SQSBackend

    backend, q = queue
    kept = q._messages[0]
    expired = q._messages[1]
    expired.sent_timestamp -= 601_000  # sent 601 s before: past the 600 s retention

    moto_rule = original(SQSBackend, "is_message_valid_based_on_retention_period")
    for message in (kept, expired):
        assert backend.is_message_valid_based_on_retention_period("patched", message) == \
            moto_rule(backend, "patched", message)
    assert backend.is_message_valid_based_on_retention_period("patched", kept) is True
    assert backend.is_message_valid_based_on_retention_period("patched", expired) is False


def test_moto_s_module_list_is_read_once_and_is_the_same_list() -> None:
    # moto's server lists its package directory on every request, under the lock every request shares.
    import moto.backends as moto_backends

    if aws_limits.active() is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off)")
    listed = moto_backends.list_of_moto_modules()

    assert list(listed) == list(original(moto_backends, "list_of_moto_modules")())
    assert "sqs" in listed and "dynamodb" in listed
    assert moto_backends.list_of_moto_modules() is listed


def test_deletes_and_sends_at_once_lose_nothing_and_bring_nothing_back(queue: Any) -> None:
    # moto rebuilt the message list on each delete without the lock sends take: concurrent deletes
    # put deleted messages back (to reappear after their visibility timeout) and lost sends.
    import sys
    import threading

    backend, q = queue
    with q._messages_lock:
        q._messages.clear()
    for i in range(3000):
        backend.send_message("patched", f"old {i}")
    received = backend.receive_message("patched", 10 ** 6, wait_seconds_timeout=0, visibility_timeout=300)
    handles = [m.receipt_handle for m in received]
    assert len(handles) == 3000

    def delete(part: list[str]) -> None:
        for handle in part:
            backend.delete_message("patched", handle)

    def send(start: int) -> None:
        for i in range(start, start + 300):
            backend.send_message("patched", f"new {i}")

    threads = [threading.Thread(target=delete, args=(handles[i::8],)) for i in range(8)]
    threads += [threading.Thread(target=send, args=(start,)) for start in (0, 300)]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: the race shows at once
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)

    left = [m.body for m in q._messages]
    assert len(left) == 600 and all(body.startswith("new ") for body in left), (len(left), left[:3])


def test_a_query_never_sees_an_item_half_updated() -> None:
    # moto read an index's items while another thread removed their key: the query raised KeyError
    # (a 500 to the client). DynamoDB reads each item whole; the layer runs reads under the writes' lock.
    import sys
    import threading

    if aws_limits.active() is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off)")
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-west-2")
        create_table(ddb, "race", "waiting", ("wpk", "sk"), "KEYS_ONLY")
        for i in range(300):
            ddb.put_item(TableName="race", Item={"pk": {"S": "J"}, "sk": {"S": f"N{i:04d}"}, "wpk": {"S": "W"}})
        errors: list[str] = []

        def claim() -> None:
            for i in range(300):
                ddb.update_item(TableName="race", Key={"pk": {"S": "J"}, "sk": {"S": f"N{i:04d}"}},
                                UpdateExpression="REMOVE wpk")

        def list_waiting() -> None:
            for _ in range(150):
                try:
                    ddb.query(TableName="race", IndexName="waiting", KeyConditionExpression="wpk = :w",
                              ExpressionAttributeValues={":w": {"S": "W"}})
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    errors.append(repr(e))

        previous = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often: the race showed within a few queries
        try:
            threads = [threading.Thread(target=claim)] + [threading.Thread(target=list_waiting) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            sys.setswitchinterval(previous)
        assert errors == []


def test_reads_answer_exactly_what_moto_s_serializer_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    if aws_limits.active() is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off)")
    from moto.core.responses import ActionResult
    from moto.dynamodb.responses import DynamoResult

    # Given every read answered both ways, the fast answer checked against moto's serializer
    # (DynamoResult inherits ActionResult's; the layer gives it its own)
    assert original(DynamoResult, "execute_result") is patches._INHERITED
    fast, serialized = DynamoResult.execute_result, ActionResult.execute_result
    compared: list[str] = []

    def both(result: Any, context: Any) -> Any:
        got, want = fast(result, context), serialized(result, context)
        assert got[:2] == want[:2]
        assert json.loads(got[2]) == json.loads(want[2]), context.operation_model.name
        compared.append(context.operation_model.name)
        return got

    monkeypatch.setattr(DynamoResult, "execute_result", both)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-west-2")
        create_table(ddb, "reads", "by_g", ("g",), "ALL",
                     StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"})
        # ... holding every attribute type
        for i in range(5):
            ddb.put_item(TableName="reads", Item={
                "pk": {"S": "p"}, "sk": {"S": f"s{i}"}, "g": {"S": "x"}, "n": {"N": f"{i}.50"},
                "b": {"B": bytes([0, 255, i])}, "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2.5"]},
                "bs": {"BS": [b"\x00", b"\x01"]}, "null": {"NULL": True}, "yes": {"BOOL": True},
                "no": {"BOOL": False}, "empty": {"S": ""}, "uni": {"S": "Grüße ✓ \"q\" \\ \n"},
                "m": {"M": {"l": {"L": [{"N": "1"}, {"M": {"deep": {"S": "d"}}}, {"B": b"\x02"}]}}},
            })
        key = {"pk": {"S": "p"}, "sk": {"S": "s1"}}
        missing = {"pk": {"S": "p"}, "sk": {"S": "none"}}

        # When each read is made, with pages, projections, consumed capacity and misses
        items = [ddb.get_item(TableName="reads", Key=key, ReturnConsumedCapacity="TOTAL")["Item"]]
        assert "Item" not in ddb.get_item(TableName="reads", Key=missing)
        ddb.get_item(TableName="reads", Key=key, ProjectionExpression="#m.l[1], b",
                     ExpressionAttributeNames={"#m": "m"})
        page = ddb.query(TableName="reads", KeyConditionExpression="pk = :p", Limit=2,
                         ExpressionAttributeValues={":p": {"S": "p"}}, ReturnConsumedCapacity="INDEXES")
        assert "LastEvaluatedKey" in page
        last = ddb.query(TableName="reads", KeyConditionExpression="pk = :p",
                         ExclusiveStartKey=page["LastEvaluatedKey"], ExpressionAttributeValues={":p": {"S": "p"}})
        assert "LastEvaluatedKey" not in last and last["Count"] == 3
        ddb.query(TableName="reads", IndexName="by_g", KeyConditionExpression="g = :g",
                  ExpressionAttributeValues={":g": {"S": "x"}}, Select="COUNT")
        ddb.scan(TableName="reads", FilterExpression="n > :n", ExpressionAttributeValues={":n": {"N": "2"}})
        got = ddb.batch_get_item(RequestItems={"reads": {"Keys": [key, missing]}})
        items += got["Responses"]["reads"]
        pair = ddb.transact_get_items(TransactItems=[{"Get": {"TableName": "reads", "Key": k}} for k in (key, missing)])
        items.append(pair["Responses"][0]["Item"])

    # Then every answer was the serializer's, byte values and sets included
    assert {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"} <= set(compared)
    for item in items:
        assert item["b"] == {"B": bytes([0, 255, 1])} and item["bs"] == {"BS": [b"\x00", b"\x01"]}
        assert item["m"]["M"]["l"]["L"][2] == {"B": b"\x02"} and item["null"] == {"NULL": True}


def test_queries_answer_what_moto_s_walk_of_the_whole_table_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    # moto sorted and walked every item of the table on each Query (100 ms at 100,000 items); the layer
    # walks the partition, or the items holding the index's key value. Every answer must stay moto's.
    import random

    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.table import Table

    from prewarm_devtools.aws_limits import tables

    if aws_limits.active() is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off)")
    narrowed, moto_query = Table.query, original(Table, "query")
    compared: list[int] = []

    def both(table: Any, *args: Any, **kwargs: Any) -> Any:
        got, want = narrowed(table, *args, **kwargs), moto_query(table, *args, **kwargs)
        assert [i.to_json() for i in got[0]] == [i.to_json() for i in want[0]], (args, kwargs)
        assert got[1:] == want[1:]
        compared.append(len(got[0]))
        return got

    monkeypatch.setattr(Table, "query", both)
    rng = random.Random(35)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-west-2")
        create_table(ddb, "q", "flight", ("fpk", "sk"), "KEYS_ONLY")
        ddb.update_table(TableName="q", AttributeDefinitions=[{"AttributeName": "kind", "AttributeType": "S"}],
                         GlobalSecondaryIndexUpdates=[{"Create": {
                             "IndexName": "kinds", "Projection": {"ProjectionType": "ALL"},
                             "KeySchema": [{"AttributeName": "kind", "KeyType": "HASH"},
                                           {"AttributeName": "pk", "KeyType": "RANGE"}]}}])
        parts, values, kinds = ["J#0", "J#1", "J#2"], ["J#0", "J#1", "F"], ["job", "node"]

        def key() -> dict[str, Any]:
            return {"pk": {"S": rng.choice(parts)}, "sk": {"S": f"N{rng.randrange(12):02d}"}}

        def item() -> dict[str, Any]:
            out = {**key(), "n": {"N": str(rng.randrange(100))}}
            if rng.random() < 0.6:
                out["fpk"] = {"S": rng.choice(values)}
            if rng.random() < 0.5:
                out["kind"] = {"S": rng.choice(kinds)}
            return out

        def write() -> None:
            roll = rng.random()
            if roll < 0.3:
                ddb.put_item(TableName="q", Item=item())
            elif roll < 0.55:
                update = rng.choice(["SET fpk = :v", "REMOVE fpk", "SET kind = :k", "SET n = :n REMOVE kind"])
                names = {":v": {"S": rng.choice(values)}, ":k": {"S": rng.choice(kinds)}, ":n": {"N": "1"}}
                used = {k: v for k, v in names.items() if k in update}
                ddb.update_item(TableName="q", Key=key(), UpdateExpression=update,
                                **({"ExpressionAttributeValues": used} if used else {}))
            elif roll < 0.7:
                ddb.delete_item(TableName="q", Key=key())
            elif roll < 0.8:
                puts = {tuple(i["sk"].values()) + tuple(i["pk"].values()): i for i in (item() for _ in range(4))}
                ddb.batch_write_item(RequestItems={"q": [{"PutRequest": {"Item": i}} for i in puts.values()]})
            else:
                # A transaction, failing half the time: the rollback puts the items back as they were.
                first, second = key(), key()
                if first == second:
                    return
                check = {"ConditionExpression": "attribute_not_exists(pk)"} if rng.random() < 0.5 else {}
                with contextlib.suppress(ddb.exceptions.TransactionCanceledException):
                    ddb.transact_write_items(TransactItems=[
                        {"Update": {"TableName": "q", "Key": first, "UpdateExpression": "REMOVE fpk"}},
                        {"Put": {"TableName": "q", "Item": {**item(), **second}, **check}},
                    ])

        def query_all() -> None:
            for value in values:
                for forward in (True, False):
                    pages: dict[str, Any] = {}
                    while True:
                        page = ddb.query(TableName="q", IndexName="flight", KeyConditionExpression="fpk = :v",
                                         ExpressionAttributeValues={":v": {"S": value}}, Limit=3,
                                         ScanIndexForward=forward, **pages)
                        if "LastEvaluatedKey" not in page:
                            break
                        pages = {"ExclusiveStartKey": page["LastEvaluatedKey"]}
                ddb.query(TableName="q", IndexName="flight", KeyConditionExpression="fpk = :v AND sk > :s",
                          ExpressionAttributeValues={":v": {"S": value}, ":s": {"S": "N05"}})
            for kind in kinds:
                ddb.query(TableName="q", IndexName="kinds", KeyConditionExpression="kind = :k",
                          FilterExpression="n > :n", ExpressionAttributeValues={":k": {"S": kind}, ":n": {"N": "50"}})
            for part in [*parts, "none"]:
                ddb.query(TableName="q", KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
                          ExpressionAttributeValues={":p": {"S": part}, ":s": {"S": "N0"}}, Limit=4)

        # Given a table written every way, queried from the start (the map made early, then kept by writes)
        query_all()
        for step in range(400):
            write()
            if step % 10 == 0:
                query_all()
        query_all()
        table = dynamodb_backends["123456789012"]["us-west-2"].get_table("q")
        # Then every answer was moto's, and a query of an index walked only the items holding its value
        assert len(compared) > 500 and sum(compared) > 1000
        held = [i for i in original(Table, "all_items")(table) if i.to_json()["Attributes"].get("fpk") == {"S": "F"}]
        assert held
        assert {id(i) for i in tables._holding(table, "fpk", tables.DynamoType({"S": "F"}))} == {id(i) for i in held}
        assert set(table.__dict__["_prewarm_by_value"]) == {"fpk", "kind"}


def test_with_local_builders_a_snapshot_is_pending_until_its_copy_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # moto makes a snapshot completed at once; a sweep reading that resumed a bake before local mode had copied
    # the volume, and a node booted from the class found no snapshot to restore
    from prewarm_devtools.aws_limits.ec2 import finish_snapshot

    layer = aws_limits.active()
    if layer is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS)")
    monkeypatch.setattr(layer.ec2, "snapshots_pending", layer.ec2.snapshots_pending)  # as it was, after the test
    layer.hold_snapshots(True)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        volume = ec2.create_volume(AvailabilityZone="us-west-2a", Size=8)["VolumeId"]
        made = [ec2.create_snapshot(VolumeId=volume)["SnapshotId"] for _ in range(2)]

        def state(snapshot: str) -> str:
            return str(ec2.describe_snapshots(SnapshotIds=[snapshot])["Snapshots"][0]["State"])

        assert [state(s) for s in made] == ["pending", "pending"]
        account = boto3.client("sts", region_name="us-west-2", aws_access_key_id="t",
                               aws_secret_access_key="t").get_caller_identity()["Account"]
        finish_snapshot(made[0], account=account, region="us-west-2")
        finish_snapshot(made[1], failed=True, account=account, region="us-west-2")
        assert [state(s) for s in made] == ["completed", "error"]


def listed(client: Answers) -> int:
    """How many snapshots the DescribeSnapshots answers held."""
    return sum(len(answer["Snapshots"]) for answer in client.answers)


def test_local_builders_poll_reads_only_the_snapshots_they_have_to_finish(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    # moto's EC2 owns some 1,300 completed snapshots of its default AMIs: a poll that listed them (five times
    # a second) kept a core of every local stack busy, and slowed all else in its process
    from prewarm_devtools.localbuilders import LocalBuilders

    layer = aws_limits.active()
    if layer is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS)")
    monkeypatch.setattr(layer.ec2, "snapshots_pending", layer.ec2.snapshots_pending)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        assert len(ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]) > 1000
        layer.hold_snapshots(True)  # as local mode holds them: after its stack has made the EC2 backend
        counting = Answers(ec2, "describe_snapshots")
        builders = LocalBuilders(tmp_path, counting, None, "", tmp_path, layer=layer)
        # Given an idle account, a poll lists no snapshot
        builders.poll()
        assert listed(counting) == 0
        # When a snapshot not the stack's is made, the poll finishes it (EBS's part alone) and lists it alone
        volume = ec2.create_volume(AvailabilityZone="us-west-2a", Size=8)["VolumeId"]
        made = ec2.create_snapshot(VolumeId=volume)["SnapshotId"]
        builders.poll()
        assert listed(counting) == 1
        assert ec2.describe_snapshots(SnapshotIds=[made])["Snapshots"][0]["State"] == "completed"
        builders.poll()
        assert listed(counting) == 1
