"""What `record_status` hands back to the status queue comes again sooner than the queue's 180 s: after a
backoff that grows with the message's receive count; a message that does not parse comes back at once,
to reach the DLQ in seconds. The queue is moto's SQS, through the real adapter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.sqs import StatusQueue
from prewarm.domain.retry import STATUS_QUEUE_VISIBILITY_SECONDS, Delivery, redelivery_seconds
from prewarm.services.reports import deliver_again
from prewarm_devtools.sam.template import load_template
from tests.support.aws import mocked_aws

REGION = "us-west-2"


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with mocked_aws(monkeypatch, REGION):
        yield boto3.client("sqs", region_name=REGION)


def test_a_returned_message_comes_again_after_2_s_then_four_times_longer_each_receive_up_to_the_queues_timeout(
) -> None:
    assert [redelivery_seconds(n) for n in range(1, 8)] == [2, 8, 32, 128, 180, 180, 180]
    # five receives before the DLQ (maxReceiveCount 5): about 6 minutes from the first receive
    assert sum(redelivery_seconds(n) for n in range(1, 6)) == 350
    assert redelivery_seconds(9, poison=True) == 0


def test_a_receive_count_below_1_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="receive_count must be >= 1, got 0"):
        redelivery_seconds(0)


def test_the_cap_is_the_status_queues_visibility_timeout_in_the_template() -> None:
    queue = load_template()["Resources"]["StatusQueue"]["Properties"]
    assert queue["VisibilityTimeout"] == STATUS_QUEUE_VISIBILITY_SECONDS


def test_returned_messages_are_hidden_for_their_backoff_and_poison_is_back_at_once(sqs: Any) -> None:
    # Given three messages of one batch received from the status queue (180 s visibility), the third
    # for the fourth time
    url = sqs.create_queue(QueueName="status", Attributes={"VisibilityTimeout": "180"})["QueueUrl"]
    for body in ("report", "poison", "applied"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    by_body = {m["Body"]: m for m in got}
    deliveries = [Delivery(by_body["report"]["MessageId"], by_body["report"]["ReceiptHandle"], receive_count=4),
                  Delivery(by_body["poison"]["MessageId"], by_body["poison"]["ReceiptHandle"]),
                  Delivery(by_body["applied"]["MessageId"], by_body["applied"]["ReceiptHandle"])]
    # When the batch hands back the report to retry and the poison
    delays = deliver_again(StatusQueue(url, client=sqs), deliveries, retry_ids=[deliveries[0].message_id],
                           poison_ids=[deliveries[1].message_id])
    # Then the report waits 128 s (its fourth receive), the poison none, the applied one is not touched
    assert delays == [(deliveries[0].message_id, 128), (deliveries[1].message_id, 0)]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in again] == ["poison"]


def test_a_visibility_change_sqs_refuses_is_logged_and_the_batch_stands(sqs: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    url = sqs.create_queue(QueueName="status")["QueueUrl"]
    # A receipt handle SQS does not know (the message was deleted meanwhile)
    delays = deliver_again(StatusQueue(url, client=sqs), [Delivery("m1", "not-a-receipt-handle")], retry_ids=["m1"])
    assert delays == [("m1", 2)]
    assert "keeps the queue's visibility timeout" in caplog.text


def test_record_status_hands_poison_back_at_once_and_a_warm_up_ahead_of_its_hello_after_2_s(
    stack: dict[str, Any],
) -> None:
    from prewarm_devtools.sam.events import sqs_event
    from tests.support.handlers import load_handler

    # Given a batch of the status queue: a message that does not parse, and a warm-up of a node that has
    # not said hello yet (it goes back until the hello is stored)
    sqs, url = stack["sqs"], stack["sqs"].get_queue_url(QueueName="status")["QueueUrl"]
    warmed = ('{"v": 1, "kind": "warmed", "node": "ip-10-0-4-9.ec2.internal", "joined_at": 1.0, "hello_at": 2.0, '
              '"warm_at": 3.0, "outcome": "warm"}')
    for body in ("{not json", warmed):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    event = sqs_event(got, "arn:aws:sqs:us-west-2:123456789012:status", REGION)
    # When record_status runs on it
    result = load_handler("record_status").lambda_handler(event, stack["ctx"])
    # Then both go back, and only the poison is on the queue again at once (the queue would hide both 30 s)
    assert len(result["batchItemFailures"]) == 2
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in again] == ["{not json"]
