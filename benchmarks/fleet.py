"""A fleet of simulated agents pulling at once: does the status path keep up, exactly, inside AWS's limits?

template.yaml is deployed (`LocalStack`) onto a moto server behind the AWS limits layer
(`prewarm_devtools.aws_limits`: item sizes, transactions and their conflicts, 1,000 WCU/s per
partition key), in a child process of its own; the embedded Kubernetes API serves `--nodes`
synthetic nodes in another. Simulated agents speak the real protocol over the real queues: they
receive `PullTask`s from the node queues the control plane created and send `StatusReport`s to the
status queue. `record_status` runs as Lambda runs it: batches of the status queue's event source
(`BatchSize`, `MaximumConcurrency` from template.yaml, at least 10 batches in flight), the handler
called in this process, the queue's redrive to its DLQ. An item a batch hands back waits out its
visibility as SQS makes it (moto, on the wall clock): what `record_status` set with
ChangeMessageVisibility (2 s after the first receive, growing with each), else the queue's 180 s;
`returned_items` counts them and `returned_wait_*_s` is the real wall time from the batch that handed
one back to the batch that got it again. The simulated clock stands still while a tick drains the
status queue, so that wait is in no simulated figure: it is a cost in wall time only.

Time is simulated: each tick is one second of simulated time, in which every agent sends the
reports due (progress every 5 s, pull times lognormal around `--pull-median` s, `--failures` of the
pulls failing, `--disorder` of the reports duplicated or held back a few seconds, one agent
restarted mid-pull: it reports Pulling (shutting down) and the task message comes back to its next run, which
reports from attempt 1 again, as `prewarm_agent` does); the tick ends when the status queue is
drained. The limits layer's clock is the simulated clock, so capacity is counted per simulated
second: `hottest_key_wcu_per_s` is the busiest simulated second of the hottest partition key.

Two runs: an `Always` job over every node (parallelism = nodes: the whole fleet reports at once),
then the daily round of a `Never` job (`repull_daily` fired; parallelism `--never-parallelism`,
half the nodes by default, so freed slots are refilled: `slot_refill_*` is the wall time from a
node's final report being sent to the next node's dispatch). `--rounds always` or `--rounds never`
runs one of them alone (a 5,000-node run takes most of an hour of wall clock per round on a slow
machine).

The old path, side by side: the status path before batching (commit 8703751) applied each report
in its own transaction that also wrote the job item, whose `failedNodes` set and `excluded` JSON
grew with the fleet, and kept every node item under the job's partition key. `LegacyStatusPath`
performs the same DynamoDB reads and writes per report on a table of the old design, for the
reports of the first `--old-window` simulated seconds of each run, at the rate they were sent,
by 10 concurrent invocations of 10 reports each; a refused report is delivered again the next
second, and goes to the DLQ after 5 deliveries, as the status queue's redrive does.

`--clusters N` splits the nodes over N clusters with the same node names, one embedded API each (the
first the stack's own, the others registered in the table with their endpoint and CA): each cluster's
agents say hello with its name, one ECR push through `on_image_push` makes one `Always` job per cluster,
and all of them pull at once. It prints the figures per cluster and in total, and every DynamoDB key
and queue written by more than one cluster's traffic (`benchmarks/fleet_clusters.py`).

The parts: `fleet_moto` (moto behind the limits layer on the simulated clock), `fleet_agents` (the
simulated agents), `fleet_stack` (the stack, the rounds and their figures), `fleet_legacy` (the old path),
`fleet_clusters` (`--clusters`); this file runs the rounds and prints them.

The last line is JSON: the figures of the `Always` run at the top level (of the `Never` round when it
ran alone; `slot_refill_*` always from the `Never` round, the run with parallelism < nodes), the
`Never` round under "never", the old path under "old" (and "never"."old"); a round not run is null.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fleet_agents import Agents
from benchmarks.fleet_legacy import replay_old_path
from benchmarks.fleet_moto import Json, LimitedMoto, SimClock
from benchmarks.fleet_stack import Fleet, RoundResult, figures, targets
from benchmarks.measure import emit, load_average, print_machine, print_targets
from benchmarks.servers import KubeApiProcess

# --- the benchmark ----------------------------------------------------------------------------


def run_job(fleet: Fleet, label: str, policy: str, parallelism: int, seed: int) -> tuple[Json, Json | None]:
    """One job's round through the new path, then the old path on the same reports."""
    args = fleet.args
    rng = random.Random(seed)
    agents = Agents(fleet.clock, rng, args.pull_median, args.pull_sigma, args.failures, args.disorder)
    key = fleet.create_job(f"fleet-{label}", policy, parallelism)
    dispatched_before = 0.0
    if policy == "Never":
        # Round 0 finds the image on every node (the Always job pulled it): each agent answers at once.
        present = Agents(fleet.clock, rng, args.pull_median, args.pull_sigma, 0.0, 0.0, image_present=True,
                         restart_one=False)
        fleet.run_round(RoundResult("never-round-0", key, args.nodes, parallelism), present)
        dispatched_before = time.time()
        fleet.stack.fire("repull_daily")
        fleet.dispatch(key, 1)
    record = fleet.store.get_job(key)
    assert record is not None
    tasks = [t for t in fleet.store.get_tasks(key) if t.round == record.round]
    raw_job = fleet.store.client.get_item(TableName=fleet.store.table_name, ConsistentRead=True,
                                          Key={"pk": {"S": f"JOB#{key}"}, "sk": {"S": "JOB"}})["Item"]
    excluded = fleet.store.get_excluded(key)
    print(f"  {label}: {policy} job over {len(tasks)} nodes ({len(excluded)} excluded), parallelism {parallelism}, "
          f"round {record.round}")
    result = fleet.run_round(RoundResult(label, key, len(tasks), parallelism), agents)
    checked = fleet.check(result, agents, dispatched_before)
    new = figures(result, checked, fleet)
    old = None
    if args.old_window > 0:
        failed = [n for n, p in agents.final_phase.items() if p != "Succeeded"]
        old = replay_old_path(fleet, result, args.old_window, excluded, raw_job, tasks, failed)
    report_round(label, new, old)
    return new, old


