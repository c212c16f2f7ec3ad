"""moto's memory stays flat behind the limits layer: a stream holds only what its readers still need,
and a transaction copies no table (counts, not timing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.table import StreamShard, Table

from prewarm_devtools import aws_limits
from prewarm_devtools.aws_limits import Quotas
from prewarm_devtools.sam.aws import MotoServer
from tests.integration.aws_limits.test_aws_limits import TABLE, item, make_table

pytestmark = pytest.mark.integration


@pytest.fixture
def clients() -> Iterator[tuple[Any, Any]]:
    # local mode's path: its moto server, read as its stream event source mappings read
    with aws_limits.limits(Quotas(transaction_hold_s=0)), MotoServer() as server:
        yield server.client("dynamodb"), server.client("dynamodbstreams")


def shard() -> StreamShard:
    table = dynamodb_backends["123456789012"]["us-west-2"].tables[TABLE]
    assert table.stream_shard is not None
    return table.stream_shard


def bump(dynamodb: Any, version: int) -> None:
    dynamodb.transact_write_items(TransactItems=[{"Update": {
        "TableName": TABLE, "Key": item("job"), "UpdateExpression": "SET v = :v",
        "ExpressionAttributeValues": {":v": {"N": str(version)}}}}])


def test_a_stream_drops_what_its_reader_has_read_and_a_transaction_copies_no_table(
    clients: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    dynamodb, streams = clients
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job"))
    copies: list[str] = []
    real_deepcopy = Table.__deepcopy__ if hasattr(Table, "__deepcopy__") else None
    monkeypatch.setattr(Table, "__deepcopy__", lambda self, memo: copies.append(self.name) or self, raising=False)
    monkeypatch.setattr(StreamShard, "__deepcopy__", lambda self, memo: copies.append("stream") or self, raising=False)
    assert real_deepcopy is None
    arn = dynamodb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard_id = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id, ShardIteratorType="LATEST")["ShardIterator"]
    # Given a reader that keeps up, when 200 transactions write one item
    seen = []
    for version in range(200):
        bump(dynamodb, version)
        out = streams.get_records(ShardIterator=iterator)
        seen += [r["dynamodb"]["NewImage"]["v"]["N"] for r in out["Records"]]
        iterator = out["NextShardIterator"]
        # Then the stream holds no more than the reader has not read yet
        assert len(shard().items) <= 1
    assert seen == [str(v) for v in range(200)]
    # and no transaction copied a table or its stream
    assert copies == []


def test_a_cancelled_transaction_leaves_no_stream_record_and_the_reader_sees_what_follows(
    clients: tuple[Any, Any],
) -> None:
    dynamodb, streams = clients
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job"))
    arn = dynamodb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard_id = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id, ShardIteratorType="LATEST")["ShardIterator"]
    with pytest.raises(ClientError):
        dynamodb.transact_write_items(TransactItems=[
            {"Put": {"TableName": TABLE, "Item": item("a")}},
            {"ConditionCheck": {"TableName": TABLE, "Key": item("missing"),
                                "ConditionExpression": "attribute_exists(pk)"}},
        ])
    assert "Item" not in dynamodb.get_item(TableName=TABLE, Key=item("a"))
    bump(dynamodb, 1)
    records = streams.get_records(ShardIterator=iterator)["Records"]
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in records] == ["job"]


def test_without_a_reader_records_are_kept_until_retention_then_dropped(clients: tuple[Any, Any]) -> None:
    dynamodb, streams = clients
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job"))
    for version in range(5):
        bump(dynamodb, version)
    assert len(shard().items) == 6  # nobody read them yet: a TRIM_HORIZON reader finds them all
    layer = aws_limits.active()
    assert layer is not None
    layer.streams.retention_s = 0  # a day has passed
    arn = dynamodb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard_id = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id, ShardIteratorType="LATEST")["ShardIterator"]
    streams.get_records(ShardIterator=iterator)
    assert len(shard().items) == 0
