"""fleet.py's stack: template.yaml deployed onto the limited moto, `record_status`'s batches in flight
(`InFlight`), the jobs and the rounds run tick by tick (`Fleet`), and each round's figures (`figures`)
with the targets they are held to (`targets`)."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fleet_agents import (
    HELD_VISIBILITY_S,
    IMAGE,
    NAMESPACE,
    NODE_QUEUE_VISIBILITY_S,
    Agents,
    cluster_of_message,
)
from benchmarks.fleet_moto import Json, LimitedMoto, SimClock
from benchmarks.measure import BenchmarkError, Target, percentile
from benchmarks.servers import KubeApiProcess

WORKERS = 16
TARGET_WRITES_PER_REPORT = 0.05
TARGET_WCU_PER_S = 300.0
TARGET_JOB_ITEM_BYTES = 16 * 1024


# --- record_status's batches in flight, counted -------------------------------------------------


class InFlight:
    """Wraps the invocations local mode's event source mapping makes: how many batches run at once, and the
    items they hand back (`batchItemFailures`) with how long each waited, in wall seconds, until a
    batch got it again."""

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler
        self.now = 0
        self.most = 0
        self.samples: list[int] = []
        self.batches = 0
        self.messages = 0
        self.returned: list[str] = []  # the bodies of the items handed back (whose cluster they are)
        self.waits: list[tuple[float, str]] = []  # (wall s, body) of each item a batch got again
        self._returned_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, event: Json, context: Any) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.samples.append(self.now)
            self.batches += 1
            self.messages += len(event.get("Records", []))
            now = time.monotonic()
            for record in event.get("Records", []):
                if (since := self._returned_at.pop(record["messageId"], None)) is not None:
                    self.waits.append((now - since, record["body"]))
        response = None
        try:
            response = self.handler(event, context)
            return response
        finally:
            with self._lock:
                self.now -= 1
                failed = [f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])]
                if response is None:  # the batch raised: all of it goes back
                    failed = [r["messageId"] for r in event.get("Records", [])]
                gone = set(failed)
                self.returned += [r["body"] for r in event.get("Records", []) if r["messageId"] in gone]
                self._returned_at.update(dict.fromkeys(failed, time.monotonic()))

    def take_returns(self) -> tuple[list[str], list[tuple[float, str]]]:
        """The items handed back and the waits seen since the last call, each with its item's body."""
        with self._lock:
            out = (self.returned, self.waits)
            self.returned, self.waits = [], []
            return out


# --- one stack, its jobs and rounds --------------------------------------------------------------


@dataclass
class RoundResult:
    label: str
    key: str
    nodes: int
    parallelism: int
    reports: int = 0
    duplicated: int = 0
    reordered: int = 0
    restarted: str = ""
    sim_start: float = 0.0
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    peak_reports_per_s: int = 0
    sent: list[tuple[float, str]] = field(default_factory=list)  # (simulated second, body) for the old path
    finals_sent: list[float] = field(default_factory=list)  # wall time of each node's first final report
    stats: Json = field(default_factory=dict)
    extra: Json = field(default_factory=dict)
    returned: int = 0  # items batches handed back (batchItemFailures, or a batch that raised)
    returned_waits: list[float] = field(default_factory=list)  # wall s until a batch got each again
    cluster: str = ""  # the cluster whose job and agents these are ("": the stack's own)


@dataclass
class Lane:
    """One cluster's part of a round: its job's result, its agents, and which node queues are its own."""

    result: RoundResult
    agents: Agents
    owns_queue: Callable[[str], bool] = lambda name: True


