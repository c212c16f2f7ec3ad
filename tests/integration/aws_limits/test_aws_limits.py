"""Each AWS limit the local layer enforces, firing through boto3: in-process (`mock_aws`) and on local
mode's moto server; and the capacity counted per key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from prewarm_devtools import aws_limits
from prewarm_devtools.aws_limits import Quotas
from prewarm_devtools.sam.aws import REGION, MotoServer

pytestmark = pytest.mark.integration

TABLE = "limits"
NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Aws:
    layer: aws_limits.AwsLimits
    clock: Clock
    client: Callable[[str], Any]


def _in_process(quotas: Quotas) -> Iterator[Aws]:
    clock = Clock()
    with aws_limits.limits(quotas, clock=clock) as layer, mock_aws():
        yield Aws(layer, clock, lambda service: boto3.client(
            service, region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s", config=NO_RETRIES))


def _server(quotas: Quotas) -> Iterator[Aws]:
    clock = Clock()
    with aws_limits.limits(quotas, clock=clock) as layer, MotoServer() as server:
        yield Aws(layer, clock, lambda service: boto3.client(
            service, region_name=REGION, endpoint_url=server.url, aws_access_key_id="local",
            aws_secret_access_key="local", config=NO_RETRIES))


@pytest.fixture(params=["mock_aws", "moto_server"])
def aws(request: pytest.FixtureRequest) -> Iterator[Aws]:
    quotas = request.node.get_closest_marker("aws_quotas")
    wanted = Quotas(**quotas.kwargs) if quotas else Quotas()
    yield from (_in_process if request.param == "mock_aws" else _server)(wanted)


def make_table(dynamodb: Any) -> None:
    dynamodb.create_table(
        TableName=TABLE, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "kind")],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[{"IndexName": "by_kind", "KeySchema": [{"AttributeName": "kind", "KeyType": "HASH"}],
                                 "Projection": {"ProjectionType": "KEYS_ONLY"}}],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )


def item(pk: str, sk: str = "job", **extra: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}, **{k: {"S": v} for k, v in extra.items()}}


def error(e: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return e.value.response["Error"]["Code"], e.value.response["Error"]["Message"]


def reasons(e: pytest.ExceptionInfo[ClientError]) -> list[str]:
    return [r["Code"] for r in e.value.response.get("CancellationReasons", [])]


# --- DynamoDB -----------------------------------------------------------------------------------


def test_an_item_over_400_kb_is_refused(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    # names and values count: "pk", "sk", "data" and "a", "job"
    room = 400 * 1024 - len("pkskdata") - len("ajob")
    dynamodb.put_item(TableName=TABLE, Item=item("a", data="x" * 400_000))
    with pytest.raises(ClientError) as e:
        dynamodb.put_item(TableName=TABLE, Item=item("b", data="x" * (room + 1)))
    assert error(e) == ("ValidationException", "Item size has exceeded the maximum allowed size")
    assert aws.layer.stats.refusals == {"ValidationException": 1}  # the layer refused it, not moto


def test_an_update_that_grows_an_item_over_400_kb_is_refused_and_leaves_it_as_it_was(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("a", data="x" * 300_000))
    with pytest.raises(ClientError) as e:
        dynamodb.update_item(TableName=TABLE, Key=item("a"), UpdateExpression="SET more = :m",
                             ExpressionAttributeValues={":m": {"S": "y" * 200_000}})
    assert error(e)[0] == "ValidationException"
    kept = dynamodb.get_item(TableName=TABLE, Key=item("a"))["Item"]
    assert "more" not in kept and len(kept["data"]["S"]) == 300_000


def test_a_transaction_of_more_than_100_actions_is_refused(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    with pytest.raises(ClientError) as e:
        dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": TABLE, "Item": item(f"n{i}")}}
                                                     for i in range(101)])
    assert error(e)[0] == "ValidationException" and "less than or equal to 100" in error(e)[1]


def test_a_transaction_over_4_mb_is_refused(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    big = "x" * 390_000
    with pytest.raises(ClientError) as e:
        dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": TABLE, "Item": item(f"n{i}", data=big)}}
                                                     for i in range(11)])
    assert error(e) == ("ValidationException", "Transaction request cannot be larger than 4 MB")
    assert "Item" not in dynamodb.get_item(TableName=TABLE, Key=item("n0"))


def test_two_actions_on_one_item_in_a_transaction_are_refused(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    with pytest.raises(ClientError) as e:
        dynamodb.transact_write_items(TransactItems=[
            {"Put": {"TableName": TABLE, "Item": item("a")}},
            {"Update": {"TableName": TABLE, "Key": item("a"), "UpdateExpression": "SET v = :v",
                        "ExpressionAttributeValues": {":v": {"S": "1"}}}},
        ])
    assert error(e) == ("ValidationException", "Transaction request cannot include multiple operations on one item")


@pytest.mark.aws_quotas(partition_wcu_per_s=10)
def test_writes_beyond_a_partition_keys_capacity_are_throttled_until_it_refills(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    for i in range(10):  # 1 WCU each: the partition "job" has 10 a second
        dynamodb.put_item(TableName=TABLE, Item=item("job", f"n{i}"))
    dynamodb.put_item(TableName=TABLE, Item=item("other"))  # another partition key value is not affected
    with pytest.raises(ClientError) as e:
        dynamodb.put_item(TableName=TABLE, Item=item("job", "n10"))
    assert error(e)[0] == "ProvisionedThroughputExceededException"
    assert e.value.response["ThrottlingReasons"][0]["reason"] == "TableWriteKeyRangeThroughputExceeded"
    aws.clock.now += 0.2  # 2 WCU back
    dynamodb.put_item(TableName=TABLE, Item=item("job", "n10"))
    assert aws.layer.stats.key(TABLE, "job").throttles == 1


@pytest.mark.aws_quotas(partition_wcu_per_s=10)
def test_a_hot_gsi_key_throttles_writes_to_different_table_keys(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    for i in range(10):  # ten partitions of the table, one of the index: kind = Node
        dynamodb.put_item(TableName=TABLE, Item=item(f"node{i}", kind="Node"))
    with pytest.raises(ClientError) as e:
        dynamodb.put_item(TableName=TABLE, Item=item("node10", kind="Node"))
    assert e.value.response["ThrottlingReasons"][0]["reason"] == "IndexWriteKeyRangeThroughputExceeded"


@pytest.mark.aws_quotas(partition_wcu_per_s=10)
def test_a_throttled_transaction_is_cancelled_with_throttling_error(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    for i in range(5):  # transactional writes cost two units: 10 used
        dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": TABLE, "Item": item("job", f"n{i}")}}])
    with pytest.raises(ClientError) as e:
        dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": TABLE, "Item": item("job", "n5")}}])
    assert reasons(e) == ["ThrottlingError"]


@pytest.mark.aws_quotas(partition_rcu_per_s=2)
def test_reads_beyond_a_partition_keys_capacity_are_throttled(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    dynamodb.put_item(TableName=TABLE, Item=item("job"))
    for _ in range(4):  # eventually consistent: half a unit each
        dynamodb.get_item(TableName=TABLE, Key=item("job"))
    with pytest.raises(ClientError) as e:
        dynamodb.get_item(TableName=TABLE, Key=item("job"), ConsistentRead=True)
    assert e.value.response["ThrottlingReasons"][0]["reason"] == "TableReadKeyRangeThroughputExceeded"


def test_capacity_is_counted_per_key_and_the_hottest_key_answers(aws: Aws) -> None:
    dynamodb = aws.client("dynamodb")
    make_table(dynamodb)
    for i in range(6):
        dynamodb.transact_write_items(TransactItems=[{"Update": {
            "TableName": TABLE, "Key": item("job"), "UpdateExpression": "SET v = :v",
            "ExpressionAttributeValues": {":v": {"S": str(i)}}}}])
        dynamodb.put_item(TableName=TABLE, Item=item(f"node{i}", data="x" * 1500, kind="Node"))
    dynamodb.get_item(TableName=TABLE, Key=item("job"), ConsistentRead=True)
    stats = aws.layer.stats
    hot = stats.hottest_key()
    assert hot is not None and str(hot.key) == f"{TABLE}:job"
    assert (hot.writes, hot.wcu, hot.reads, hot.rcu) == (6, 12.0, 1, 1.0)  # transactional: 2 WCU each
    assert stats.key(TABLE, "node0").wcu == 2.0  # 1.5 KB: two units
    assert stats.key(TABLE, "Node", index_name="by_kind").writes == 6
    assert hot.peak_wcu_per_s == 12.0 and hot.wcu_per_s() == 12.0
    # And each key names the base-table partition keys whose writes landed on it: an index key, every item's
    assert hot.writers == {"job"} and stats.key(TABLE, "node0").writers == {"node0"}
    assert stats.key(TABLE, "Node", index_name="by_kind").writers == {f"node{i}" for i in range(6)}


# --- SQS ----------------------------------------------------------------------------------------


def test_a_message_over_256_kb_is_refused(aws: Aws) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x" * 262_144)
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 262_000,
                         MessageAttributes={"kind": {"DataType": "String", "StringValue": "y" * 200}})
    assert error(e)[0] == "InvalidParameterValue"


def test_a_batch_of_more_than_10_or_over_256_kb_in_all_is_refused(aws: Aws) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(11)])
    assert error(e)[0] in ("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest")
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x" * 30_000} for i in range(10)])
    assert error(e)[0] in ("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong")


def test_a_queue_name_is_refused_for_60_seconds_after_its_queue_was_deleted(aws: Aws) -> None:
    sqs = aws.client("sqs")
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName="q")["QueueUrl"])
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="q")
    assert error(e)[0] in ("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently")
    aws.clock.now += 60
    sqs.create_queue(QueueName="q")


# --- ECR ----------------------------------------------------------------------------------------


def test_ecr_s_default_rate_quotas_are_the_service_quotas_page_s() -> None:
    quotas = Quotas()
    assert (quotas.ecr_auth_per_s, quotas.ecr_manifest_per_s, quotas.ecr_layer_per_s) == (500, 2000, 3000)


@pytest.mark.aws_quotas(ecr_auth_per_s=20, ecr_auth_burst=200)
def test_get_authorization_token_is_throttled_past_its_burst_then_its_rate(aws: Aws) -> None:
    ecr = aws.client("ecr")
    for _ in range(200):
        ecr.get_authorization_token()
    with pytest.raises(ClientError) as e:
        ecr.get_authorization_token()
    assert error(e)[0] == "ThrottlingException"
    aws.clock.now += 1.0
    for _ in range(20):
        ecr.get_authorization_token()
    with pytest.raises(ClientError):
        ecr.get_authorization_token()


def test_a_token_expires_at_moto_s_fixed_time_unless_a_lifetime_is_set(aws: Aws) -> None:
    ecr = aws.client("ecr")
    fixed = ecr.get_authorization_token()["authorizationData"][0]["expiresAt"]
    assert fixed.timestamp() == datetime(2015, 1, 1, tzinfo=UTC).timestamp()

    # Local mode gives tokens ECR's 12 hours, from the wall clock (the layer's clock is for rates)
    aws.layer.ecr.token_lifetime_s = 12 * 3600
    aws.layer.ecr.wall_clock = lambda: 1_800_000_000.0
    (data,) = ecr.get_authorization_token()["authorizationData"]

    assert data["expiresAt"].timestamp() == 1_800_000_000.0 + 12 * 3600
    assert data["authorizationToken"]


# --- off ------------------------------------------------------------------------------------------


def test_with_the_layer_off_moto_answers_as_it_does_on_its_own() -> None:
    before = aws_limits.active()
    aws_limits.disable()
    try:
        with mock_aws():
            sqs = boto3.client("sqs", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
            sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName="q")["QueueUrl"])
            sqs.create_queue(QueueName="q")
    finally:
        if before is not None:
            aws_limits.enable(before.quotas)
