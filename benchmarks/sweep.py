"""The every-minute sweep at scale: 5,000 nodes carrying 50 images each, 1,000 of them just departed.

The embedded Kubernetes API (its own process) serves `--nodes` synthetic EKS nodes, each padded to
`--images` images in its status (a Node is then ~15 KB of JSON); template.yaml is deployed onto moto
(its own process, behind the AWS limits layer). Every node, and `--departed` more that have left the
cluster, has its queue and its registration, as an agent leaves them.

The sweep runs in a fresh interpreter, as a cold Lambda invocation does, with the function's 55 s
budget: its peak memory is that process's peak resident set (`VmHWM`, as Lambda's "Max Memory Used";
imports included). Two runs: the
**cold** one (departed nodes to forget, and every node past its startup-taint deadline still to be
read once, 500 a run) and the next, **warm** one, in the same process. Each prints its Kubernetes calls
(by verb and representation) and its AWS calls (by operation).

Target: peak memory of the function at most 256 MB (the function has 512 MB); every departed node's
queue and registration gone within the cold run's budget.

`--scenario jobs` (issue 35, `benchmarks/sweep_jobs.py`): the same cluster with 20 running `Never`
jobs of 5,000 nodes each, a few nodes of each in flight, and new tainted nodes no agent said hello
from. Targets: each run within its budget (measured on moto, and modelled on AWS from published
latencies), every tainted node released by the first run (fail-open on time, whatever the jobs cost).
Prints each run's time per phase, DynamoDB reads (calls, items, read units), peak memory and modelled
AWS time. `--baseline` runs an older sweep (commit `--baseline-ref`) on the same table first.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Target, emit, peak_rss_mb, print_machine, print_targets, rss_mb, run_child
from benchmarks.servers import KubeApiProcess, MotoProcess
from benchmarks.sweep_jobs import jobs_benchmark, jobs_child
from benchmarks.sweep_parts import BUDGET_S, PEAK_MB, CountingCluster, outside_repairs, padded_nodes, time_left_from


def prepare(nodes: list[str], departed: list[str], env: dict[str, str], now: float) -> None:
    """Each node's queue and registration, as its agent leaves them (departed nodes' too), its hello at `now`."""
    import boto3

    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.sqs import NodeQueues
    from prewarm.domain.nodes import RegisteredNode

    sqs, ddb = boto3.client("sqs"), boto3.client("dynamodb")
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=sqs)
    store = DynamoJobStore(env["TABLE_NAME"], client=ddb)

    def one(name: str) -> None:
        url = queues.ensure_queue(name)
        store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux", queue_url=url,
                                      last_hello=now))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, [*nodes, *departed]))


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: the cold sweep, then the warm one, as the function runs them."""
    import boto3

    from prewarm.adapters.clusters import StackClusters
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.sqs import NodeQueues
    from prewarm.domain.warming import SettledNodes
    from prewarm.services.budget import TimeBudget
    from prewarm.services.schedules import SweepSettings, sweep

    env = json.loads(args.env)
    aws: collections.Counter[str] = collections.Counter()
    session = boto3.Session()
    session.events.register("before-call.*.*", lambda model, **_: aws.update([f"{model.service_model.service_name} "
                                                                               f"{model.name}"]))
    sqs, ddb = session.client("sqs"), session.client("dynamodb")
    store = DynamoJobStore(env["TABLE_NAME"], client=ddb)
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=sqs)
    kube = KubeCluster(args.kube, lambda: args.token)
    counting = CountingCluster(kube)
    clusters = StackClusters(store, "", own_api=lambda: kube, registered_api=KubeCluster.for_registered)
    settled = SettledNodes()
    runs = {}
    began = time.monotonic()  # the runs' clock starts at --now, as the registrations' hellos
    for name in ("cold", "warm"):
        aws.clear()
        counting.calls.clear()
        gc.collect()
        started = time.monotonic()
        budget = TimeBudget(time_left_from(started))
        now = args.now + time.monotonic() - began
        result = sweep(store, queues, clusters, now=now, config=SweepSettings(prefix=env["NODE_QUEUE_PREFIX"]),
                       budget=budget, settled=settled)
        seconds = time.monotonic() - started
        runs[name] = {
            "seconds": round(seconds, 2), "queues_deleted": len(result.queues_deleted),
            "nodes_forgotten": len(result.nodes_forgotten), "departures_deferred": result.departures_deferred,
            "taints_released": len(result.taints_released), "nodes_settled": len(settled.of("")),
            "peak_rss_mb": round(peak_rss_mb(), 1), "rss_after_mb": round(rss_mb(), 1),
            "kubernetes_calls": dict(sorted(counting.calls.items())), "aws_calls": dict(sorted(aws.items())),
        }
    kube.close()
    return runs