class Fleet:
    def __init__(self, args: argparse.Namespace, clock: SimClock, moto: LimitedMoto, api: KubeApiProcess) -> None:
        self.args, self.clock, self.moto, self.api = args, clock, moto, api
        self.pool = ThreadPoolExecutor(max_workers=WORKERS)

    def deploy(self) -> None:
        from prewarm_devtools.sam.stack import LocalStack

        self.devnull = open(os.devnull, "w")  # noqa: SIM115 - the functions' log output, for the whole run
        # As local mode deploys it: an item a batch hands back comes again when its visibility runs out.
        self.stack = LocalStack(self.moto.url, parameters={"ClusterName": "local", "KubeApiEndpoint": self.api.url},
                                function_output=self.devnull).deploy()
        self.stack.prime_streams()
        fn = self.stack.function("record_status")
        self.stack.invoke(fn.logical_id, {"Records": []})  # starts its environment, as a cold start does
        invoke = self.stack.invoke
        self.in_flight = InFlight(lambda event, _context: invoke(fn.logical_id, event))
        # Counted where the event source mapping invokes it (the function runs in a process of its own).
        self.stack.invoke = lambda name, event: (
            self.in_flight(dict(event), None) if self.stack.function(name) is fn else invoke(name, event))
        os.environ.update(self.stack.env())  # the shared environment, for this process's own adapters
        from prewarm import bootstrap

        self.store, self.queues = bootstrap.store(), bootstrap.node_queues()
        # What each node's hello has record_status do when its agent starts: make its queue.
        from benchmarks.fanout import create_node_queues

        create_node_queues(self.queues, [n["metadata"]["name"] for n in bootstrap.cluster().list_nodes()])
        self.sqs = self.stack.sqs
        self.function = fn
        props = fn.events["StatusReports"]["Properties"]
        self.status_url = self.stack.physical["StatusQueue"].ref
        self.batch_size = int(props.get("BatchSize", 10))
        self.concurrency = int(props.get("ScalingConfig", {}).get("MaximumConcurrency", 1))
        self.dlq_urls = {logical: p.ref for logical, p in self.stack.physical.items()
                         if logical.endswith("DLQ") and "QueueUrl" in p.attrs}
        self.node_prefix = self.queues.prefix + "-"

    def concurrency_figures(self) -> dict[str, Any]:
        """How many record_status batches ran at once, and how big they were, against template.yaml's."""
        counted = self.in_flight
        return {"max": counted.most,
                "mean": round(statistics.fmean(counted.samples), 1) if counted.samples else 0.0,
                "batch_size": self.batch_size, "maximum_concurrency": self.concurrency,
                "mean_batch": round(counted.messages / max(1, counted.batches), 1)}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.stack.stop()  # its functions' processes end before their output does
        self.devnull.close()

    # -- jobs --------------------------------------------------------------------------------

    def create_job(self, name: str, policy: str, parallelism: int) -> str:
        from prewarm.services.jobs import apply_manifest

        manifest = {
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"image": IMAGE, "parallelism": parallelism, "completionPolicy": {"type": policy},
                     "pullPolicy": {"timeoutSeconds": 1800, "backoffLimit": 3}},
        }
        apply_manifest(self.store, manifest, now=time.time())
        key = f"{NAMESPACE}/{name}"
        self.dispatch(key, 0)
        return key

    def dispatch(self, key: str, round_: int) -> None:
        """Delivers the table stream to dispatch_job until round `round_` of `key` is planned."""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            self.stack.pump_streams()
            record = self.store.get_job(key)
            if record is not None and record.round == round_ and record.planned == record.plan_id:
                return
            time.sleep(0.05)
        raise BenchmarkError(f"dispatch_job did not plan round {round_} of {key} within 600 s")

    def messages(self, url: str) -> int:
        """Messages a queue holds, visible or in flight."""
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def dlq_messages(self) -> dict[str, int]:
        return {logical: self.messages(url) for logical, url in self.dlq_urls.items()}

    def drain_status(self, timeout: float = 600.0) -> None:
        """Local mode's event source mapping until the status queue is empty (failed items come back)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stack.pump_sqs():
                continue
            if not self.messages(self.status_url):
                return
            time.sleep(0.05)  # items a batch failed wait out their visibility
        raise BenchmarkError(f"the status queue still holds messages after {timeout:.0f} s")

    # -- one round, tick by tick -------------------------------------------------------------

    def tick(self) -> float:
        t = math.floor(self.clock.now) + 1.0
        self.clock.set(t)
        return t

    def run_round(self, result: RoundResult, agents: Agents) -> RoundResult:
        return self.run_lanes([Lane(result, agents)])[0]

    def run_lanes(self, lanes: Sequence[Lane]) -> list[RoundResult]:
        """One round of every lane's job at once, tick by tick, until every job is done and every agent idle."""
        from prewarm.domain.keys import JobKey
        from prewarm.domain.messages import parse_node_message

        started = time.perf_counter()
        self.moto.reset()
        self.in_flight.take_returns()
        for lane in lanes:
            lane.result.sim_start = self.clock.now
        first_final: list[set[str]] = [set() for _ in lanes]
        quiet = 0
        limit = self.clock.now + (self.args.max_sim_seconds or 20 * self.args.pull_median)
        while True:
            t = self.tick()
            busy = self.moto.busy(self.node_prefix)
            received = list(self.pool.map(self._receive_tasks, busy))
            bodies: list[str] = []
            for i, lane in enumerate(lanes):
                agents, result = lane.agents, lane.result
                reports: list[Any] = []
                deletes: list[tuple[str, str]] = []
                for queue_url, messages in received:
                    if not lane.owns_queue(queue_url.rsplit("/", 1)[1]):
                        continue
                    for m in messages:
                        task = parse_node_message(m["Body"])
                        if JobKey.parse(task.job).cluster != result.cluster:  # never: each cluster has its own
                            result.extra["crossed_tasks"] = result.extra.get("crossed_tasks", 0) + 1
                        more, gone = agents.receive(task, queue_url, m["ReceiptHandle"], t)
                        reports += more
                        deletes += gone
                due, done, releases = agents.step(t)
                reports += due
                deletes += done
                list(self.pool.map(self._delete_task, deletes))
                list(self.pool.map(self._release_task, releases))
                list(self.pool.map(self._extend_task, self._heartbeat(agents)))
                sent = [r.model_dump_json(exclude_none=True) for r in reports]
                result.sent += [(t - result.sim_start, b) for b in sent]
                result.peak_reports_per_s = max(result.peak_reports_per_s, len(sent))
                bodies += sent
                now = time.time()
                for r in reports:
                    if r.phase.is_terminal and r.node not in first_final[i]:
                        first_final[i].add(r.node)
                        result.finals_sent.append(now)
            list(self.pool.map(self._send_status, [bodies[i : i + 10] for i in range(0, len(bodies), 10)]))
            self.drain_status()
            for _ in range(3):  # the table stream: dispatch_job sees the job item's changes
                self.stack.pump_streams()
            records = [self.store.get_job(lane.result.key) for lane in lanes]
            finished = all(r is not None and r.counters.done == r.counters.desired for r in records)
            idle = all(lane.agents.idle for lane in lanes)
            quiet = quiet + 1 if finished and idle and not busy else 0
            if quiet >= 3:
                break
            if t > limit:
                raise BenchmarkError("; ".join(self._unfinished(lane, record, t, len(busy))
                                               for lane, record in zip(lanes, records, strict=True)))
            if self.args.verbose and int(t) % 30 == 0:
                counters = [r.counters if r else None for r in records]
                print(f"    t={t - lanes[0].result.sim_start:.0f}s pulls {sum(len(x.agents.runs) for x in lanes)} "
                      f"reports/s {len(bodies)} busy queues {len(busy)} batches {self.in_flight.batches} counters "
                      f"{counters[0] if len(counters) == 1 else counters} wall {time.perf_counter() - started:.0f}s",
                      flush=True)
        stats = self.moto.stats()
        returned, waits = self.in_flight.take_returns()
        for lane in lanes:
            result, agents = lane.result, lane.agents
            result.sim_seconds = self.clock.now - result.sim_start
            result.wall_seconds = time.perf_counter() - started
            result.reports = len(result.sent)
            result.duplicated, result.reordered = agents.duplicated, agents.reordered
            result.restarted, result.stats = agents.restarted, stats
            alone = len(lanes) == 1
            result.returned = sum(1 for body in returned if alone or cluster_of_message(body) == result.cluster)
            result.returned_waits = sorted(wait for wait, body in waits
                                           if alone or cluster_of_message(body) == result.cluster)
        return [lane.result for lane in lanes]

    def _unfinished(self, lane: Lane, record: Any, t: float, busy: int) -> str:
        result, agents = lane.result, lane.agents
        open_nodes = [(n.node, n.phase.value, n.attempt, n.seq, agents.final_phase.get(n.node))
                      for n in self.store.get_tasks(result.key) if not n.phase.is_terminal]
        return (f"{result.label}: not finished after {t - result.sim_start:.0f} simulated s: counters "
                f"{record.counters if record else None}, DLQs {self.dlq_messages()}, unfinished node items "
                f"(node, phase, attempt, seq, the agent's final phase) {open_nodes[:5]}, agents still pulling "
                f"{len(agents.runs)}, node queues with tasks {busy}")

    def _receive_tasks(self, name: str) -> tuple[str, list[Json]]:
        url = f"{self.queues.base_url}/{name}"
        got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        return url, got.get("Messages", [])

    def _delete_task(self, message: tuple[str, str]) -> None:
        self.sqs.delete_message(QueueUrl=message[0], ReceiptHandle=message[1])

    @staticmethod
    def _heartbeat(agents: Agents) -> list[tuple[str, str]]:
        """The held tasks whose visibility is due an extension (the agent's heartbeat)."""
        now = time.monotonic()
        due = []
        for pull in agents.runs.values():
            if pull.visible_at - now <= 2 * NODE_QUEUE_VISIBILITY_S / 3:
                pull.visible_at = now + HELD_VISIBILITY_S
                due.append((pull.queue_url, pull.receipts[-1]))
        return due

    def _extend_task(self, message: tuple[str, str]) -> None:
        self.sqs.change_message_visibility(QueueUrl=message[0], ReceiptHandle=message[1],
                                           VisibilityTimeout=HELD_VISIBILITY_S)

    def _release_task(self, message: tuple[str, str]) -> None:
        self.sqs.change_message_visibility(QueueUrl=message[0], ReceiptHandle=message[1], VisibilityTimeout=0)

    def _send_status(self, bodies: list[str]) -> None:
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)]
        out = self.sqs.send_message_batch(QueueUrl=self.status_url, Entries=entries)
        if out.get("Failed"):
            raise BenchmarkError(f"status reports not sent: {out['Failed'][:3]}")

    # -- what the round left -------------------------------------------------------------------

    def check(self, result: RoundResult, agents: Agents, dispatched_before: float, unsettled: int | None = None
              ) -> Json:
        """Lost reports, exact counters, DLQs, the job item's size and slot refill times. `unsettled`: the
        messages of this job left in the status queue and its DLQ, when others' share them."""
        from prewarm_devtools.aws_limits import item_size
        from tests.reliability.invariants import invariant_problems

        record = self.store.get_job(result.key)
        assert record is not None
        tasks = [t for t in self.store.get_tasks(result.key) if t.round == record.round]
        stored = {t.node: t.phase.value for t in tasks}
        wrong = sorted(n for n, phase in agents.final_phase.items() if stored.get(n) != phase)
        never_reported = sorted(n for n in stored if n not in agents.final_phase)
        c = record.counters
        expected = {
            "desired": len(stored), "waiting": 0, "active": 0,
            "succeeded": sum(p == "Succeeded" for p in agents.final_phase.values()),
            "failed": sum(p != "Succeeded" for p in agents.final_phase.values()),
        }
        actual = {"desired": c.desired, "waiting": c.waiting, "active": c.active, "succeeded": c.succeeded,
                  "failed": c.failed}
        problems = invariant_problems(self.store, result.key)
        dlq = self.dlq_messages()
        if unsettled is None:
            unsettled = self.messages(self.status_url) + self.messages(self.dlq_urls["StatusDLQ"])
        raw = self.store.client.get_item(TableName=self.store.table_name, ConsistentRead=True,
                                         Key={"pk": {"S": f"JOB#{result.key}"}, "sk": {"S": "JOB"}})["Item"]
        node_items = [item_size(i) for i in self.store.client.query(
            TableName=self.store.table_name, KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"JOB#{result.key}#0"}}, Limit=50)["Items"]]
        refills = self._refills(result, tasks, dispatched_before)
        return {
            "lost_reports": unsettled + len(wrong) + len(never_reported),
            "lost_detail": {"unsettled_messages": unsettled, "final_phase_wrong": wrong[:10],
                            "nodes_never_reported": never_reported[:10]},
            "counters_exact": not problems and expected == actual,
            "counters": actual, "counters_expected": expected, "invariant_problems": problems[:10],
            "dlq_messages": sum(dlq.values()), "dlq_by_queue": {k: v for k, v in dlq.items() if v},
            "job_item_bytes": item_size(raw), "node_item_bytes": max(node_items, default=0),
            "state": record.state, **refills,
        }

    def _refills(self, result: RoundResult, tasks: Sequence[Any], dispatched_before: float) -> Json:
        """Pairs the k-th freed slot (a final report sent) with the k-th dispatch after the first wave."""
        if result.parallelism >= result.nodes:
            return {"slot_refill_p50_s": None, "slot_refill_p99_s": None, "slot_refills": 0}
        dispatches = sorted(t.dispatched_at for t in tasks if t.dispatched_at and t.dispatched_at >= dispatched_before)
        later = dispatches[result.parallelism :]
        finals = sorted(result.finals_sent)
        gaps = sorted(max(0.0, d - f) for f, d in zip(finals, later, strict=False))
        if not gaps:
            return {"slot_refill_p50_s": None, "slot_refill_p99_s": None, "slot_refills": 0}
        return {"slot_refill_p50_s": round(statistics.median(gaps), 3),
                "slot_refill_p99_s": round(percentile(gaps, 0.99) or 0.0, 3),
                "slot_refills": len(gaps)}


