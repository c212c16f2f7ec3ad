"""An agent on a node whose name came back (EKS reuses node names with IPs) within SQS's 60 s refusal
of the old queue's name: it waits for the name, reporting why, instead of exiting into CrashLoopBackOff."""

from __future__ import annotations

import threading

import pytest

from prewarm.adapters.sqs import NodeQueues
from tests.support.agent import agent_on_queues
from tests.support.aws import sqs_with_status_queue
from tests.support.waiting import eventually

PREFIX = "prewarm-node"


# moto would hand the name back at once; the limits layer refuses it as SQS does, here for 3 s.
@pytest.mark.aws_quotas(sqs_queue_name_reuse_s=3.0)
def test_an_agent_waits_out_a_recently_deleted_queue_name_and_then_consumes() -> None:
    with sqs_with_status_queue() as (sqs, status):
        # Given the sweep deleted the queue of a node that left
        queues = NodeQueues(PREFIX, status, client=sqs)
        queues.delete_queue(queues.ensure_queue("node-a"))
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        # When a node of the same name starts its agent at once
        starting = threading.Thread(target=agent.start, daemon=True)
        starting.start()
        try:
            # Then it is not ready and says why, and does not exit
            assert eventually(lambda: "deleted less than 60 s ago" in (agent.readiness() or ""), timeout=5)
            assert starting.is_alive()
            # And once SQS allows the name it creates the queue, says hello and becomes ready
            starting.join(timeout=15)
            assert not starting.is_alive()
            assert eventually(lambda: agent.readiness() is None, timeout=10), agent.readiness()
            assert queues.queue_name("node-a") in {u.rsplit("/", 1)[1] for u in sqs.list_queues()["QueueUrls"]}
        finally:
            agent.stop(0)
