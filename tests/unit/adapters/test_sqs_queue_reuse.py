"""A node name that comes back within 60 s of its queue's deletion (EKS names nodes after reused IPs), and
a send to a node that has no queue: only a hello makes a node's queue, a send never does."""

from __future__ import annotations

import pytest

from prewarm.adapters.sqs import NodeQueues, QueueRetryableError
from prewarm.domain.messages import PullTask
from tests.support.aws import sqs_with_status_queue

REGION = "us-west-2"


def task(node: str) -> PullTask:
    return PullTask(job="default/warm", job_uid="u1", round=0, node=node,
                    image="registry.example/app@sha256:" + "a" * 64)


def test_a_queue_made_again_moments_after_its_deletion_is_told_to_retry_and_why() -> None:
    # moto alone would recreate the name at once: the limits layer (on for the test run) refuses it for
    # 60 s, as SQS does.
    with sqs_with_status_queue(REGION) as (sqs, status):
        queues = NodeQueues("pw", status, client=sqs)
        # Given a node whose queue the sweep deleted when the node left
        queues.delete_queue(queues.ensure_queue("ip-10-0-1-1"))
        # When a node of the same name joins and its hello asks for its queue at once
        with pytest.raises(QueueRetryableError) as caught:
            queues.ensure_queue("ip-10-0-1-1")
        # Then the failure is retryable (the agent waits it out) and says why
        assert "deleted less than 60 s ago" in str(caught.value)


def test_a_send_to_a_node_without_a_queue_creates_none_and_waits_for_its_agent() -> None:
    with sqs_with_status_queue(REGION) as (sqs, status):
        queues = NodeQueues("pw", status, client=sqs)
        # Given a node whose agent has not said hello (no queue made), and one whose queue went
        queues.delete_queue(queues.ensure_queue("ip-10-0-1-2"))
        # When the control plane sends them tasks
        sent = [queues.send(task("ip-10-0-1-1")), queues.send(task("ip-10-0-1-2"))]
        failures = queues.send_many([task("ip-10-0-1-1"), task("ip-10-0-1-2")])
        # Then nothing is sent, nothing fails (the hello of an agent there sends them again), and no
        # queue is made: only a hello the cluster vouches for makes a node's queue
        assert sent == [False, False]
        assert failures == []
        assert queues.list_node_queues() == {}