def benchmark(nodes: int, images: int, departed: int) -> dict[str, Any]:
    from prewarm_devtools.sam.aws import aws_environment
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    print(f"sweep: {nodes} nodes with {images} images each, {departed} departed")
    objects = padded_nodes(nodes, images)
    names = [n["metadata"]["name"] for n in objects]
    node_kb = len(json.dumps(objects[0])) / 1024
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        seed = Path(tmp) / "nodes.json"
        seed.write_text(json.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
        del objects
        gc.collect()
        gone = [f"ip-10-1-{i // 250}-{i % 250}.us-west-2.compute.internal" for i in range(departed)]
        with KubeApiProcess(seeds=[seed]) as api, MotoProcess() as moto, aws_environment(moto.url):
            stack = LocalStack(moto.url, parameters={"ClusterName": "local"},
                               stack_name=f"sweep-{uuid.uuid4().hex[:6]}").deploy()
            env = stack.env()
            started = time.monotonic()
            # Both runs in minutes of the sweep's own, not the node repair's (their clock starts here).
            now = outside_repairs(time.time(), 3)
            prepare(names, gone, env, now)
            print(f"  {len(names) + departed} queues and registrations made in {time.monotonic() - started:.0f} s "
                  f"(a node is {node_kb:.0f} KB of JSON)", flush=True)
            runs = run_child("sweep", ["--child", "--kube", api.url, "--token", api.token,
                                       "--env", json.dumps(env), "--now", str(now)], timeout=900)
    for name, run in runs.items():
        print(f"  {name}: {run['seconds']} s; {run['queues_deleted']} queues deleted, {run['nodes_forgotten']} "
              f"registrations forgotten, {run['departures_deferred']} deferred, {run['nodes_settled']} nodes' "
              f"taints settled; peak RSS {run['peak_rss_mb']} MB ({run['rss_after_mb']} MB after); "
              f"Kubernetes {run['kubernetes_calls']}; AWS {run['aws_calls']}", flush=True)
    cold = runs["cold"]
    met = print_targets([
        Target("peak_rss_mb", max(r["peak_rss_mb"] for r in runs.values()), PEAK_MB, " MB"),
        Target("cold_departed_forgotten", cold["nodes_forgotten"], departed, at_least=True),
        Target("cold_sweep_s", cold["seconds"], BUDGET_S, " s"),
    ])
    return {"nodes": nodes, "images": images, "departed": departed, "node_kb": round(node_kb, 1), **runs,
            "targets_met": met}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=5000, help="nodes in the cluster (default 5000)")
    parser.add_argument("--images", type=int, default=50, help="images in each node's status (default 50)")
    parser.add_argument("--departed", type=int, default=1000, help="nodes gone with their queues left (default 1000)")
    parser.add_argument("--scenario", choices=("departures", "jobs"), default="departures",
                        help="departures (default): departed nodes and taint reads; jobs: 20 running 5,000-node jobs")
    parser.add_argument("--jobs", type=int, default=20, help="jobs: running Never jobs (default 20)")
    parser.add_argument("--job-nodes", type=int, default=5000, help="jobs: nodes of each job (default 5000)")
    parser.add_argument("--in-flight", type=int, default=50, help="jobs: nodes still pulling per job (default 50)")
    parser.add_argument("--tainted", type=int, default=20, help="jobs: new nodes tainted, no hello (default 20)")
    parser.add_argument("--baseline", action="store_true", help="jobs: run --baseline-ref's sweep first")
    parser.add_argument("--baseline-ref", default="bda72a2", help="jobs: the commit of the baseline (default bda72a2)")
    parser.add_argument("--now", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kube", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        emit(jobs_child(args) if args.scenario == "jobs" else child(args))
        return 0
    if args.nodes < 1 or args.images < 1 or args.departed < 0:
        parser.error("--nodes and --images must be at least 1, --departed not negative")
    if args.scenario == "jobs":
        if not 0 < args.job_nodes <= args.nodes or args.jobs < 1 or not 0 < args.in_flight <= args.job_nodes:
            parser.error("--jobs at least 1, --job-nodes within --nodes, --in-flight within --job-nodes")
        emit(jobs_benchmark(args))
        return 0
    emit(benchmark(args.nodes, args.images, args.departed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
