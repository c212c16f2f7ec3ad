"""The control plane in-process on moto, agents played by the test, and a driver that behaves like AWS.

The driver delivers each input the way its event source does: an SQS report, a stream record, a
schedule or a CLI call that crashed is delivered again (Lambda retries, the user runs it again). After
every step it plays the table stream: a job item that needs planning gets `plan_job`. When the agents
have nothing left to do and a job is unfinished, it fires `sweep` five minutes later, as the
every-minute schedule would: that is how a task claimed but never sent reaches its node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import boto3

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import CancelTask, Hello, PullTask, StatusReport
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import JobNotFoundError, apply_manifest, complete_deletion, delete_job
from prewarm.services.reports import record_report, register_node
from prewarm.services.resources import ResourceApi, sync_resources
from prewarm.services.schedules import SweepSettings, repull_daily, sweep
from prewarm_devtools.sam.template import create_table, load_template
from tests.reliability.faults import FaultPlan, InjectedFault
from tests.reliability.invariants import FINISHED_STATES, job_state
from tests.support.aws import serial_mock_aws
from tests.support.clock import Clock
from tests.support.cluster import FakeCluster, make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import take_node_messages

REGION = "us-west-2"
T0 = 1_800_000_000.0
RESEND_AFTER = 300

T = TypeVar("T")
Outcome = Literal["Succeeded", "Failed", "Silent", "Absent"]


@functools.cache
def _template() -> dict[str, Any]:
    template: dict[str, Any] = load_template()
    return template


@contextmanager
def moto_aws() -> Iterator[tuple[Any, Any]]:
    """moto in-process with this test's credentials; yields DynamoDB and SQS clients."""
    with serial_mock_aws():
        yield (boto3.client("dynamodb", region_name=REGION, aws_access_key_id="testing",
                            aws_secret_access_key="testing"),
               boto3.client("sqs", region_name=REGION, aws_access_key_id="testing",
                            aws_secret_access_key="testing"))


class Plane:
    """One table, one status queue and one node queue prefix of their own, so runs never meet."""

    def __init__(self, ddb: Any, sqs: Any, run: str, *, plan: FaultPlan | None = None,
                 store_client: Any = None, sqs_client: Any = None) -> None:
        self.ddb, self.sqs, self.run = ddb, sqs, run
        self.table = f"jobs-{run}"
        create_table(ddb, _template(), self.table)
        status = sqs.create_queue(QueueName=f"status-{run}")["QueueUrl"]
        self.real_store = DynamoJobStore(self.table, client=store_client or ddb)
        self.real_queues = NodeQueues(f"pw{run}", status, client=sqs_client or sqs)
        self.plan = plan or FaultPlan()
        self.store: Any = self.plan.wrap("store", self.real_store)
        self.queues: Any = self.plan.wrap("queues", self.real_queues)
        self.cluster = FakeCluster()
        self.clock = Clock(T0, tick=1)

    def add_nodes(self, *names: str, **labels: str) -> list[str]:
        for name in names:
            node = make_node(name)
            node["metadata"]["labels"].update(labels)
            self.cluster.nodes.append(node)
            self.real_queues.ensure_queue(name)  # its agent starts: its hello makes its queue
        return list(names)

    def close(self) -> None:
        self.ddb.delete_table(TableName=self.table)
        for url in self.sqs.list_queues(QueueNamePrefix=f"pw{self.run}-").get("QueueUrls", []):
            self.sqs.delete_queue(QueueUrl=url)


@dataclass
class Agents:
    """Every node's agent: takes its messages, pulls (instantly) and reports as the real agent does.

    `outcomes` says how each node's pulls end, by node or by (node, round) (default Succeeded);
    `Silent` reports Pulling and then nothing, `Absent` never reports. A task redelivered for a pull
    already handled is not pulled again.
    """

    plane: Plane
    outcomes: dict[str | tuple[str, int], Outcome] = field(default_factory=dict)
    delivered: set[tuple[str, ...]] = field(default_factory=set)
    handled: set[tuple[str, str, int, str]] = field(default_factory=set)
    open_pulls: dict[tuple[str, str, int, str], int] = field(default_factory=dict)

    def take(self) -> list[PullTask | CancelTask]:
        got: list[PullTask | CancelTask] = []
        sqs = self.plane.sqs
        for url in sorted(sqs.list_queues(QueueNamePrefix=f"{self.plane.real_queues.prefix}-").get("QueueUrls", [])):
            got += take_node_messages(sqs, url)
        for msg in got:
            detail = msg.reason if isinstance(msg, CancelTask) else ""
            self.delivered.add((msg.kind, msg.job, str(msg.round), msg.node, detail))
        return got

    def reports(self, msg: PullTask | CancelTask) -> list[StatusReport]:
        key = (msg.job, msg.job_uid, msg.round, msg.node)
        ref = {"job": msg.job, "job_uid": msg.job_uid, "round": msg.round, "node": msg.node}
        if isinstance(msg, CancelTask):
            seq = self.open_pulls.pop(key, None)
            if seq is None:
                return []
            return [StatusReport(**ref, phase="Cancelled", attempt=1, seq=seq + 1, message=msg.reason)]
        if key in self.handled:
            return []
        self.handled.add(key)
        outcome = self.outcomes.get((msg.node, msg.round), self.outcomes.get(msg.node, "Succeeded"))
        if outcome == "Absent":
            return []
        pulling = StatusReport(**ref, phase="Pulling", attempt=1, seq=1, bytes_done=0, bytes_total=100)
        if outcome == "Silent":
            self.open_pulls[key] = 1
            return [pulling]
        if outcome == "Failed":
            final = StatusReport(**ref, phase="Failed", attempt=1, seq=2, message="rpc error: code = NotFound")
        else:
            final = StatusReport(**ref, phase="Succeeded", attempt=1, seq=2, bytes_done=100, bytes_total=100,
                                 image_id="sha256:" + "9" * 64)
        return [pulling, final]


