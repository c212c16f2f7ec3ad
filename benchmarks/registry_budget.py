"""The registry budget at fleet scale: `--nodes` nodes pull an image of `--layers` layers from one ECR
registry at ECR's default quotas, with the stack's budget and without it.

Time is modelled, not waited for: a model clock drives both the registry and the budget. The registry is
ECR's request quotas per account and Region as token buckets (BatchGetImage 2,000/s for the manifest,
GetDownloadUrlForLayer 3,000/s for the config and each layer; one second's worth of burst), each request
taken or refused with a 429. A pull makes all its requests the moment it starts (the worst case: containerd
spreads its blob requests over the pull, 3 at a time); a refused request is asked again after the agent's
throttle backoff (`throttle_backoff`: jittered, 1 s doubling to 30 s), the requests served stay served.

With the budget, the fleet's tasks are sent as `fill_slots` claims them, 99 a transaction, through the
real `PacedQueues` and `DynamoJobStore` on moto behind the AWS limits layer (on the model clock), so every
write is counted per partition key; each task starts when its queue delay (`DelaySeconds`, whole seconds,
from the task's `not_before`) lets it. Without the budget every task starts at once (parallelism = nodes).
It prints, side by side, the 429s, the time the last request was served, and the bound the budget sets
(requests / rate); then the writes of each key the budget wrote (its only key), their peak per second
against DynamoDB's 1,000 WCU/s a partition; then a run whose starts wait longer than the sweep's re-send
threshold (`resend_run`). The last line is JSON.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import emit, print_machine

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pull:
    start: float
    manifest: int = 1
    blobs: int = 0
    throttles: int = 0
    done_at: float | None = None


@dataclass
class Registry:
    """ECR's two pull quotas as token buckets on the model clock; counts what it served and refused."""

    clock: Clock
    buckets: dict[str, Any] = field(default_factory=dict)
    served: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        from prewarm_devtools.aws_limits import Quotas, TokenBucket

        quotas = Quotas()  # ECR's: BatchGetImage, GetDownloadUrlForLayer
        self.buckets = {"manifest": TokenBucket(quotas.ecr_manifest_per_s, quotas.ecr_manifest_per_s, 0.0),
                        "layer": TokenBucket(quotas.ecr_layer_per_s, quotas.ecr_layer_per_s, 0.0)}

    def take(self, api: str, count: int) -> int:
        """Serves up to `count` requests of `api` now; answers how many were served."""
        bucket, now = self.buckets[api], self.clock.now
        served = min(count, int(bucket.available(now)))
        bucket.take(served, now)
        self.served += served
        self.refused += count - served
        return served


def simulate(starts: Sequence[float], layers: int, seed: int) -> dict[str, Any]:
    """Pulls starting at `starts` against the registry; each retried after a 429 as the agent does."""
    from prewarm.domain.registry_budget import throttle_backoff

    clock, rng = Clock(), random.Random(seed)
    registry = Registry(clock)
    pulls = [Pull(start, blobs=1 + layers) for start in starts]
    events = [(p.start, i) for i, p in enumerate(pulls)]
    heapq.heapify(events)
    last = 0.0
    while events:
        clock.now, i = heapq.heappop(events)
        pull = pulls[i]
        pull.manifest -= registry.take("manifest", pull.manifest)
        if not pull.manifest:
            pull.blobs -= registry.take("layer", pull.blobs)
        if pull.manifest or pull.blobs:
            pull.throttles += 1
            heapq.heappush(events, (clock.now + throttle_backoff(pull.throttles, rng), i))
        else:
            pull.done_at = last = clock.now
    return {"requests": registry.served, "throttled_requests": registry.refused, "finish_s": round(last, 2),
            "last_start_s": round(max(starts), 2), "pulls_throttled": sum(p.throttles > 0 for p in pulls)}