def report_round(label: str, new: Json, old: Json | None) -> None:
    print(f"  {label} new path: {new['reports']} reports over {new['sim_seconds']:.0f} simulated s "
          f"(peak {new['peak_reports_per_s']}/s) in {new['wall_seconds']:.0f} s wall; "
          f"hottest key {new['hottest_key']}: {new['hottest_key_writes_per_report']} writes/report, "
          f"peak {new['hottest_key_wcu_per_s']} WCU/s (avg {new['hottest_key_avg_wcu_per_s']}); "
          f"job item {new['job_item_writes_per_report']} writes/report, {new['job_item_bytes']} B; "
          f"registry budget {new['budget_keys']}; "
          f"throttles {new['throttles']}, conflicts {new['transaction_conflicts']}, DLQ {new['dlq_messages']}, "
          f"lost {new['lost_reports']}, counters exact {new['counters_exact']} {new['counters']}; "
          f"slot refill p50 {new['slot_refill_p50_s']} s p99 {new['slot_refill_p99_s']} s; "
          f"{new['returned_items']} items handed back, waiting p50 {new['returned_wait_p50_s']} s max "
          f"{new['returned_wait_max_s']} s of wall clock (SQS visibility on moto, real); "
          f"{new['duplicated']} duplicated, {new['reordered']} reordered, agent of {new['restarted_agent']} restarted")
    for problem in new["problems"]:
        print(f"    problem: {problem}")
    if old is not None:
        print(f"  {label} old path (first {old['sim_seconds']} simulated s replayed, {old['reports']} reports): "
              f"hottest key {old['hottest_key']}: {old['hottest_key_writes_per_report']} writes/report, "
              f"job item {old['job_item_writes_per_report']} writes/report, peak {old['hottest_key_wcu_per_s']} "
              f"WCU/s consumed, {old['offered_wcu_per_s_at_peak_rate']} WCU/s asked at the peak report rate; "
              f"throttles {old['throttles']}, conflicts {old['transaction_conflicts']}, "
              f"{old['deliveries_refused']} deliveries refused, DLQ {old['dlq_messages']}; job item "
              f"{old['job_item_bytes_at_start']} B at the start, {old['job_item_bytes']} B with the round's "
              "failedNodes")


