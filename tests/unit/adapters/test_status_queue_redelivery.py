"""The status queue's `deliver_again_after` (`StatusQueue`) on moto's SQS: what `record_status` hands back
is hidden for its backoff, a poison message is back at once, and a refusal is logged, not raised. The
backoff itself: tests/unit/services/test_redelivery.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.sqs import StatusQueue
from prewarm.domain.retry import Delivery
from prewarm.services.status_batches import deliver_again
from tests.support.aws import mocked_aws

REGION = "us-west-2"


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with mocked_aws(monkeypatch, REGION):
        yield boto3.client("sqs", region_name=REGION)


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
