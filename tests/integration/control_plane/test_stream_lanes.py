"""Local mode's table streams honour a mapping's ParallelizationFactor as Lambda does: a shard's records
split into lanes by partition key, each key's records in order, the lanes side by side; so a batch waiting
out a hung cluster holds up only its own lane (dispatch_job's JobChanges, template.yaml)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from prewarm_devtools.sam.aws import MotoServer
from prewarm_devtools.sam.event_sources import EventSources
from prewarm_devtools.sam.invocation import Function
from tests.support.aws import Answers

pytestmark = pytest.mark.integration


class StreamSources(EventSources):
    """One function bound to a table's stream with `ParallelizationFactor` `factor`; `invoke` runs `handler`."""

    def __init__(self, dynamodb: Any, streams: Any, handler: Any, factor: int) -> None:
        self.region, self.sqs, self.streams, self.event_bus_url = "us-west-2", None, streams, ""
        self._cursors, self._threads, self._stop = {}, [], threading.Event()
        self.handler = handler
        table = dynamodb.create_table(
            TableName="jobs", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}],
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"})
        arn = table["TableDescription"]["LatestStreamArn"]
        self.functions = {"plan": Function(
            logical_id="plan", name="plan", code_dir=Path("."), handler="app.handler", env={}, timeout=30, memory=128,
            events={"Jobs": {"Type": "DynamoDB", "Properties": {
                "EventSourceArn": arn, "StartingPosition": "LATEST", "BatchSize": 10,
                "ParallelizationFactor": factor}}})}

    def invoke(self, name: str, event: Mapping[str, Any]) -> Any:
        return self.handler(event)


@pytest.mark.parametrize("factor", [1, 10])
def test_a_stream_batch_waiting_holds_up_other_keys_only_with_a_parallelization_factor(factor: int) -> None:
    with MotoServer() as server:  # local mode's path: moto's stream API answers over HTTP only
        dynamodb, streams = server.client("dynamodb"), server.client("dynamodbstreams")
        release, seen = threading.Event(), []

        def plan(event: Mapping[str, Any]) -> None:
            keys = [r["dynamodb"]["Keys"]["pk"]["S"] for r in event["Records"]]
            seen.extend(keys)
            if "JOB#hung" in keys:  # a plan waiting out its cluster
                release.wait(10)

        sources = StreamSources(dynamodb, streams, plan, factor)
        sources.prime_streams()
        sources.start(schedules=False, interval=0.05)
        try:
            dynamodb.put_item(TableName="jobs", Item={"pk": {"S": "JOB#hung"}, "sk": {"S": "JOB"}})
            deadline = time.monotonic() + 5
            while "JOB#hung" not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
            # A later job's record, of another partition key, while the first one's batch is in flight
            for i in range(3):
                dynamodb.put_item(TableName="jobs", Item={"pk": {"S": f"JOB#healthy-{i}"}, "sk": {"S": "JOB"}})
            deadline = time.monotonic() + 2
            while len(seen) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            # The same-lane chance (1 in 10 per key) is why three keys: at least one goes by
            assert (len(seen) > 1) is (factor > 1), seen
        finally:
            release.set()
            sources.stop()


def test_a_shard_is_read_four_times_a_second_whatever_its_parallelization_factor() -> None:
    with MotoServer() as server:
        dynamodb = server.client("dynamodb")
        streams = Answers(server.client("dynamodbstreams"), "get_records")
        seen: list[str] = []
        sources = StreamSources(dynamodb, streams, lambda e: seen.extend(
            r["dynamodb"]["Keys"]["pk"]["S"] for r in e["Records"]), 10)
        sources.prime_streams()
        # Given ten lanes that each look for work every 50 ms
        sources.start(schedules=False, interval=0.05)
        try:
            started = time.monotonic()
            dynamodb.put_item(TableName="jobs", Item={"pk": {"S": "JOB#a"}, "sk": {"S": "JOB"}})
            time.sleep(2)
            elapsed = time.monotonic() - started
        finally:
            sources.stop()
        # Then the shard was read as Lambda reads it, 4 times a second (not once per lane: 200 a second),
        # and the record still came through
        assert len(streams.answers) <= 4 * elapsed + 2, (len(streams.answers), elapsed)
        assert seen == ["JOB#a"]
