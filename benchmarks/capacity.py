"""The status path in AWS's time: how many reports a second `record_status` sustains, how late a report
is stored, and how a join storm of hellos goes.

`fleet.py` counts writes on a simulated clock paced by moto; it cannot say how long the work takes on
AWS. This benchmark runs the real handler (`functions/record_status/app.py`, through `bootstrap` into
`services/reports.py`) on moto in-process, batch by batch, and records every AWS call each invocation
makes with botocore's `before-call`/`after-call` events (and every Kubernetes call through a recording
cluster): its operation, its thread, when it started and ended, and the CPU its thread spent inside
it (moto's own work, which is not the function's). Calls that overlap in time on different threads
ran concurrently; the rest ran one after another. An invocation's modeled wall time is then:

- per group of overlapping calls, the busiest thread's sum of published latencies (`LATENCY_S`),
  summed over the groups in order: the invocation's sequential AWS round trips;
- plus the invocation's own CPU time (process CPU over the invocation minus the CPU spent inside the
  calls), scaled to the function's `MemorySize` from template.yaml: Lambda allocates CPU in
  proportion to memory, one full vCPU at 1,769 MB (Lambda developer guide, "Configure Lambda
  function memory"). A core of this machine counts as one vCPU (an assumption; printed below);
- plus Lambda's invoke overhead (`INVOKE_OVERHEAD_S`, an assumption).

The modeled durations are fed through the event source as template.yaml configures it (`BatchSize`,
`MaximumBatchingWindowInSeconds`, `ScalingConfig.MaximumConcurrency`; a batch over the function's
`Timeout` comes back after the queue's `VisibilityTimeout`, to the DLQ after `maxReceiveCount`): a
batch closes when it is full or its window has passed and runs on the first free slot. Batches run
for real one at a time, in the order the model starts them, so concurrency shows in modeled time
only: transaction conflicts between concurrent invocations are `fleet.py`'s to count.

Three scenarios (`--scenario`; `both` is status and storm, `all` the three):
- `status`: `--nodes` (5,000) pulling nodes of one `Always` job, one progress report each every 5 s,
  for `--seconds` of arrivals; prints sequential AWS round trips per batch, modeled seconds per
  batch, sustainable reports per second (MaximumConcurrency x a full batch / its modeled seconds),
  and the report → stored status lag p50/p99/max (to the end of the invocation that stored it).
- `wave`: `--nodes` (5,000) pulling nodes of one `Always` job all send their final `Succeeded` report
  within `--wave-window` (5) s, so that several invocations transact on the one job item at once; prints
  the conflicts, retries and throttles on it and when the job completes (`capacity_wave`, which says
  what is modeled).
- `storm`: `--joining` (1,000) nodes say hello within `--join-window` (60) s, each with the startup
  taint, while `--never-jobs` (20) running `Never` jobs and `--finished-jobs` (500) finished jobs are
  stored; prints when the last node is registered and sent its RequiredImages, the longest
  invocation as a share of its timeout, the DLQ count, and calls per hello.

The parts: `capacity_calls` (the latencies and the recorded calls), `capacity_stack` (the handler on
moto), `capacity_delivery` (the event source in modeled time); this file runs the scenarios.

The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.capacity_calls import FULL_VCPU_MB, INVOKE_OVERHEAD_S, LATENCY_S, REPORT_SEND_S
from benchmarks.capacity_delivery import Delivery, deliver
from benchmarks.capacity_stack import FunctionConfig, Stack
from benchmarks.capacity_wave import PARTITION_WCU_PER_S, wave_arguments, wave_scenario
from benchmarks.fleet_agents import IMAGE, IMAGE_BYTES, NAMESPACE, PROGRESS_EVERY_S
from benchmarks.fleet_moto import REGION
from benchmarks.measure import BenchmarkError, Target, emit, percentile, print_machine, print_targets

Json = dict[str, Any]

TARGET_REPORTS_PER_S = 3000.0
TARGET_P99_LAG_S = 5.0
TARGET_STORM_S = 90.0
TARGET_TIMEOUT_SHARE = 0.5


# --- the scenarios -----------------------------------------------------------------------------


def node_names(count: int, subnet: int) -> list[str]:
    return [f"ip-10-{subnet}-{i // 250}-{i % 250}.{REGION}.compute.internal" for i in range(count)]


def job_manifest(name: str, policy: str, parallelism: int) -> Json:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"image": IMAGE, "parallelism": parallelism, "completionPolicy": {"type": policy},
                 "selector": {"matchLabels": {"pool": "gpu"}},
                 "pullPolicy": {"timeoutSeconds": 1800, "backoffLimit": 3}},
    }


def store_job(stack: Stack, cluster: Any, name: str, policy: str, parallelism: int) -> str:
    """A job applied and planned as apply and dispatch_job do, outside the trace."""
    from prewarm.services.dispatch import plan_job
    from prewarm.services.jobs import apply_manifest

    apply_manifest(stack.store, job_manifest(name, policy, parallelism), now=time.time())
    key = f"{NAMESPACE}/{name}"
    plan_job(stack.store, cluster, stack.queues, key, now=time.time())
    return key


def in_batches(stack: Stack, bodies: Sequence[str], config: FunctionConfig) -> None:
    """Applies reports outside the model (the set-up), every one of them."""
    for start in range(0, len(bodies), config.batch_size):
        _, returned = stack.invoke(bodies[start : start + config.batch_size], config)
        if returned:
            raise BenchmarkError(f"{len(returned)} reports of the set-up were returned")


def lag_figures(delivery: Delivery, sent: Sequence[float], config: FunctionConfig) -> Json:
    lags = [delivery.stored_at[i] - sent[i] for i in delivery.stored_at]
    full = [(d, s) for d, s in zip(delivery.durations, delivery.sizes, strict=True) if s == config.batch_size]
    basis = full or list(zip(delivery.durations, delivery.sizes, strict=True))
    per_batch_s = statistics.fmean(d for d, _ in basis)
    per_batch = statistics.fmean(s for _, s in basis)
    # Of full batches when there are any: the sustainable rate is a full batch's.
    trips = [t for t, s in zip(delivery.trips, delivery.sizes, strict=True) if s == config.batch_size or not full]
    return {
        "batches": len(delivery.durations),
        "mean_batch": round(statistics.fmean(delivery.sizes), 1),
        "full_batches": len(full),
        "round_trips_per_batch": round(statistics.fmean(trips), 1),
        "modeled_s_per_batch": round(per_batch_s, 3),
        "sustainable_reports_per_s": round(config.concurrency * per_batch / per_batch_s, 0),
        "lag_p50_s": round(percentile(lags, 0.50) or 0.0, 3),
        "lag_p99_s": round(percentile(lags, 0.99) or 0.0, 3),
        "lag_max_s": round(max(lags, default=0.0), 3),
        "calls_per_report": round(delivery.calls / max(1, len(sent)), 2),
        "returned": delivery.returned, "dlq": delivery.dlq, "timed_out": delivery.timed_out,
        "longest_invocation_s": round(max(delivery.durations, default=0.0), 3),
    }


def status_scenario(args: argparse.Namespace, config: FunctionConfig) -> Json:
    from prewarm.domain.messages import StatusReport
    from tests.reliability.invariants import invariant_problems
    from tests.support.cluster import FakeCluster, make_node

    rng = random.Random(args.seed)
    nodes = node_names(args.nodes, 0)
    cluster = FakeCluster(nodes=[make_node(n, pool="gpu") for n in nodes])
    with Stack() as stack:
        started = time.perf_counter()
        key = store_job(stack, cluster, "capacity", "Always", args.nodes)
        record = stack.store.get_job(key)
        assert record is not None
        seq: dict[str, int] = {}
        newest: dict[str, int] = {}
        pull_s = 600.0

        def report(node: str, at: float) -> str:
            seq[node] = seq.get(node, 0) + 1
            done = int(IMAGE_BYTES * min(1.0, at / pull_s))
            newest[node] = done
            return StatusReport(job=key, job_uid=record.uid, round=record.round, node=node, phase="Pulling",
                                attempt=1, seq=seq[node], bytes_done=done, bytes_total=IMAGE_BYTES,
                                started_at=time.time()).model_dump_json(exclude_none=True)

        # Every node's first Pulling report (a phase change), outside the model: the steady state is measured.
        in_batches(stack, [report(n, 0.0) for n in nodes], config)
        print(f"  set-up: {args.nodes} nodes pulling one Always job ({time.perf_counter() - started:.0f} s wall)")
        phases = {n: rng.uniform(0, PROGRESS_EVERY_S) for n in nodes}
        due = sorted((phases[n] + k * PROGRESS_EVERY_S, n) for n in nodes
                     for k in range(int(args.seconds / PROGRESS_EVERY_S) + 1)
                     if phases[n] + k * PROGRESS_EVERY_S < args.seconds)
        bodies = [report(n, t) for t, n in due]
        sent = [t for t, _ in due]
        print(f"  {len(bodies)} progress reports over {args.seconds:.0f} s ({len(bodies) / args.seconds:.0f}/s), "
              f"batches of up to {config.batch_size}, window {config.window_s:g} s, {config.concurrency} at once, "
              f"{config.memory_mb} MB")
        delivery = deliver([t + REPORT_SEND_S for t in sent],
                           lambda ids: stack.invoke([bodies[i] for i in ids], config), config, verbose=args.verbose)
        figures = lag_figures(delivery, sent, config)
        record = stack.store.get_job(key)
        assert record is not None
        tasks = {t.node: t for t in stack.store.get_tasks(key)}
        stale = [n for n in nodes if tasks[n].bytes_done != newest[n]]
        c = record.counters
        figures.update(
            nodes=args.nodes, reports=len(bodies), offered_reports_per_s=round(len(bodies) / args.seconds, 1),
            counters={"desired": c.desired, "waiting": c.waiting, "active": c.active, "succeeded": c.succeeded,
                      "failed": c.failed},
            counters_exact=not invariant_problems(stack.store, key) and c.active == c.desired == args.nodes,
            progress_not_newest=len(stale), lost_reports=len(sent) - len(delivery.stored_at),
            wall_seconds=round(time.perf_counter() - started, 1),
        )
    print(f"  status path: {figures['round_trips_per_batch']} sequential AWS round trips per full batch, "
          f"{figures['modeled_s_per_batch']} modeled s per batch ({figures['mean_batch']} reports on average, "
          f"{figures['full_batches']} full of {figures['batches']}); sustainable "
          f"{figures['sustainable_reports_per_s']:.0f} reports/s; lag p50 {figures['lag_p50_s']} s, "
          f"p99 {figures['lag_p99_s']} s, max {figures['lag_max_s']} s; {figures['calls_per_report']} calls per "
          f"report; returned {figures['returned']}, DLQ {figures['dlq']}; counters exact "
          f"{figures['counters_exact']} {figures['counters']}; nodes whose stored progress is not their newest "
          f"report {figures['progress_not_newest']}")
    return figures


def told(stack: Stack, node: str) -> bool:
    """Whether the node's queue holds a RequiredImages (among its PullTasks)."""
    url = stack.queues.queue_url(node)
    while got := stack.queues.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                                     VisibilityTimeout=600).get("Messages", []):
        if any('"kind":"required"' in m["Body"] for m in got):
            return True
    return False


