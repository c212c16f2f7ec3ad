"""`ControlPlane`: the table and queues of a stack, driven as the dispatch function and the agents would."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.messages import NodeBound, StatusReport, parse_node_message
from prewarm.services.dispatch import PlanResult, plan_job
from prewarm.services.jobs import complete_deletion
from prewarm.services.ports import JobStore, ScheduleRuns, TaskQueues
from prewarm.services.reports import ReportOutcome, record_report
from prewarm.services.warming import send_required_images
from tests.support.clock import Clock
from tests.support.cluster import FakeCluster
from tests.support.memory_queues import MemorySqs, MemoryTaskQueues
from tests.support.memory_store import MemoryJobStore


class Store(JobStore, ScheduleRuns, Protocol):
    """The job table as the tests drive it: every item kind and the schedule runs (`DynamoJobStore`,
    `MemoryJobStore`)."""


class AgentQueues(TaskQueues, Protocol):
    """The node queues as the tests drive them: the control plane's port, and what agents do with their
    queues (`NodeQueues`, `MemoryTaskQueues`)."""

    prefix: str

    def ensure_queue(self, node: str) -> str: ...
    def queue_name(self, node: str, cluster: str | None = None) -> str: ...
    def queue_url(self, node: str, cluster: str | None = None) -> str: ...


def take_node_messages(sqs: Any, url: str) -> list[NodeBound]:
    """Takes every message off a node queue, parsed (none when the queue was never created): of a
    `MemorySqs`, or of an SQS client."""
    if isinstance(sqs, MemorySqs):
        return sqs.take(url)
    got: list[NodeBound] = []
    while True:
        try:
            # Node queues long-poll by default: ask for what is there now.
            batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        except sqs.exceptions.QueueDoesNotExist:
            return got
        if not batch:
            return got
        for message in batch:
            got.append(parse_node_message(message["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


@dataclass
class ControlPlane:
    """A job store and node queues, with `plan` standing in for the dispatch function, `report` for the
    agents' reports, and `node_messages` for what an agent would receive. `clock` gives each call's time.

    Every node of `cluster` runs an agent unless named in `agentless`: its queue exists before each plan,
    as the control plane makes it on the agent's hello."""

    store: Store
    queues: AgentQueues
    sqs: Any  # a MemorySqs, or the SQS client of the queues (node_messages takes messages off them)
    cluster: FakeCluster = field(default_factory=FakeCluster)
    clock: Callable[[], float] = time.time
    agentless: set[str] = field(default_factory=set)
    _seq: int = 0

    def now(self) -> float:
        return self.clock()

    def start_agents(self) -> None:
        """Each agent's queue, as the control plane makes it on the agent's hello."""
        for node in self.cluster.nodes:
            if (name := node["metadata"]["name"]) not in self.agentless:
                self.queues.ensure_queue(name)

    def plan(self, name: str, namespace: str = "default", *, remove_after: int | None = None) -> PlanResult:
        """What dispatch_job does (bootstrap.plan_job): the plan, then warming nodes' lists when it asks."""
        self.start_agents()
        result = plan_job(self.store, self.cluster, self.queues, job_key(namespace, name), now=self.now(),
                          remove_after=remove_after)
        if result.changes_warming:
            result.send_failures += send_required_images(self.store, self.queues, self.cluster, now=self.now())
        return result

    def report(self, name: str, node: str, phase: str, namespace: str = "default", **fields: Any) -> ReportOutcome:
        record = self.store.get_job(job_key(namespace, name))
        assert record is not None, f"no job {namespace}/{name}"
        self._seq += 1
        report = StatusReport(job=record.key, job_uid=record.uid, round=record.round, node=node, phase=phase,
                              attempt=fields.pop("attempt", 1), seq=self._seq, **fields)
        return record_report(self.store, self.queues, report, now=self.now())

    def finish_deletions(self) -> list[str]:
        """What dispatch_job does with the stream records of jobs marked Deleting: cancels, then removal."""
        keys = [r.key for r in self.store.list_jobs() if r.state == JobState.DELETING]
        for key in keys:
            complete_deletion(self.store, self.queues, key)
        return keys

    def node_messages(self, node: str) -> list[NodeBound]:
        """Takes every message off a node's queue (none when the queue was never created)."""
        return take_node_messages(self.sqs, self.queues.queue_url(node))


def memory_plane(cluster: FakeCluster | None = None, *, prefix: str = "pw",
                 clock: Callable[[], float] | None = None) -> ControlPlane:
    """A control plane on a `MemoryJobStore` and `MemoryTaskQueues` of its own; by default every call's time
    is a second after the last one's."""
    sqs = MemorySqs()
    status = sqs.create_queue("prewarm-status")
    dlq = sqs.create_queue("prewarm-nodes-dlq")
    return ControlPlane(
        store=MemoryJobStore(),
        queues=MemoryTaskQueues(prefix, status, dlq_arn=f"arn:aws:sqs:us-west-2:123456789012:{dlq.rsplit('/', 1)[1]}",
                                sqs=sqs, cluster=DEFAULT_CLUSTER),
        sqs=sqs,
        cluster=cluster if cluster is not None else FakeCluster(),
        clock=clock if clock is not None else Clock(1_800_000_000, tick=1),
    )
