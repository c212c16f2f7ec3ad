"""fleet.py's simulated agents: each receives `PullTask`s from its node queue and reports its pulls as
`prewarm_agent` does (progress, failures, a restart mid-pull)."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fleet_moto import Json, SimClock
from prewarm_agent.running import SHUTDOWN_MESSAGE

NAMESPACE = "default"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/inference@sha256:" + "7" * 64
IMAGE_BYTES = 12 * 2**30
PROGRESS_EVERY_S = 5
START_SPREAD_S = 5.0
# A held task stays invisible for as long as its agent pulls it, as prewarm_agent's heartbeat keeps
# it; otherwise a pull that outlasts the visibility (a simulated second can take many wall seconds at
# 5,000 nodes) is delivered again and, after 5 receives, moved to the node DLQ. SQS's visibility runs
# on wall time here, not simulated time, so the agent's own rhythm (120 s every 40 s) would spend 125
# moto calls a wall second on 5,000 held tasks; the simulated agent extends a task a third of the
# queue's visibility (120 s) after receiving it, to HELD_VISIBILITY_S of wall time, and again 80 s
# before that runs out. What is tested stays: a held task never comes back, a released one at once.
NODE_QUEUE_VISIBILITY_S = 120
HELD_VISIBILITY_S = 900


@dataclass
class Pull:
    """One task's pull on one simulated node, as `prewarm_agent`'s TaskRun goes through it."""

    task: Any  # PullTask
    queue_url: str
    receipts: list[str]
    start: float
    end: float
    fails: bool
    restart_at: float | None = None
    attempt: int = 1
    seq: int = 0
    next_progress: float = 0.0
    begun: bool = False  # the attempt's first Pulling report was sent
    # Wall clock (monotonic) at which the held task's visibility runs out: the queue's own at receipt.
    visible_at: float = field(default_factory=lambda: time.monotonic() + NODE_QUEUE_VISIBILITY_S)

    def report(self, phase: str, clock: SimClock, **fields: Any) -> Any:
        from prewarm.domain.messages import StatusReport

        self.seq += 1
        return StatusReport.model_validate({
            "job": self.task.job, "job_uid": self.task.job_uid, "round": self.task.round, "node": self.task.node,
            "phase": phase, "attempt": self.attempt, "seq": self.seq, "started_at": clock.epoch_of(self.start),
            **fields,
        })


@dataclass
class Agents:
    """Every node's agent: receives tasks, sends the reports due each simulated second."""

    clock: SimClock
    rng: random.Random
    pull_median_s: float
    pull_sigma: float
    failures: float
    disorder: float
    image_present: bool = False
    restart_one: bool = True
    runs: dict[tuple[str, str, int], Pull] = field(default_factory=dict)
    done: dict[tuple[str, str, int], Any] = field(default_factory=dict)  # the final report, answered again
    final_phase: dict[str, str] = field(default_factory=dict)
    held: list[tuple[float, Any]] = field(default_factory=list)  # reports held back (reordered)
    restarted: str = ""
    duplicated: int = 0
    reordered: int = 0

    def receive(self, task: Any, queue_url: str, receipt: str, t: float) -> tuple[list[Any], list[tuple[str, str]]]:
        """A delivered task: (reports to send, messages to delete)."""
        key = (task.node, task.job_uid, task.round)
        if key in self.runs:  # a duplicate delivery joins the run
            self.runs[key].receipts.append(receipt)
            return [], []
        if key in self.done:  # answered before: answer again, then delete
            return [self.done[key]], [(queue_url, receipt)]
        if self.image_present:
            pull = Pull(task, queue_url, [receipt], t, t, False, attempt=0)
            report = pull.report("Succeeded", self.clock, message="image already present",
                                 image_id="sha256:" + "7" * 64, finished_at=self.clock.epoch_of(t))
            self.done[key] = report
            self.final_phase[task.node] = "Succeeded"
            return [report], [(queue_url, receipt)]
        # The long poll returns, then credentials, the disk check and the CRI call: the attempt starts.
        start = t + self.rng.uniform(0.0, START_SPREAD_S)
        duration = max(5.0, self.rng.lognormvariate(math.log(self.pull_median_s), self.pull_sigma))
        fails = self.rng.random() < self.failures
        end = start + (duration * self.rng.uniform(0.2, 1.0) if fails else duration)
        pull = Pull(task, queue_url, [receipt], start, end, fails, next_progress=start + PROGRESS_EVERY_S)
        if self.restart_one and not self.restarted and not fails and duration > 4 * PROGRESS_EVERY_S:
            self.restarted = task.node
            pull.restart_at = start + duration / 2
        self.runs[key] = pull
        return [], []

    def step(self, t: float) -> tuple[list[Any], list[tuple[str, str]], list[tuple[str, str]]]:
        """Reports due by simulated second `t`: (reports, messages to delete, messages to release)."""
        reports: list[Any] = []
        deletes: list[tuple[str, str]] = []
        releases: list[tuple[str, str]] = []
        for key, pull in list(self.runs.items()):
            if pull.start > t:
                continue
            if not pull.begun:
                pull.begun = True
                reports.append(pull.report("Pulling", self.clock, bytes_done=0, bytes_total=IMAGE_BYTES))
            while pull.next_progress <= t and pull.next_progress < pull.end and (
                    pull.restart_at is None or pull.next_progress < pull.restart_at):
                done = int(IMAGE_BYTES * (pull.next_progress - pull.start) / (pull.end - pull.start))
                reports.append(pull.report("Pulling", self.clock, bytes_done=done, bytes_total=IMAGE_BYTES))
                pull.next_progress += PROGRESS_EVERY_S
            if pull.restart_at is not None and pull.restart_at <= t:
                # The agent stops: its pull reports Pulling (no final phase: the restarted agent pulls again, as
                # `prewarm_agent.running` does) and the message is released for the next run.
                reports.append(pull.report("Pulling", self.clock, message=SHUTDOWN_MESSAGE))
                releases += [(pull.queue_url, r) for r in pull.receipts[-1:]]
                del self.runs[key]
                continue
            if pull.end <= t:
                phase = "Failed" if pull.fails else "Succeeded"
                fields: Json = {"finished_at": self.clock.epoch_of(pull.end), "bytes_total": IMAGE_BYTES}
                if pull.fails:
                    fields["message"] = (f"rpc error: code = Unknown desc = failed to pull and unpack image "
                                         f"\"{pull.task.image}\": 500 Internal Server Error")
                else:
                    fields.update(bytes_done=IMAGE_BYTES, image_id="sha256:" + "7" * 64, size_bytes=IMAGE_BYTES)
                report = pull.report(phase, self.clock, **fields)
                reports.append(report)
                deletes += [(pull.queue_url, r) for r in pull.receipts]
                self.done[key] = report
                self.final_phase[pull.task.node] = phase
                del self.runs[key]
        return self._disorder(reports, t), deletes, releases

    def _disorder(self, reports: list[Any], t: float) -> list[Any]:
        out = [r for due, r in self.held if due <= t]
        self.held = [(due, r) for due, r in self.held if due > t]
        for report in reports:
            roll = self.rng.random()
            if roll < self.disorder / 2:
                out += [report, report]
                self.duplicated += 1
            elif roll < self.disorder:
                self.held.append((t + self.rng.randint(2, 6), report))
                self.reordered += 1
            else:
                out.append(report)
        return out

    @property
    def idle(self) -> bool:
        return not self.runs and not self.held


def cluster_of_message(body: str) -> str:
    """The cluster an agent's message is about: a report's job key names it, a hello names it itself."""
    from prewarm.domain.keys import JobKey

    message = json.loads(body)
    return str(message.get("cluster") or JobKey.parse(str(message["job"])).cluster)