def storm_scenario(args: argparse.Namespace, config: FunctionConfig) -> Json:
    from prewarm.domain.jobs import JobState
    from prewarm.domain.messages import Hello
    from prewarm.services.jobs import apply_manifest
    from tests.reliability.invariants import invariant_problems
    from tests.support.cluster import FakeCluster, make_node

    rng = random.Random(args.seed)
    old = node_names(args.old_nodes, 1)
    joining = node_names(args.joining, 2)
    cluster = FakeCluster(nodes=[make_node(n, pool="gpu") for n in old])
    with Stack(cluster) as stack:
        started = time.perf_counter()
        for i in range(args.finished_jobs):
            name = f"finished-{i}"
            apply_manifest(stack.store, job_manifest(name, "Always", 10), now=time.time())
            record = stack.store.get_job(f"{NAMESPACE}/{name}")
            assert record is not None
            stack.store.finish_job(record.key, record.finish_fields(JobState.COMPLETED, at=time.time()),
                                   require_done=False)
        never = [store_job(stack, cluster, f"never-{j}", "Never", args.old_nodes + args.joining)
                 for j in range(args.never_jobs)]
        for n in joining:  # the agents create their queues before they say hello
            stack.queues.ensure_queue(n)
        cluster.nodes += [make_node(n, pool="gpu") for n in joining]
        print(f"  set-up: {args.finished_jobs} finished jobs, {args.never_jobs} running Never jobs over "
              f"{args.old_nodes} nodes ({time.perf_counter() - started:.0f} s wall)")
        joined = sorted(rng.uniform(0, args.join_window) for _ in joining)
        wall = time.time()  # the taint held for hours of wall clock: the run takes far longer than it models
        bodies = [Hello(node=n, labels={"pool": "gpu", "kubernetes.io/arch": "amd64"}, architecture="amd64",
                        queue_url=stack.queues.queue_url(n), agent_version="capacity",
                        warm_until=wall + 6 * 3600).model_dump_json() for n in joining]
        print(f"  {len(bodies)} hellos within {args.join_window:.0f} s, batches of up to {config.batch_size}, "
              f"window {config.window_s:g} s, {config.concurrency} at once, {config.memory_mb} MB, timeout "
              f"{config.timeout_s:g} s")
        delivery = deliver([t + REPORT_SEND_S for t in joined],
                           lambda ids: stack.invoke([bodies[i] for i in ids], config), config, verbose=args.verbose)
        required = sum(told(stack, n) for n in joining)
        registered = sum(stack.store.get_node(n) is not None for n in joining)
        in_jobs = min(len({t.node for t in stack.store.get_tasks(k)} & set(joining)) for k in never)
        problems = [p for k in never for p in invariant_problems(stack.store, k)]
        done = max(delivery.stored_at.values(), default=0.0)
        figures = {
            "joining": args.joining, "never_jobs": args.never_jobs, "finished_jobs": args.finished_jobs,
            "last_told_s": round(done - joined[0], 2) if len(delivery.stored_at) == len(joined) else None,
            "longest_invocation_s": round(max(delivery.durations), 3),
            "longest_timeout_share": round(max(delivery.durations) / config.timeout_s, 3),
            "dlq": delivery.dlq, "returned": delivery.returned, "timed_out": delivery.timed_out,
            "calls_per_hello": round(delivery.calls / len(joined), 1),
            "round_trips_per_batch": round(statistics.fmean(delivery.trips), 1),
            "batches": len(delivery.durations), "mean_batch": round(statistics.fmean(delivery.sizes), 1),
            "registered": registered, "sent_required_images": required, "in_every_never_job": in_jobs,
            "counters_exact": not problems, "wall_seconds": round(time.perf_counter() - started, 1),
        }
    print(f"  join storm: last node registered and told {figures['last_told_s']} s after the first join; longest "
          f"invocation {figures['longest_invocation_s']} s ({figures['longest_timeout_share']:.0%} of its timeout); "
          f"DLQ {figures['dlq']}, returned {figures['returned']}, timed out {figures['timed_out']}; "
          f"{figures['calls_per_hello']} calls per hello, {figures['round_trips_per_batch']} sequential round "
          f"trips per batch ({figures['mean_batch']} hellos on average); registered {registered}, told "
          f"{required}, in every Never job {in_jobs} of {args.joining}; counters exact {figures['counters_exact']}")
    return figures