class TaskSendsFailedError(RuntimeError):
    """What `dispatch_job` raises when sends failed, so the stream retries the record."""


class Driver:
    """Delivers inputs as their event sources do: a delivery that failed with one of `retry_on` (the
    crash, or errors the functions let escape for a retry) is delivered again, up to `attempts` times."""

    def __init__(self, plane: Plane, agents: Agents | None = None, *,
                 retry_on: tuple[type[Exception], ...] = (), attempts: int = 2) -> None:
        self.plane = plane
        self.agents = agents or Agents(plane)
        self.retry_on: tuple[type[Exception], ...] = (InjectedFault, TaskSendsFailedError, *retry_on)
        self.attempts = attempts
        self.redelivered: list[str] = []
        self.sweeps = 0

    @property
    def redeliveries(self) -> int:
        return len(self.redelivered)

    def deliver(self, fn: Callable[[], T], *, gone_ok: bool = False) -> T | None:
        self.plane.plan.begin_step()
        for attempt in range(1, self.attempts + 1):
            try:
                result = fn()
                break
            except JobNotFoundError:
                if not (gone_ok and attempt > 1):
                    raise
                return None  # the first delivery finished the delete before it failed
            except self.retry_on as e:
                if attempt == self.attempts:
                    raise
                self.redelivered.append(type(e).__name__)
        self.stream()
        return result

    def watch(self) -> None:
        """Crash points are counted from here: what came before is another scenario's subject."""
        self.plane.plan.watch()

    def stream(self) -> None:
        """The table stream: every job whose item asks for planning gets `plan_job` (retried on a crash)."""
        p = self.plane
        for record in p.real_store.list_jobs():
            if record.needs_planning():
                self.deliver(functools.partial(self._plan, record.key))

    def _plan(self, key: str) -> object:
        p = self.plane
        result = plan_job(p.store, p.cluster, p.queues, key, now=p.clock())
        if result.send_failures:
            raise TaskSendsFailedError(f"{len(result.send_failures)} task sends failed")
        return result

    def apply(self, doc: dict[str, Any]) -> None:
        p = self.plane
        self.deliver(lambda: apply_manifest(p.store, doc, now=p.clock()))

    def report(self, report: StatusReport) -> None:
        p = self.plane
        self.deliver(lambda: record_report(p.store, p.queues, report, now=p.clock()))

    def hello(self, hello: Hello) -> None:
        p = self.plane
        self.deliver(lambda: register_node(p.store, p.queues, p.cluster, hello, now=p.clock()))

    def sweep(self) -> None:
        p = self.plane
        self.sweeps += 1
        self.deliver(lambda: sweep(p.store, p.queues, clusters_of(p.store), now=p.clock(),
                                   config=SweepSettings(prefix=p.real_queues.prefix,
                                                        resend_after_seconds=RESEND_AFTER)))

    def repull(self) -> None:
        scheduled = self.plane.clock()  # a retried invocation carries the same scheduled time
        self.deliver(lambda: repull_daily(self.plane.store, scheduled_time=scheduled))

    def sync(self, api: ResourceApi) -> None:
        """`sync_resources` as its schedule runs it; a crashed run is superseded by the next one."""
        self.deliver(lambda: sync_resources(self.plane.store, api, now=self.plane.clock()))

    def finish_deletion(self, key: str) -> None:
        """`dispatch_job` on the stream record of a job marked Deleting."""
        self.deliver(lambda: complete_deletion(self.plane.store, self.plane.queues, key))

    def delete(self, key: str) -> None:
        namespace, name = key.split("/")
        self.deliver(lambda: delete_job(self.plane.store, self.plane.queues, namespace, name), gone_ok=True)

    def agents_round(self) -> int:
        """Each agent takes what its queue holds and reports on it; returns how many reports it sent."""
        reports = [r for msg in self.agents.take() for r in self.agents.reports(msg)]
        for r in reports:
            self.report(r)
        return len(reports)

    def work(self, *, rounds: int = 40, recover: bool = True) -> None:
        """Agents work until nothing moves; a stall gets the schedule's sweep five minutes later (twice at most:
        a silent node stays silent)."""
        idle = 0
        for _ in range(rounds):
            if self.agents_round():
                idle = 0
                continue
            unfinished = [r for r in self.plane.real_store.list_jobs() if r.state not in FINISHED_STATES
                          and r.counters.done < r.counters.desired]
            if not recover or not unfinished or idle >= 2:
                return
            idle += 1
            self.plane.clock.advance(RESEND_AFTER + 1)
            self.sweep()
        raise AssertionError(f"agents still busy after {rounds} rounds")

    def outcome(self, *keys: str) -> dict[str, Any]:
        """The observable end state: each job's state and every distinct message the nodes received."""
        return {"jobs": {k: job_state(self.plane.real_store, k) for k in keys},
                "delivered": sorted(self.agents.delivered)}
