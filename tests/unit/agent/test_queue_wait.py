"""An agent never creates its node queue (no agent may: docs/operations.md, "Trust boundaries"). It says
hello, and waits for the queue the control plane makes on that hello: GetQueueUrl again and again, backing
off, saying why it waits and saying hello again; once the queue exists it consumes it. A queue deleted
under a running agent is waited for the same way."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from prewarm.adapters.sqs import NodeQueues, QueueRetryableError
from prewarm.domain.messages import Hello, parse_agent_message
from prewarm_agent import agent as agent_module
from tests.support.agent import agent_on_queues
from tests.support.aws import sqs_with_status_queue
from tests.support.waiting import eventually

PREFIX = "prewarm-node"


def hellos(sqs: Any, status: str) -> list[Hello]:
    """The hellos on the status queue now, taken off it."""
    got: list[Hello] = []
    for m in sqs.receive_message(QueueUrl=status, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
        sqs.delete_message(QueueUrl=status, ReceiptHandle=m["ReceiptHandle"])
        message = parse_agent_message(m["Body"])
        if isinstance(message, Hello):
            got.append(message)
    return got


@contextmanager
def control_plane(sqs: Any, status: str) -> Iterator[list[Hello]]:
    """Makes the node queue of each hello it reads, as record_status does for a node its cluster shows (a
    hello whose queue name SQS still refuses comes again, as record_status hands it back); yields the
    hellos read."""
    queues = NodeQueues(PREFIX, status, client=sqs)
    seen: list[Hello] = []
    done = threading.Event()

    def run() -> None:
        pending: list[Hello] = []
        while not done.wait(0.2):
            got = hellos(sqs, status)
            seen.extend(got)
            pending, todo = [], pending + got
            for hello in todo:
                try:
                    queues.provide_queue(hello.node)
                except QueueRetryableError:
                    pending.append(hello)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=5)


def test_an_agent_waits_for_the_queue_the_control_plane_makes_and_then_consumes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prewarm_agent")
    with sqs_with_status_queue() as (sqs, status):
        queues = NodeQueues(PREFIX, status, client=sqs)
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        # Given a node whose queue does not exist yet: its agent starts (and returns, waiting aside)
        agent.start()
        try:
            # Then it creates nothing, says hello (naming the queue it waits for), is not ready and says why
            (hello,) = hellos(sqs, status)
            assert hello.node == "node-a" and hello.queue_url == queues.queue_url("node-a")
            assert eventually(lambda: "waiting for the node queue" in (agent.readiness() or ""), timeout=5)
            assert "cluster's API shows this node" in (agent.readiness() or "")
            time.sleep(1.5)
            assert queues.find_queue("node-a") is None and agent.queue is None
            assert any("node queue not available yet" in r.getMessage() for r in caplog.records)
            # When the control plane makes the queue
            url = queues.ensure_queue("node-a")
            # Then the agent consumes it: ready, and a message sent there is received
            assert eventually(lambda: agent.readiness() is None, timeout=10), agent.readiness()
            assert agent.queue is not None and agent.queue.url == url
            sqs.send_message(QueueUrl=url, MessageBody="not a node message")
            assert eventually(lambda: agent.metrics.sample("prewarm_agent_messages_received_total",
                                                           {"kind": "poison"}) >= 1, timeout=10)
        finally:
            agent.stop(0)


def test_a_waiting_agent_says_hello_again_so_a_later_hello_can_make_its_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_module, "HELLO_AGAIN_SECONDS", 0.5)
    with sqs_with_status_queue() as (sqs, status):
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        # Given an agent whose first hello made no queue (the cluster's API could not show the node then)
        agent.start()
        try:
            assert [h.node for h in hellos(sqs, status)] == ["node-a"]
            # Then it says hello again while it waits, and once a hello is answered it consumes
            with control_plane(sqs, status) as seen:
                assert eventually(lambda: agent.readiness() is None, timeout=10), agent.readiness()
            assert [h.node for h in seen][:1] == ["node-a"]
        finally:
            agent.stop(0)


@pytest.mark.aws_quotas(sqs_queue_name_reuse_s=2.0)
def test_a_queue_deleted_under_the_agent_is_waited_for_and_made_again_by_the_control_plane(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prewarm_agent")
    with sqs_with_status_queue() as (sqs, status):
        queues = NodeQueues(PREFIX, status, client=sqs)
        queues.ensure_queue("node-a")
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        agent.start()
        try:
            assert agent.queue is not None
            hellos(sqs, status)
            with control_plane(sqs, status) as seen:
                # Given its queue deleted while the agent consumes it
                deleted_at = time.monotonic()
                sqs.delete_queue(QueueUrl=agent.queue.url)
                # Then the agent says hello at once and waits; the control plane makes the queue again once
                # SQS allows the name (2 s here, 60 s on AWS), and the consumer goes on with it
                assert eventually(lambda: any("node queue made again" in r.getMessage() for r in caplog.records),
                                  timeout=30)
                assert time.monotonic() - deleted_at >= 2.0 and seen
            url = queues.find_queue("node-a")
            assert url is not None and agent.queue.url == url
            sqs.send_message(QueueUrl=url, MessageBody="not a node message")
            assert eventually(lambda: agent.metrics.sample("prewarm_agent_messages_received_total",
                                                           {"kind": "poison"}) >= 1, timeout=10)
        finally:
            agent.stop(0)
    messages = [r.getMessage() for r in caplog.records]
    gone = next(i for i, m in enumerate(messages) if "the node queue is gone" in m)
    retries = [r for r in caplog.records[gone:] if "node queue not available yet" in r.getMessage()]
    delays = [float(re.search(r"trying again in (\d+) s", r.getMessage()).group(1))  # type: ignore[union-attr]
              for r in retries]
    # ... backing off, each retry after the delay it announced
    assert delays and delays == [min(2.0**i, agent_module.QUEUE_RETRY_MAX_SECONDS) for i in range(len(delays))]
    for before, after, delay in zip(retries, retries[1:], delays, strict=False):
        assert after.created - before.created >= delay * 0.9


def test_the_hello_is_sent_before_the_agent_looks_up_its_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hello is what releases a warm node's taint: no SQS lookup comes before it
    with sqs_with_status_queue() as (sqs, status):
        agent = agent_on_queues(sqs, status, prefix=PREFIX)
        seen_at_lookup: list[list[Hello]] = []
        find = agent.node_queues.find_queue

        def looking_up(node: str) -> str | None:
            seen_at_lookup.append(hellos(sqs, status))
            return find(node)

        monkeypatch.setattr(agent.node_queues, "find_queue", looking_up)
        agent.start()
        try:
            assert [[h.node for h in got] for got in seen_at_lookup[:1]] == [["node-a"]]
        finally:
            agent.stop(0)
