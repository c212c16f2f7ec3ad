"""What an idle agent costs: its long polls and nothing else, counted request by request over a
simulated day, with the kubelet probing `/readyz` as the DaemonSet says."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml
from botocore.exceptions import ClientError

from prewarm_agent.agent import Agent
from prewarm_agent.node import NodeFacts
from prewarm_agent.settings import AgentSettings
from tests.support.agent import CountingSqs, FakeCredentials, FakeRuntime, NoContent, NoLayers
from tests.support.clock import Clock
from tests.support.waiting import eventually

DAY = 86_400
DAEMONSET = Path(__file__).parents[3] / "cli" / "prewarm_cli" / "install" / "manifests" / "40-daemonset.yaml"


def readiness_period() -> int:
    """The kubelet's readiness probe period for the agent, from the shipped DaemonSet."""
    (container,) = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"]
    return int(container["readinessProbe"]["periodSeconds"])




def idle_agent(sqs: CountingSqs, clock: Clock) -> Agent:
    settings = AgentSettings.from_env({
        "NODE_NAME": "node-a", "NODE_QUEUE_PREFIX": "prewarm-node", "AWS_REGION": "us-west-2",
        "STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status",
        "HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": "0",
        # The background loops run on real time: ticking every 10 ms, each ticks hundreds of times
        # during the test, and any request one made while idle would be counted.
        "HEARTBEAT_INTERVAL_SECONDS": "0.01", "PROGRESS_INTERVAL_SECONDS": "0.01",
    })
    return Agent(settings, cri=FakeRuntime(), content=NoContent(), sqs=sqs, clock=clock,
                 credentials=FakeCredentials(), manifests=NoLayers(), node=lambda: NodeFacts(name="node-a"))


def probe(agent: Agent, path: str = "/readyz") -> tuple[int, str]:
    """What the probe answers (the HTTP server answers the same; unit tests run with the network off,
    tests/integration/agent probe it over HTTP)."""
    problem = agent.readiness() if path == "/readyz" else agent.liveness()
    return (503, f"{problem}\n") if problem else (200, "ok\n")


def test_an_idle_agent_makes_only_its_long_polls_4320_requests_a_day() -> None:
    # Given an agent on an empty queue, probed for readiness every period of the DaemonSet's probe
    clock = Clock()
    period = readiness_period()
    day_over = threading.Event()
    probes: list[int] = []
    day: dict[str, Any] = {}

    def kubelet() -> None:
        if not day:
            # The day starts with the first long poll (which just moved the clock by its 20 s).
            day.update(start=clock.now - 20, next_probe=clock.now - 20 + period,
                       at_start={**sqs.requests, "ReceiveMessage": sqs.requests["ReceiveMessage"] - 1})
        # The kubelet probes for every period that went by.
        while day["next_probe"] <= clock.now and not day_over.is_set():
            probes.append(probe(agent)[0])
            day["next_probe"] += period
        if clock.now - day["start"] >= DAY and not day_over.is_set():
            day["end"] = dict(sqs.requests)
            day_over.set()

    sqs = CountingSqs(clock, on_receive=kubelet)
    agent = idle_agent(sqs, clock)

    # When a simulated day passes
    agent.start()
    try:
        assert day_over.wait(120), f"the simulated day did not end: {sqs.requests}"
    finally:
        agent.stop(0)

    # Then the day's only requests are the 20-second long polls: 86400 / 20 = 4320
    at_start = day["at_start"]
    during = {k: v - at_start.get(k, 0) for k, v in day["end"].items() if v - at_start.get(k, 0)}
    assert during == {"ReceiveMessage": DAY // 20}
    # ... while /readyz answered 200 to every one of the kubelet's probes
    assert len(probes) == DAY // period and set(probes) == {200}
    # ... and starting cost one CreateQueue and the hello
    assert {k: v for k, v in at_start.items() if v} == {"GetQueueUrl": 1, "SendMessage": 1}


def test_readyz_answers_from_the_outcome_of_the_last_receive() -> None:
    # Given a running agent whose long polls answer
    clock = Clock()
    received = threading.Event()
    sqs = CountingSqs(clock, on_receive=received.set)
    agent = idle_agent(sqs, clock)
    agent.start()
    try:
        assert received.wait(5)
        assert probe(agent) == (200, "ok\n")

        # When a receive fails
        denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized"}}, "ReceiveMessage")
        sqs.failures.append(denied)
        answers: list[tuple[int, str]] = []
        assert eventually(lambda: answers.append(probe(agent)) or answers[-1][0] == 503, timeout=5)
        status, body = answers[-1]

        # Then /readyz says why, without asking SQS anything
        assert status == 503
        assert "receive from" in body and "AccessDenied: not authorized" in body
        assert "GetQueueAttributes" not in sqs.requests
        # ... and is ready again once a receive answers
        assert eventually(lambda: probe(agent) == (200, "ok\n"), timeout=10)
        assert probe(agent, "/healthz") == (200, "ok\n")
    finally:
        agent.stop(0)
