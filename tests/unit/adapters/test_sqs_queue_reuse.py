"""A node name that comes back within 60 s of its queue's deletion (EKS names nodes after reused IPs)."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.sqs import NodeQueues, QueueRetryableError
from prewarm.domain.messages import PullTask

REGION = "us-west-2"


def task(node: str) -> PullTask:
    return PullTask(job="default/warm", job_uid="u1", round=0, node=node,
                    image="registry.example/app@sha256:" + "a" * 64)


def test_a_send_to_a_node_whose_queue_was_just_deleted_is_retryable_and_says_why() -> None:
    # moto alone would recreate the name at once: the limits layer (on for the test run) refuses it for
    # 60 s, as SQS does.
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t")
        status = sqs.create_queue(QueueName="status")["QueueUrl"]
        queues = NodeQueues("pw", status, client=sqs)
        # Given a node whose queue the sweep deleted when the node left
        url = queues.ensure_queue("ip-10-0-1-1")
        queues.delete_queue(url)
        # When a node of the same name joins and a task is sent to it at once
        with pytest.raises(QueueRetryableError) as caught:
            queues.send(task("ip-10-0-1-1"))
        # Then the failure is retryable (the sweep or the stream sends it again) and says why
        assert "deleted less than 60 s ago" in str(caught.value)
        assert queues.send_many([task("ip-10-0-1-1")]) == [("ip-10-0-1-1", str(caught.value))]
