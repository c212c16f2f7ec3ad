"""How the agent answers for its tasks: status reports sent, a few tries each, and the task messages
deleted once answered or released for another agent."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from prewarm.adapters.sqs import QueueError
from prewarm.domain.messages import FromAgent, StatusReport
from prewarm_agent.clock import Clock
from prewarm_agent.logs import NodeLogger
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.pulls import Delivery
from prewarm_agent.queue import TaskQueue

_REPORT_TRIES = 3


class StatusSink(Protocol):
    """Where reports and the hello go (`StatusQueue`)."""

    def send(self, message: FromAgent) -> None: ...


class Reports:
    """Sends reports to the status queue and deletes or releases task messages on the node queue."""

    def __init__(self, status: StatusSink, *, metrics: AgentMetrics, clock: Clock, stop: threading.Event,
                 logger: NodeLogger) -> None:
        self.status = status
        self.metrics = metrics
        self.clock = clock
        self._stop = stop  # cuts the pause between tries short
        self.log = logger
        self.queue: TaskQueue | None = None  # the node queue, once set up

    def send(self, report: StatusReport) -> bool:
        for attempt in range(1, _REPORT_TRIES + 1):
            try:
                self.status.send(report)
                return True
            except QueueError as e:
                if attempt == _REPORT_TRIES:
                    self.metrics.reports_failed.inc()
                    self.log.error("%s report not sent, the task message will come back: %s", report.phase, e,
                                   extra={"job": report.job, "round": report.round})
                    return False
                self.clock.wait(self._stop, 0.5 * attempt)
        return False

    def delete(self, deliveries: Sequence[Delivery]) -> None:
        if self.queue is not None and deliveries:
            for failure in self.queue.delete(deliveries):
                self.log.warning("message not deleted, it will come back and be answered again: %s", failure)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        if self.queue is not None and deliveries:
            for failure in self.queue.set_visibility(deliveries, 0):
                self.log.warning("message not released: %s", failure)
