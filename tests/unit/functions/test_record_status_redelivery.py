"""The record_status handler hands poison back to the status queue at once (moto's SQS, in-process)."""

from __future__ import annotations

from typing import Any

REGION = "us-west-2"


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