def budget_starts(nodes: int, layers: int, rate: float) -> tuple[list[float], dict[str, Any]]:
    """The fleet's starts as the stack's paced sends give them: real PacedQueues and DynamoJobStore on moto
    behind the limits layer, on the model clock; and the writes per partition key they made."""
    import os

    import boto3
    from moto import mock_aws

    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.domain.messages import PullTask
    from prewarm.domain.registry_budget import RegistryBudget, RegistryBudgets
    from prewarm.services.dispatch import MAX_CLAIMS_PER_TRANSACTION
    from prewarm.services.pacing import PacedQueues
    from prewarm_devtools import aws_limits
    from prewarm_devtools.sam.template import create_table, load_template

    os.environ.update({"AWS_DEFAULT_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench"})
    clock = Clock()
    starts: list[float] = []

    class Captured:
        def send_many(self, messages: Sequence[Any]) -> list[tuple[str, str]]:
            for task in messages:
                starts.append(clock.now + task.delay_seconds)  # SendMessage's DelaySeconds
            return []

    with mock_aws(), aws_limits.limits(clock=clock) as layer:
        client = boto3.client("dynamodb")
        create_table(client, load_template(), "bench")
        layer.stats.reset()
        store = DynamoJobStore("bench", client)
        paced = PacedQueues(Captured(), store, RegistryBudgets(RegistryBudget(requests_per_second=rate)),  # type: ignore[arg-type]
                            clock=clock)
        image = f"{ECR}/ml/big@sha256:" + "0" * 64
        for first in range(0, nodes, MAX_CLAIMS_PER_TRANSACTION):
            batch = [PullTask(job="default/fleet", job_uid="u", round=1, node=f"node-{n}", image=image, layers=layers)
                     for n in range(first, min(nodes, first + MAX_CLAIMS_PER_TRANSACTION))]
            paced.send_many(batch)
            clock.now += 0.01  # the next claim's transaction and sends
        keys = [{"key": str(k.key), "writes": k.writes, "peak_wcu_per_s": round(k.peak_wcu_per_s, 1)}
                for k in layer.stats.keys() if k.writes]  # noqa: SIM118 (CapacityStats.keys(), not a dict)
    return starts, {"keys_written": keys, "refusals": dict(layer.stats.refusals)}


