"""An agent whose node queue is deleted while it runs (by hand, or a sweep that took its node for departed)
creates it again, waiting out SQS's refusal of a recently deleted name, and goes on receiving its tasks."""

from __future__ import annotations

import logging
import re
import time

import pytest

from prewarm.adapters.sqs import NodeQueues
from tests.support.agent import agent_on_queues
from tests.support.aws import sqs_with_status_queue
from tests.support.waiting import eventually

PREFIX = "prewarm-node"


@pytest.mark.aws_quotas(sqs_queue_name_reuse_s=2.0)
def test_a_deleted_node_queue_is_created_again_and_consumed() -> None:
    with sqs_with_status_queue() as (sqs, status):
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        agent.start()
        try:
            queues = NodeQueues(PREFIX, status, client=sqs)
            name = queues.queue_name("node-a")
            # Given its queue deleted while the agent consumes it
            assert agent.queue is not None
            deleted_at = time.monotonic()
            sqs.delete_queue(QueueUrl=agent.queue.url)

            # Then the agent creates it again, once SQS allows the name (2 s here, 60 s on AWS) ...
            def recreated() -> bool:
                return name in {u.rsplit("/", 1)[1] for u in sqs.list_queues().get("QueueUrls", [])}

            assert eventually(recreated, timeout=15)
            assert time.monotonic() - deleted_at >= 2.0
            # ... and its consumer goes on: a message sent to the new queue is received
            assert agent.queue is not None and agent.queue.url.endswith(name)
            sqs.send_message(QueueUrl=agent.queue.url, MessageBody="not a node message")
            poison = {"kind": "poison"}
            assert eventually(lambda: agent.metrics.sample("prewarm_agent_messages_received_total", poison) >= 1,
                              timeout=10)
            assert eventually(lambda: agent.readiness() is None, timeout=10), agent.readiness()
        finally:
            agent.stop(0)


@pytest.mark.aws_quotas(sqs_queue_name_reuse_s=2.5)
def test_the_agent_logs_the_lost_queue_and_backs_off_while_sqs_refuses_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prewarm_agent")
    with sqs_with_status_queue() as (sqs, status):
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        agent.start()
        try:
            # Given its queue deleted while it runs, and SQS refusing the name for 2.5 s
            assert agent.queue is not None
            sqs.delete_queue(QueueUrl=agent.queue.url)
            assert eventually(lambda: any("node queue created again" in r.getMessage() for r in caplog.records),
                              timeout=20)
        finally:
            agent.stop(0)
    messages = [r.getMessage() for r in caplog.records]
    # Then it said the queue was gone, waited longer after each refusal, and said when it had it again
    gone = next(i for i, m in enumerate(messages) if "the node queue is gone" in m)
    retries = [r for r in caplog.records[gone:] if "node queue not available yet" in r.getMessage()]
    delays = [float(re.search(r"trying again in (\d+) s", r.getMessage()).group(1))  # type: ignore[union-attr]
              for r in retries]
    assert delays and delays == [2.0**i for i in range(len(delays))], messages
    assert all(r.levelno == logging.WARNING for r in retries)
    # ... each retry after the delay it announced
    for before, after, delay in zip(retries, retries[1:], delays, strict=False):
        assert after.created - before.created >= delay * 0.9