def benchmark(args: argparse.Namespace) -> Json:
    print_machine()
    load_before = load_average()
    started = time.perf_counter()
    clock = SimClock()
    with LimitedMoto(clock) as moto, KubeApiProcess(nodes=args.nodes) as api:
        from prewarm_devtools.sam.aws import aws_environment

        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
        with aws_environment(moto.url):
            fleet = Fleet(args, clock, moto, api)
            fleet.deploy()
            print(f"fleet: {args.nodes} simulated agents; moto with the AWS limits layer in its own process at "
                  f"{moto.url}; record_status by local mode's event source mapping: batches of up to "
                  f"{fleet.batch_size}, up to {fleet.concurrency} in flight (template.yaml)")
            try:
                always = always_old = never = never_old = None
                if args.rounds in ("both", "always"):
                    always, always_old = run_job(fleet, "always", "Always", args.parallelism or args.nodes,
                                                 args.seed)
                if args.rounds in ("both", "never"):
                    never, never_old = run_job(fleet, "never", "Never",
                                               args.never_parallelism or max(1, args.nodes // 2), args.seed + 1)
                concurrency = fleet.concurrency_figures()
            finally:
                fleet.close()
    wall = time.perf_counter() - started
    print(f"  batches in flight: max {concurrency['max']}, mean {concurrency['mean']}; "
          f"mean batch {concurrency['mean_batch']} messages; whole benchmark {wall:.0f} s wall; "
          f"load average before {load_before}, after {load_average()}")
    met = True
    if always is not None:
        print("  targets (Always job, new path):")
        met = print_targets(targets(always)) and met
    if never is not None:
        print("  targets (Never round, new path):")
        met = print_targets(targets(never)) and met
    # The top level is the Always job's (the Never round's when it ran alone), with the losses of both.
    first = always if always is not None else never
    assert first is not None
    ran = [r for r in (always, never) if r is not None]
    out = {k: first[k] for k in ("nodes", "reports", "sim_seconds", "wall_seconds", "hottest_key",
                                 "hottest_key_writes_per_report", "hottest_key_wcu_per_s", "throttles",
                                 "transaction_conflicts", "job_item_bytes", "budget_keys")}
    out["dlq_messages"] = max(r["dlq_messages"] for r in ran)
    out["lost_reports"] = sum(r["lost_reports"] for r in ran)
    out["counters_exact"] = all(r["counters_exact"] for r in ran)
    out["slot_refill_p50_s"] = never["slot_refill_p50_s"] if never is not None else None
    out["slot_refill_p99_s"] = never["slot_refill_p99_s"] if never is not None else None
    out["returned_items"] = sum(r["returned_items"] for r in ran)
    out.update(targets_met=met, benchmark_wall_seconds=round(wall, 1), concurrency=concurrency,
               load_average=[load_before, load_average()], rounds=args.rounds, always=always, old=always_old,
               never=None if never is None else {**never, "old": never_old})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/fleet.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="synthetic nodes and simulated agents (default 5000)")
    parser.add_argument("--parallelism", type=int, default=0, help="of the Always job (default: every node)")
    parser.add_argument("--never-parallelism", type=int, default=0, help="of the Never job (default: half the nodes)")
    parser.add_argument("--pull-median", type=float, default=120.0, help="median pull time, simulated s (default 120)")
    parser.add_argument("--pull-sigma", type=float, default=0.4, help="lognormal sigma of pull times (default 0.4)")
    parser.add_argument("--failures", type=float, default=0.10, help="share of pulls that fail (default 0.10)")
    parser.add_argument("--disorder", type=float, default=0.01,
                        help="share of reports duplicated or held back (default 0.01)")
    parser.add_argument("--old-window", type=float, default=15.0,
                        help="simulated seconds of each round replayed through the old path (default 15; 0: none)")
    parser.add_argument("--max-sim-seconds", type=float, default=0.0,
                        help="give up on a round after (default: 20 median pulls)")
    parser.add_argument("--rounds", choices=("both", "always", "never"), default="both",
                        help="the Always job, the Never job's daily round, or both (default)")
    parser.add_argument("--clusters", type=int, default=1,
                        help="split --nodes over this many clusters with the same node names, one push warming "
                             "all (default 1: one cluster, no push; above 1 with --rounds always only)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--verbose", action="store_true", help="a progress line every 30 simulated s")
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.pull_median < 5:
        parser.error("--nodes must be at least 2 and --pull-median at least 5")
    if args.clusters < 1:
        parser.error(f"--clusters must be at least 1, not {args.clusters}")
    if args.clusters > 1:
        if args.rounds != "always":
            parser.error("--clusters above 1 runs the Always jobs one push makes: add --rounds always")
        if args.nodes % args.clusters or args.nodes // args.clusters < 2:
            parser.error(f"--nodes {args.nodes} must be a multiple of --clusters {args.clusters}, at least 2 each")
        from benchmarks.fleet_clusters import benchmark_clusters

        emit(benchmark_clusters(args))
        return 0
    emit(benchmark(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