def resend_run(nodes: int, rate: float, *, resend_after: int = 300) -> dict[str, Any]:
    """A backlog longer than the sweep's re-send threshold: the real `plan_job`, `PacedQueues` and `sweep`
    (every 60 s) on the in-memory table and queues, on the model clock; the job's image of unknown layers
    (costed at 30). Each agent takes its task when its queue delay ends and reports it done; a task
    delivered twice is pulled once. Answers the pulls; the nodes failed (a task waiting for its start or
    for the budget, taken for silent); the starts reserved (one per pull unless a re-send reserves
    again); the re-sends; the last start and the budget's end against the bound (requests / rate)."""
    from prewarm.domain.jobs import job_key
    from prewarm.domain.messages import NodeBound, PullTask, StatusReport
    from prewarm.domain.registry_budget import RegistryBudget, RegistryBudgets, pull_requests
    from prewarm.services.dispatch import plan_job
    from prewarm.services.jobs import apply_manifest
    from prewarm.services.pacing import PacedQueues
    from prewarm.services.reports import record_report
    from prewarm.services.schedules import SweepSettings, sweep
    from tests.support.cluster import FakeCluster, make_node
    from tests.support.cluster_directory import clusters_of
    from tests.support.manifests import job_doc
    from tests.support.memory_store import MemoryJobStore

    clock = Clock()
    clock.now = t0 = 1_800_000_000.0  # an epoch time: the plan tells a claim by its time being set
    visible: list[tuple[float, int, str]] = []  # (when the agent sees it, order, node)
    reserved = 0

    class Queues:
        def send_many(self, messages: Sequence[NodeBound]) -> list[tuple[str, str]]:
            for m in messages:
                if isinstance(m, PullTask):
                    heapq.heappush(visible, (clock.now + m.delay_seconds, len(visible), m.node))
            return []

    class Store(MemoryJobStore):
        def reserve_pull_starts(self, key: str, costs: Sequence[float], **kwargs: Any) -> tuple[float, ...]:
            nonlocal reserved
            starts = super().reserve_pull_starts(key, costs, **kwargs)
            reserved += len(starts)
            return starts

    store = Store()
    names = [f"node-{n}" for n in range(nodes)]
    paced = PacedQueues(Queues(), store, RegistryBudgets(RegistryBudget(requests_per_second=rate)),  # type: ignore[arg-type]
                        clock=clock)
    key = job_key("default", "fleet")
    apply_manifest(store, job_doc("fleet", image=f"{ECR}/ml/big:v1", parallelism=nodes), now=clock.now)
    plan_job(store, FakeCluster(nodes=[make_node(n) for n in names]), paced, key, now=clock.now)
    record = store.get_job(key)
    assert record is not None
    config = SweepSettings(prefix="pw", resend_after_seconds=resend_after)
    started: dict[str, float] = {}
    resent, next_sweep = 0, t0 + 60.0
    def running() -> bool:  # not finished: every node succeeded or failed (Always)
        current = store.get_job(key)
        return current is not None and not current.state.is_finished

    while len(started) < nodes and clock.now < t0 + 4 * 3600 and running():
        clock.now = min(next_sweep, visible[0][0]) if visible else next_sweep
        while visible and visible[0][0] <= clock.now:
            _, _, node = heapq.heappop(visible)
            if node not in started:
                started[node] = clock.now
                record_report(store, paced, StatusReport(job=key, job_uid=record.uid, round=record.round, node=node,
                                                         phase="Succeeded", attempt=1, seq=1), now=clock.now)
        if clock.now >= next_sweep:
            resent += sweep(store, paced, clusters_of(store), now=clock.now, config=config).resent
            next_sweep += 60.0
    budget = store.get_budget(f"ecr:{ECR.split('.')[0]}:us-west-2")
    final = store.get_job(key)
    bound = nodes * pull_requests(30) / rate  # the job's image: layers unknown, costed at 30
    last = max(started.values(), default=t0) - t0
    return {"nodes": nodes, "rate": rate, "resend_after_s": resend_after, "pulls": len(started),
            "nodes_failed": final.counters.failed if final else None, "starts_reserved": reserved,
            "resent": resent, "last_start_s": round(last, 1), "bound_s": round(bound, 1),
            "budget_end_s": round(budget.tat - t0, 1) if budget else None,
            "last_start_vs_bound": round(last / bound, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rate", type=float, default=None, help="the budget, requests/s (default: the stack's)")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--resend-nodes", type=int, default=2000,
                        help="the re-send run's fleet (0: skip it), at --resend-rate")
    parser.add_argument("--resend-rate", type=float, default=64.0,
                        help="the re-send run's budget, requests/s: low enough that starts wait beyond 300 s")
    args = parser.parse_args(argv)
    from prewarm.domain.registry_budget import DEFAULT_REQUESTS_PER_SECOND, pull_requests
    from prewarm_devtools.aws_limits import Quotas

    rate, quotas = args.rate or DEFAULT_REQUESTS_PER_SECOND, Quotas()
    print_machine()
    print(f"{args.nodes} nodes x {args.layers} layers from one ECR registry (account and Region), model time; "
          f"ECR's quotas: BatchGetImage {quotas.ecr_manifest_per_s:,.0f}/s, "
          f"GetDownloadUrlForLayer {quotas.ecr_layer_per_s:,.0f}/s")
    starts, writes = budget_starts(args.nodes, args.layers, rate)
    paced = simulate(starts, args.layers, args.seed)
    unpaced = simulate([0.0] * args.nodes, args.layers, args.seed)
    bound = args.nodes * pull_requests(args.layers) / rate
    paced["bound_s"] = round(bound, 2)
    paced["finish_vs_bound"] = round(paced["finish_s"] / bound, 3) if bound else None
    print(f"{'':28}{'budget ' + format(rate, ',.0f') + '/s':>22}{'no budget':>14}")
    for name in ("requests", "throttled_requests", "pulls_throttled", "last_start_s", "finish_s"):
        print(f"{name:28}{paced[name]:>22,}{unpaced[name]:>14,}")
    print(f"{'bound (requests / rate) s':28}{bound:>22,.2f}")
    for key in writes["keys_written"]:
        print(f"writes of {key['key']}: {key['writes']}, peak {key['peak_wcu_per_s']} WCU/s (a partition takes 1,000)")
    resends = resend_run(args.resend_nodes, args.resend_rate) if args.resend_nodes else None
    if resends is not None:
        r = resends
        print(f"re-sends: {r['nodes']:,} nodes at {r['rate']:g} requests/s (starts up to {r['bound_s']:,.0f} s "
              f"away), the sweep every 60 s, re-sending after {r['resend_after_s']} s:")
        print(f"  pulls {r['pulls']:,}, nodes failed {r['nodes_failed']:,}, starts reserved "
              f"{r['starts_reserved']:,}, re-sends {r['resent']:,}")
        print(f"  last start {r['last_start_s']:,} s, budget spent to {r['budget_end_s']:,} s, bound "
              f"{r['bound_s']:,} s: last start / bound {r['last_start_vs_bound']}")
    emit({"nodes": args.nodes, "layers": args.layers, "rate": rate, "budget": paced, "no_budget": unpaced, **writes,
          "resends": resends})
    return 0


if __name__ == "__main__":
    sys.exit(main())
