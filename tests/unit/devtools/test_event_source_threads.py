"""Local mode delivers each event source on its own thread, as Lambda polls each mapping on its own: a
handler stuck on one source's batch does not hold up another source's delivery, `stop` leaves no
source's thread running, and the rate schedules say how long until the next fires."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm_devtools.sam import event_sources
from prewarm_devtools.sam.event_sources import EventSources
from prewarm_devtools.sam.intrinsics import Physical
from prewarm_devtools.sam.invocation import Function


class QueueSources(EventSources):
    """One function per queue, each bound to its queue as an SQS event source; `invoke` runs `handlers`."""

    def __init__(self, sqs: Any, handlers: Mapping[str, Any]) -> None:
        self.region, self.sqs, self.streams, self.event_bus_url = "us-west-2", sqs, None, ""
        self._cursors, self._threads, self._stop = {}, [], threading.Event()
        self.handlers = dict(handlers)
        self.queues: dict[str, Physical] = {}
        self.functions = {}
        for name in handlers:
            url = sqs.create_queue(QueueName=name)["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            self.queues[arn] = Physical(ref=url, attrs={"Arn": arn, "QueueUrl": url})
            self.functions[name] = Function(
                logical_id=name, name=name, code_dir=Path("."), handler="app.handler", env={}, timeout=3, memory=128,
                events={"Queue": {"Type": "SQS", "Properties": {"EventSourceArn": arn, "BatchSize": 10}}})

    def _queue_by_arn(self, arn: str, where: str) -> Physical:
        return self.queues[arn]

    def function(self, name: str) -> Function:
        return self.functions[name]

    def invoke(self, name: str, event: Mapping[str, Any]) -> Any:
        return self.handlers[name](event)

    def send(self, name: str) -> None:
        url = next(q.ref for q in self.queues.values() if q.ref.endswith(f"/{name}"))
        self.sqs.send_message(QueueUrl=url, MessageBody="{}")


@pytest.fixture
def sqs() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs", region_name="us-west-2", aws_access_key_id="t", aws_secret_access_key="t")


def test_a_handler_stuck_on_one_source_does_not_delay_another_sources_delivery(sqs: Any) -> None:
    release, stuck, delivered = threading.Event(), threading.Event(), threading.Event()

    def slow(event: Any) -> None:
        stuck.set()
        release.wait(30)

    sources = QueueSources(sqs, {"slow": slow, "quick": lambda event: delivered.set()})
    sources.send("slow")
    sources.start(schedules=False, interval=0.05)
    try:
        assert stuck.wait(5), "the slow source was never delivered"
        sources.send("quick")
        started = time.monotonic()
        assert delivered.wait(5), "the quick source waited for the slow source's handler"
        assert time.monotonic() - started < 2
    finally:
        release.set()
        sources.stop()


def test_stop_leaves_no_event_source_thread_running(sqs: Any) -> None:
    sources = QueueSources(sqs, {"a": lambda event: None, "b": lambda event: None})
    sources.functions["timer"] = Function(
        logical_id="timer", name="timer", code_dir=Path("."), handler="app.handler", env={}, timeout=3, memory=128,
        events={"Tick": {"Type": "Schedule", "Properties": {"ScheduleExpression": "rate(1 minute)"}}})
    sources.start(interval=0.05)
    assert {t.name for t in threading.enumerate()} >= {"esm-a/Queue", "esm-b/Queue", "esm-event-bus",
                                                        "esm-timer/schedule"}
    started = time.monotonic()
    sources.stop()  # the schedule's timer, a minute away, ends at once too
    assert time.monotonic() - started < 2
    assert not [t.name for t in threading.enumerate() if t.name.startswith("esm-")]



def test_schedules_quiet_for_is_the_time_to_the_next_rate_schedule_and_0_while_one_runs(
        sqs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    running, release = threading.Event(), threading.Event()

    def tick(event: Any) -> None:
        running.set()
        release.wait(10)

    sources = QueueSources(sqs, {"a": lambda event: None})
    sources.handlers["timer"] = tick
    sources.functions["timer"] = Function(
        logical_id="timer", name="timer", code_dir=Path("."), handler="app.handler", env={}, timeout=3, memory=128,
        events={"Tick": {"Type": "Schedule", "Properties": {"ScheduleExpression": "rate(1 minute)"}}})
    assert sources.schedules_quiet_for() == float("inf")  # none started
    monkeypatch.setattr(event_sources, "parse_schedule", lambda expression, where: 0.5)  # a minute, brought near
    sources.start(interval=0.05)
    try:
        assert 0 < sources.schedules_quiet_for() <= 0.5
        assert running.wait(5), "the schedule never fired"
        assert sources.schedules_quiet_for() == 0  # running
        release.set()
        deadline = time.monotonic() + 5
        while sources.schedules_quiet_for() == 0:
            assert time.monotonic() < deadline, "the schedule's next firing was never set"
            time.sleep(0.01)
        assert 0 < sources.schedules_quiet_for() <= 0.5
    finally:
        release.set()
        sources.stop()
