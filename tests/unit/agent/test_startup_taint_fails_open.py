"""The startup taint fails open: an agent that cannot reach its queue, or may not use it, never keeps its
node tainted past MAX_WARM_SECONDS counted from the node's join, and one that cannot start at all
removes the taint at once (issue #25: Prewarm must never make a cluster less available than without it)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.sqs import QueueError, QueueRetryableError
from prewarm.domain.warming import StartupTaint
from prewarm_agent.agent import Agent
from prewarm_agent.node import NodeFacts
from prewarm_agent.settings import AgentSettings
from prewarm_agent.warming import EVENT_REASON
from tests.support.agent import FakeCredentials, FakeRuntime, NoContent, NoLayers
from tests.support.waiting import eventually

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
MAX_WARM = 2




class NodeApi:
    """The agent's own Node, as its service account reads and patches it."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "node-a"}, "spec": {"taints": [dict(TAINT)]}}
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        with self.lock:
            return {**self.node, "spec": {"taints": list(self.node["spec"].get("taints", []))}}

    def patch(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            taints = self.node["spec"]["taints"]
            self.node["spec"]["taints"] = [t for t in taints if not StartupTaint("prewarm.dev/warming").matches(t)]
            return self.node

    def event(self, body: dict[str, Any]) -> None:
        self.events.append(body)

    @property
    def tainted(self) -> bool:
        return bool(self.read()["spec"]["taints"])


def settings(status_url: str, endpoint: str | None = None) -> AgentSettings:
    values = {"NODE_NAME": "node-a", "NODE_QUEUE_PREFIX": "prewarm-node", "AWS_REGION": "us-west-2",
              "STATUS_QUEUE_URL": status_url, "HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": "0",
              "RECEIVE_WAIT_SECONDS": "1", "MAX_WARM_SECONDS": str(MAX_WARM)}
    if endpoint:
        values["AWS_ENDPOINT_URL"] = endpoint
    return AgentSettings.from_env(values)


def agent(cfg: AgentSettings, sqs: Any, api: NodeApi, joined_at: float) -> Agent:
    facts = NodeFacts(name="node-a", from_api=True, taints=(dict(TAINT),), created_at=joined_at)
    return Agent(cfg, cri=FakeRuntime(), content=NoContent(), sqs=sqs, credentials=FakeCredentials(),
                 manifests=NoLayers(), node=lambda: facts, node_writes=api)


def test_an_agent_that_cannot_reach_its_queue_removes_the_taint_at_the_deadline_from_the_join() -> None:
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
        # Given a node that joined with the startup taint 1 s ago, and no route to SQS (no VPC endpoint)
        api = NodeApi()
        joined = time.time() - 1
        max_warm = 6.0  # seconds enough for the agent's start to show its queue error on a loaded machine
        node_agent = agent(settings(status).model_copy(update={"max_warm_seconds": max_warm}), sqs, api, joined)

        def unreachable(node: str, cluster: str | None = None) -> str:
            raise QueueRetryableError("Could not connect to the endpoint URL: https://sqs.us-west-2.amazonaws.com/")

        node_agent.node_queues.find_queue = unreachable  # type: ignore[method-assign]
        starting = threading.Thread(target=node_agent.start, daemon=True)
        starting.start()
        try:
            # Then the agent keeps trying its queue, and the node keeps its taint until MAX_WARM_SECONDS ...
            assert eventually(lambda: "Could not connect" in (node_agent.readiness() or ""), 5)
            assert api.tainted
            # ... counted from the join, not from the agent's start, after which pods can schedule
            assert eventually(lambda: not api.tainted, timeout=max_warm + 3)
            assert time.time() - joined >= max_warm
            assert node_agent.queue is None  # still trying the queue: it comes up when SQS does
            assert eventually(lambda: bool(api.events), 5)  # posted right after the taint goes
            (event,) = api.events
            assert event["reason"] == EVENT_REASON and "no list of required images" in event["message"]
        finally:
            node_agent.request_stop()
            node_agent.stop(0)
            starting.join(timeout=10)


def test_an_agent_refused_its_queue_removes_the_taint_at_once_and_fails() -> None:
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
        api = NodeApi()
        node_agent = agent(settings(status), sqs, api, time.time())

        def refused(node: str, cluster: str | None = None) -> str:
            raise QueueError(f"AccessDenied: not authorized to perform sqs:GetQueueUrl for {node}")

        node_agent.node_queues.find_queue = refused  # type: ignore[method-assign]
        # When its role may not use its queue (the agent policy not attached)
        with pytest.raises(QueueError, match="AccessDenied"):
            node_agent.start()
        try:
            # Then the taint is gone at once, well before MAX_WARM_SECONDS, with an Event saying why
            assert not api.tainted
            (event,) = api.events
            assert "before maxWarmSeconds, so pods can schedule: the agent cannot start: AccessDenied" in (
                event["message"])
            assert node_agent.metrics.sample("prewarm_agent_startup_taint_removals_total",
                                             {"outcome": "timeout"}) == 1
        finally:
            node_agent.stop(0)


def test_a_taint_that_cannot_be_removed_does_not_hide_why_the_agent_cannot_start() -> None:
    from prewarm_agent.node import NodeReadError

    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
        api = NodeApi()

        def refused_patch(ops: list[dict[str, Any]]) -> dict[str, Any]:
            raise NodeReadError("the API server refused the patch: 503 Service Unavailable", status=503)

        api.patch = refused_patch  # type: ignore[method-assign]
        node_agent = agent(settings(status), sqs, api, time.time())

        def refused(node: str, cluster: str | None = None) -> str:
            raise QueueError(f"AccessDenied: not authorized to perform sqs:GetQueueUrl for {node}")

        node_agent.node_queues.find_queue = refused  # type: ignore[method-assign]
        # When neither its queue nor its Node may be written, the queue's refusal is what it fails with
        with pytest.raises(QueueError, match="AccessDenied"):
            node_agent.start()
        node_agent.stop(0)
        assert api.tainted  # left to the sweep, after the deadline



def test_an_agent_whose_node_read_fails_at_start_reads_it_again_and_removes_the_taint_by_the_deadline() -> None:
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")
        status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
        api = NodeApi()
        joined = time.time()
        reads: list[float] = []

        def node() -> NodeFacts:
            # Given an API that fails the agent's first two reads of its Node (at start, and 1 s later)
            reads.append(time.time())
            if len(reads) <= 2:
                return NodeFacts(name="node-a", architecture="amd64")  # the local guesses: no taint known
            return NodeFacts(name="node-a", labels={"pool": "gpu"}, from_api=True, taints=(dict(TAINT),),
                             created_at=joined)

        cfg = settings(status).model_copy(update={"max_warm_seconds": 5.0})
        node_agent = Agent(cfg, cri=FakeRuntime(), content=NoContent(), sqs=sqs, credentials=FakeCredentials(),
                           manifests=NoLayers(), node=node, node_writes=api)
        node_agent.start()
        sent: list[dict[str, Any]] = []

        def hellos() -> list[dict[str, Any]]:
            for message in sqs.receive_message(QueueUrl=status, MaxNumberOfMessages=10).get("Messages", []):
                sent.append(json.loads(message["Body"]))
            return [m for m in sent if m["kind"] == "hello"]

        try:
            # Then the agent reads its Node again until it answers, and holds the taint it finds ...
            assert eventually(lambda: node_agent.warming is not None, 6)
            assert len(reads) == 3 and api.tainted
            # ... says hello again, with the Node's labels and the deadline from the node's join ...
            assert eventually(lambda: len(hellos()) == 2, 3)
            first, second = hellos()
            assert (first["labels"], first.get("warm_until")) == ({}, None)
            assert second["labels"] == {"pool": "gpu"} and second["warm_until"] == pytest.approx(joined + 5)
            # ... and removes the taint at MAX_WARM_SECONDS from the join, though its first read failed
            assert eventually(lambda: not api.tainted, timeout=8)
            assert time.time() - joined >= 5
        finally:
            node_agent.request_stop()
            node_agent.stop(0)