def targets(status: Json | None, storm: Json | None, wave: Json | None = None) -> list[Target]:
    out = []
    if wave is not None:
        out += [
            Target("Succeeded wave: invocations that gave up on the job item", wave["gave_up_invocations"], 0),
            Target("Succeeded wave: peak job item WCU/s", wave["peak_job_item_wcu_per_s"], PARTITION_WCU_PER_S),
            Target("Succeeded wave: counters exact (1 = yes)", int(wave["counters_exact"]), 1, at_least=True),
        ]
    if status is not None:
        out += [
            Target("sustainable reports per s", status["sustainable_reports_per_s"], TARGET_REPORTS_PER_S,
                   at_least=True),
            Target("report to stored status lag p99", status["lag_p99_s"], TARGET_P99_LAG_S, " s"),
            Target("counters exact (1 = yes)", int(status["counters_exact"]), 1, at_least=True),
            Target("lost reports", status["lost_reports"], 0),
        ]
    if storm is not None:
        last = storm["last_told_s"]
        out += [
            Target("last node registered and told, s after the first join",
                   last if last is not None else float("inf"), TARGET_STORM_S, " s"),
            Target("longest invocation, share of its timeout", storm["longest_timeout_share"], TARGET_TIMEOUT_SHARE),
            Target("hellos in the DLQ", storm["dlq"], 0),
        ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/capacity.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("both", "all", "status", "storm", "wave"), default="both")
    parser.add_argument("--nodes", type=int, default=5000, help="pulling nodes (default 5000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of progress reports (default 20)")
    parser.add_argument("--joining", type=int, default=1000, help="nodes joining in the storm (default 1000)")
    parser.add_argument("--join-window", type=float, default=60.0, help="seconds they join within (default 60)")
    parser.add_argument("--old-nodes", type=int, default=50, help="nodes before the storm (default 50)")
    parser.add_argument("--never-jobs", type=int, default=20, help="running Never jobs (default 20)")
    parser.add_argument("--finished-jobs", type=int, default=500, help="finished jobs stored (default 500)")
    wave_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=None,
                        help="StatusConcurrency as deployed (default: template.yaml's default)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    config = FunctionConfig.from_template()
    if args.concurrency is not None:
        config = dataclasses.replace(config, concurrency=args.concurrency)
    print_machine()
    print(f"model: DynamoDB single-item {LATENCY_S['dynamodb:UpdateItem'] * 1000:g} ms, BatchGetItem "
          f"{LATENCY_S['dynamodb:BatchGetItem'] * 1000:g} ms, TransactWriteItems "
          f"{LATENCY_S['dynamodb:TransactWriteItems'] * 1000:g} ms, SQS SendMessage "
          f"{LATENCY_S['sqs:SendMessage'] * 1000:g} ms, invoke {INVOKE_OVERHEAD_S * 1000:g} ms; CPU x "
          f"{FULL_VCPU_MB / config.memory_mb:.2f} ({config.memory_mb} MB; a core here counts as one vCPU)")
    status = status_scenario(args, config) if args.scenario in ("both", "all", "status") else None
    storm = storm_scenario(args, config) if args.scenario in ("both", "all", "storm") else None
    wave = wave_scenario(args, config, node_names=node_names, store_job=store_job, in_batches=in_batches) \
        if args.scenario in ("all", "wave") else None
    met = print_targets(targets(status, storm, wave))
    emit({"status": status, "storm": storm, "wave": wave, "targets_met": met, "memory_mb": config.memory_mb,
          "concurrency": config.concurrency, "batch_size": config.batch_size,
          "latency_s": LATENCY_S, "invoke_overhead_s": INVOKE_OVERHEAD_S})
    return 0


if __name__ == "__main__":
    sys.exit(main())
