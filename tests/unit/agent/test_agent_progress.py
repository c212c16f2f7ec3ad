"""The agent's progress sampler: byte reports from containerd's downloads, elapsed time without them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from prewarm.domain.messages import Hello, StatusReport
from prewarm_agent.agent import Agent
from prewarm_agent.cri.errors import CriError
from prewarm_agent.node import NodeFacts
from prewarm_agent.pulls import TaskRun
from prewarm_agent.settings import AgentSettings
from tests.support.agent import NEVER, FakeCall, FakeCredentials, FakeRuntime, Ingest, NoLayers, make_run, make_task
from tests.support.clock import Clock

LAYER = "sha256:" + "a" * 64


class Content:
    def __init__(self, ingests: Sequence[Ingest] | None) -> None:
        self.ingests = ingests

    def list_statuses(self, filters: Sequence[str] = ()) -> Sequence[Ingest]:
        if self.ingests is None:
            raise CriError("listing ingest statuses failed (UNIMPLEMENTED): unknown service", code="UNIMPLEMENTED")
        return self.ingests


class Status:
    def __init__(self) -> None:
        self.sent: list[StatusReport | Hello] = []

    def send(self, message: StatusReport | Hello) -> None:
        self.sent.append(message)



def make_agent(content: Content, clock: Clock, status: Status) -> Agent:
    settings = AgentSettings.from_env({
        "NODE_NAME": "node-a", "NODE_QUEUE_PREFIX": "prewarm-node", "AWS_REGION": "us-west-2",
        "STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status",
    })
    return Agent(settings, cri=FakeRuntime(), content=content, sqs=object(), status=status, clock=clock,
                 credentials=FakeCredentials(), manifests=NoLayers(),
                 node=lambda: NodeFacts(name="node-a"))


def pulling(agent: Agent, clock: Clock) -> TaskRun:
    run = make_run(make_task())
    agent.pulls.join(run, ("registry.example.com/team/app:v1", "anonymous"), lambda: FakeCall(NEVER))
    run.begin_attempt(1, clock.time())
    return run


def test_a_running_pull_reports_its_layer_bytes() -> None:
    clock, status = Clock(), Status()
    agent = make_agent(Content([Ingest(f"layer-{LAYER}", 300, 1000)]), clock, status)
    pulling(agent, clock)
    clock.advance(7)

    agent.report_progress()

    (report,) = status.sent
    assert isinstance(report, StatusReport)
    assert (report.phase, report.bytes_done, report.bytes_total, report.attempt) == ("Pulling", 300, 1000, 1)
    assert report.message == "300 of 1000 bytes after 7s"


def test_without_the_content_api_reports_carry_the_elapsed_time_and_it_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="prewarm_agent")
    clock, status = Clock(), Status()
    agent = make_agent(Content(None), clock, status)
    pulling(agent, clock)

    clock.advance(5)
    agent.report_progress()
    clock.advance(5)
    agent.report_progress()

    assert [(r.bytes_done, r.message) for r in status.sent if isinstance(r, StatusReport)] == [
        (None, "pulling for 5s"), (None, "pulling for 10s")
    ]
    assert [r.seq for r in status.sent if isinstance(r, StatusReport)] == [1, 2]
    warnings = [r.getMessage() for r in caplog.records if "content API is unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "elapsed time only" in warnings[0]


def test_a_cancelled_run_sends_no_more_progress() -> None:
    clock, status = Clock(), Status()
    agent = make_agent(Content([]), clock, status)
    run = pulling(agent, clock)
    run.cancel("job deleted")

    agent.report_progress()

    assert status.sent == []


def test_a_task_between_attempts_still_reports_so_the_control_plane_hears_from_its_agent() -> None:
    clock, status = Clock(), Status()
    agent = make_agent(Content([]), clock, status)
    run = make_run(make_task())
    run.begin_attempt(1, clock.time())  # the attempt failed; the retry sleeps or waits for a pull slot
    agent._runs[run.key] = run

    agent.report_progress()
    agent.report_progress()

    reports = [r for r in status.sent if isinstance(r, StatusReport)]
    assert [(r.phase, r.attempt, r.seq) for r in reports] == [("Pulling", 1, 1), ("Pulling", 1, 2)]
    assert reports[0].message == "attempt 1 ended; waiting for the next"


def test_a_task_waiting_out_a_registry_s_429_keeps_reporting_it_is_throttled() -> None:
    clock, status = Clock(), Status()
    agent = make_agent(Content([]), clock, status)
    run = make_run(make_task())
    run.begin_attempt(1, clock.time())
    run.throttled = "throttled by the registry, retrying in 4s (not counted toward backoffLimit): 429"
    agent._runs[run.key] = run

    agent.report_progress()

    (report,) = [r for r in status.sent if isinstance(r, StatusReport)]
    assert (report.phase, report.attempt, report.message) == ("Pulling", 1, run.throttled)


def test_a_task_not_started_yet_sends_nothing() -> None:
    clock, status = Clock(), Status()
    agent = make_agent(Content([]), clock, status)
    run = make_run(make_task())
    agent._runs[run.key] = run

    agent.report_progress()

    assert status.sent == []
