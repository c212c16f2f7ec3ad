"""The hello goes once per change, though the start, the Node re-read and the queue wait send it from
their own threads."""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry

from prewarm.adapters.sqs import QueueError
from prewarm.domain.messages import FromAgent, Hello
from prewarm_agent.clock import SystemClock
from prewarm_agent.logs import NodeLogger
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.node import NodeFacts
from prewarm_agent.settings import AgentSettings
from prewarm_agent.startup import NodeStartup
from prewarm_agent.tasks import NodeTasks
from tests.unit.agent.test_startup_taint_fails_open import FakeRuntime, NodeApi

QUEUE = "https://sqs.us-west-2.amazonaws.com/1/prewarm-node-node-a"


class SlowStatus:
    """A status queue whose first send waits for `release`, and which refuses while `refusing`."""

    def __init__(self) -> None:
        self.sent: list[Hello] = []
        self.sending = threading.Event()
        self.release = threading.Event()
        self.refusing = False

    def send(self, message: FromAgent) -> None:
        if self.refusing:
            raise QueueError("ServiceUnavailable")
        if not self.sent and not self.sending.is_set():
            self.sending.set()
            assert self.release.wait(5)
        assert isinstance(message, Hello)
        self.sent.append(message)


def startup(status: SlowStatus) -> NodeStartup:
    cfg = AgentSettings.from_env(
        {
            "NODE_NAME": "node-a",
            "NODE_QUEUE_PREFIX": "prewarm-node",
            "AWS_REGION": "us-west-2",
            "STATUS_QUEUE_URL": QUEUE,
        }
    )
    return NodeStartup(
        cfg,
        images=FakeRuntime(),
        node_writes=NodeApi(),
        status=status,
        tasks=NodeTasks(),
        clock=SystemClock(),
        metrics=AgentMetrics(lambda: 0, CollectorRegistry()),
        stop=threading.Event(),
        logger=NodeLogger(logging.getLogger("test"), {}),
    )


def sending_first_hello(status: SlowStatus) -> tuple[NodeStartup, threading.Thread]:
    """A node's start, its first hello's send under way (held by `status`)."""
    node = startup(status)
    first = threading.Thread(target=node.begin, args=(QUEUE, NodeFacts(name="node-a", from_api=True)))
    first.start()
    assert status.sending.wait(5)
    return node, first


def test_a_hello_being_sent_is_not_sent_again_by_the_queue_waits_retry() -> None:
    status = SlowStatus()
    node, first = sending_first_hello(status)
    # While the first send is under way, the queue wait retries the hello not yet sent
    retry = threading.Thread(target=node.send_hello)
    retry.start()
    status.release.set()
    first.join(5)
    retry.join(5)
    assert len(status.sent) == 1


def test_a_newer_hello_is_not_cleared_by_an_older_ones_send() -> None:
    status = SlowStatus()
    node, first = sending_first_hello(status)
    # The Node answers with its labels while the first hello is being sent, and the queue refuses for now
    status.refusing = True
    newer = threading.Thread(target=node.say_hello_again)
    node._said = Hello(node="node-a", labels={"pool": "gpu"}, architecture="amd64", os="linux", queue_url=QUEUE)
    newer.start()
    time.sleep(0.2)  # the newer hello's send has been tried (or waits for the first)
    status.release.set()
    first.join(5)
    newer.join(5)
    status.refusing = False
    # The heartbeat's next send still has the newer hello to give
    node.send_hello()
    assert [h.labels for h in status.sent][-1] == {"pool": "gpu"}