def figures(result: RoundResult, checked: Json, fleet: Fleet, keys: Sequence[Any] | None = None) -> Json:
    """A round's figures; its capacity from `keys` (every key the round wrote, unless given)."""
    keys = result.stats["keys"] if keys is None else keys
    hot = max(keys, key=lambda u: u.wcu, default=None)
    job_key = next((u for u in keys if u.key.index_name is None and u.key.value == f"JOB#{result.key}"), None)
    # The registry budget's item: one key per registry, written once per batch of tasks sent (docs/architecture.md).
    budget = [u for u in keys if u.key.index_name is None and u.key.value.startswith("BUDGET#")]
    return {
        "nodes": result.nodes,
        "reports": result.reports,
        "sim_seconds": round(result.sim_seconds, 1),
        "wall_seconds": round(result.wall_seconds, 1),
        "hottest_key": str(hot.key) if hot else None,
        "hottest_key_writes_per_report": round(hot.writes / max(1, result.reports), 4) if hot else 0.0,
        "hottest_key_wcu_per_s": round(hot.peak_wcu_per_s, 1) if hot else 0.0,
        "throttles": result.stats["throttles"],
        "transaction_conflicts": result.stats["conflicts"],
        "dlq_messages": checked["dlq_messages"],
        "lost_reports": checked["lost_reports"],
        "counters_exact": checked["counters_exact"],
        "job_item_bytes": checked["job_item_bytes"],
        "slot_refill_p50_s": checked["slot_refill_p50_s"],
        "slot_refill_p99_s": checked["slot_refill_p99_s"],
        "parallelism": result.parallelism,
        "peak_reports_per_s": result.peak_reports_per_s,
        "reports_per_sim_s": round(result.reports / max(1.0, result.sim_seconds), 1),
        "hottest_key_avg_wcu_per_s": round(hot.wcu_per_s(), 1) if hot else 0.0,
        "job_item_writes_per_report": round(job_key.writes / max(1, result.reports), 4) if job_key else 0.0,
        "job_item_peak_wcu_per_s": round(job_key.peak_wcu_per_s, 1) if job_key else 0.0,
        "budget_keys": {u.key.value: {"writes": u.writes, "peak_wcu_per_s": round(u.peak_wcu_per_s, 1)}
                        for u in budget},
        "node_item_bytes": checked["node_item_bytes"],
        "duplicated": result.duplicated, "reordered": result.reordered, "restarted_agent": result.restarted,
        "slot_refills": checked["slot_refills"],
        "refusals": result.stats["refusals"],
        "state": checked["state"],
        "counters": checked["counters"],
        "problems": checked["invariant_problems"] + (
            [] if checked["counters"] == checked["counters_expected"]
            else [f"counters {checked['counters']} but the agents' outcomes say {checked['counters_expected']}"]),
        "lost_detail": checked["lost_detail"],
        "batches": fleet.in_flight.batches,
        "handler_errors": fleet.function.errors,
        "returned_items": result.returned,
        "returned_wait_p50_s": None if (p50 := percentile(result.returned_waits, 0.5)) is None else round(p50, 1),
        "returned_wait_max_s": round(max(result.returned_waits), 1) if result.returned_waits else None,
    }


def targets(new: Json) -> list[Target]:
    """The issue's targets, set for 5,000 nodes: below about 1,000 a job's node items share one shard,
    so every report writes that shard's key and the writes-per-report bound cannot hold."""
    return [
        Target("lost reports", new["lost_reports"], 0),
        Target("counters exact (1 = yes)", int(new["counters_exact"]), 1, at_least=True),
        Target("messages in the DLQs", new["dlq_messages"], 0),
        Target("hottest key writes per report", new["hottest_key_writes_per_report"], TARGET_WRITES_PER_REPORT),
        Target("hottest key WCU in its busiest simulated s", new["hottest_key_wcu_per_s"], TARGET_WCU_PER_S),
        Target("job item bytes", new["job_item_bytes"], TARGET_JOB_ITEM_BYTES, " B"),
    ]
