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

`--scenario jobs` (issue 35): the same cluster with 20 running `Never` jobs of 5,000 nodes each
(`--jobs`, `--job-nodes`), `--in-flight` nodes of each still pulling, the rest succeeded, and
`--tainted` new nodes that joined with the startup taint and whose agent never said hello. Each node
is registered (no queues: none departs). Targets: each run within its budget, and every tainted node
released by the first run (fail-open on time, whatever the jobs cost). Prints each run's time, the
table's items read and calls, and peak memory. `--baseline` runs main's sweep (commit `--baseline-ref`)
on the same table first, for comparison.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Target, emit, peak_rss_mb, print_machine, print_targets, rss_mb, run_child
from benchmarks.servers import KubeApiProcess, MotoProcess

BUDGET_S = 55.0  # the sweep function's Timeout in template.yaml
PEAK_MB = 256.0


def padded_nodes(count: int, images: int, seed: int = 11) -> list[dict[str, Any]]:
    """Synthetic EKS nodes, each with `images` images (the synthetic ones, then made-up ones)."""
    from prewarm_devtools.kubeapi.synthetic import generate_nodes

    rng = random.Random(seed)
    nodes = generate_nodes(count, seed=seed)
    for node in nodes:
        listed = node["status"]["images"]
        while len(listed) < images:
            repo = f"111122223333.dkr.ecr.us-west-2.amazonaws.com/team-{rng.randrange(40)}/app-{len(listed)}"
            digest = f"sha256:{rng.getrandbits(256):064x}"
            listed.append({"names": [f"{repo}@{digest}", f"{repo}:v{rng.randrange(100)}"],
                           "sizeBytes": rng.randrange(10**8, 10**10)})
    return nodes


def prepare(nodes: list[str], departed: list[str], env: dict[str, str]) -> None:
    """Each node's queue and registration, as its agent leaves them (departed nodes' too)."""
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
                                      last_hello=time.time()))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, [*nodes, *departed]))


class CountingCluster:
    """The Kubernetes adapter, counting requests by verb and representation (full or metadata)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.calls: collections.Counter[str] = collections.Counter()
        request = cluster._request

        def counted(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            shape = "metadata" if "PartialObjectMetadata" in kwargs.get("accept", "") else "full"
            what = "list" if path.endswith("/nodes") and method == "GET" else method.lower()
            self.calls[f"{what} {path.split('/')[-2] if what != 'list' else 'nodes'} ({shape})"] += 1
            return request(method, path, *args, **kwargs)

        cluster._request = counted


class TableReads:
    """DynamoDB calls by operation and the items they read, counted from botocore's events."""

    def __init__(self, session: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.items = 0
        session.events.register("before-call.*.*", self._before)
        session.events.register("after-call.dynamodb.*", self._after)

    def _before(self, model: Any, **_: Any) -> None:
        self.calls[f"{model.service_model.service_name} {model.name}"] += 1

    def _after(self, parsed: dict[str, Any], **_: Any) -> None:
        self.items += len(parsed.get("Items", [])) + int("Item" in parsed)
        self.items += sum(len(v) for v in (parsed.get("Responses") or {}).values() if isinstance(v, list))

    def clear(self) -> None:
        self.calls.clear()
        self.items = 0


def time_left_from(started: float) -> Callable[[], float]:
    """The seconds left of the function's budget for a run started at `started` (monotonic)."""
    return lambda: BUDGET_S - (time.monotonic() - started)


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
    for name in ("cold", "warm"):
        aws.clear()
        counting.calls.clear()
        gc.collect()
        started = time.monotonic()
        budget = TimeBudget(time_left_from(started))
        result = sweep(store, queues, clusters, now=time.time(), config=SweepSettings(prefix=env["NODE_QUEUE_PREFIX"]),
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
            prepare(names, gone, env)
            print(f"  {len(names) + departed} queues and registrations made in {time.monotonic() - started:.0f} s "
                  f"(a node is {node_kb:.0f} KB of JSON)", flush=True)
            runs = run_child("sweep", ["--child", "--kube", api.url, "--token", api.token,
                                       "--env", json.dumps(env)], timeout=900)
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


# --- `--scenario jobs`: 20 running 5,000-node jobs ---------------------------------------------------

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def new_tainted_nodes(nodes: list[dict[str, Any]], count: int, now: float) -> list[str]:
    """Makes the first `count` nodes new ones (joined 5 minutes before `now`, Ready for 4) holding the
    startup taint: before the agents' deadline (900 s), so only the no-hello rule releases them."""
    from prewarm.domain.kubernetes import format_time

    for node in nodes[:count]:
        node["metadata"]["creationTimestamp"] = format_time(now - 300)
        node.setdefault("spec", {})["taints"] = [*node["spec"].get("taints", []), dict(TAINT)]
        node["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                         "lastTransitionTime": format_time(now - 240)}]
    return [n["metadata"]["name"] for n in nodes[:count]]


def seed_jobs(env: dict[str, str], names: list[str], registered: list[str], *, jobs: int, in_flight: int,
              now: float) -> None:
    """`jobs` running `Never` jobs over `names`, each with `in_flight` nodes pulling (reported 2 s before
    `now`) and the rest succeeded; and `registered` nodes' hellos."""
    import boto3

    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.domain.jobs import job_key
    from prewarm.domain.messages import NodePhase
    from prewarm.domain.nodes import RegisteredNode
    from prewarm.domain.status import Counters, NodeTaskRecord
    from prewarm.services.jobs import apply_manifest

    store = DynamoJobStore(env["TABLE_NAME"], client=boto3.client("dynamodb"))

    def job(index: int) -> None:
        doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
               "metadata": {"name": f"never-{index}", "namespace": "bench"},
               "spec": {"image": f"public.ecr.aws/bench/app-{index}:1", "parallelism": len(names),
                        "completionPolicy": {"type": "Never"}}}
        applied = apply_manifest(store, doc, now=now - 600)
        key = job_key(applied.namespace, applied.name)
        shards = store.reserve_shards(key, len(names))
        record = store.get_job(key)
        assert record is not None
        pulling = set(names[:: max(1, len(names) // in_flight)][:in_flight])
        tasks = [NodeTaskRecord(node=n, round=0, dispatched_at=now - 500, updated_at=now - 2,
                                phase=NodePhase.PULLING if n in pulling else NodePhase.SUCCEEDED, seq=1, version=1)
                 for n in names]
        store.put_tasks(key, tasks, shards=shards)
        store.commit_plan(key, plan_id=record.plan_id, expected_version=record.version,
                          counters=Counters(desired=len(names), active=len(pulling),
                                            succeeded=len(names) - len(pulling)), extra={"start_time": now - 600})

    def hello(name: str) -> None:
        store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux", queue_url="",
                                      last_hello=now - 60))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(job, range(jobs)))
        list(pool.map(hello, registered))


def jobs_child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: two runs a minute apart (the first a cold function instance), as the function runs them."""
    import boto3

    from prewarm.adapters.clusters import StackClusters
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.sqs import NodeQueues
    from prewarm.domain.warming import SettledNodes
    from prewarm.services.budget import TimeBudget
    from prewarm.services.schedules import SweepSettings, sweep

    env = json.loads(args.env)
    session = boto3.Session()
    table = TableReads(session)
    store = DynamoJobStore(env["TABLE_NAME"], client=session.client("dynamodb"))
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=session.client("sqs"))
    kube = KubeCluster(args.kube, lambda: args.token)
    counting = CountingCluster(kube)
    patched: list[float] = []
    request = kube._request

    def timed(method: str, path: str, *rest: Any, **kwargs: Any) -> Any:
        if method == "PATCH":
            patched.append(time.monotonic())
        return request(method, path, *rest, **kwargs)

    kube._request = timed
    clusters = StackClusters(store, "", own_api=lambda: kube, registered_api=KubeCluster.for_registered)
    settled = SettledNodes()
    runs = {}
    for index, name in enumerate(("first", "next")):
        table.clear()
        counting.calls.clear()
        patched.clear()
        gc.collect()
        started = time.monotonic()
        config = SweepSettings(prefix=env["NODE_QUEUE_PREFIX"], no_agent_grace_seconds=120)
        result = sweep(store, queues, clusters, now=args.now + 60 * index, config=config,
                       budget=TimeBudget(time_left_from(started)), settled=settled)
        runs[name] = {
            "seconds": round(time.monotonic() - started, 2),
            "taints_released": len(result.taints_released),
            "last_taint_released_s": round(max(patched) - started, 2) if patched else None,
            "jobs_read": getattr(result, "jobs_read", None), "jobs_deferred": getattr(result, "jobs_deferred", None),
            "silent_nodes": len(result.silent_nodes), "resent": result.resent,
            "items_read": table.items, "peak_rss_mb": round(peak_rss_mb(), 1),
            "kubernetes_calls": dict(sorted(counting.calls.items())), "aws_calls": dict(sorted(table.calls.items())),
        }
    kube.close()
    return runs


def jobs_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from prewarm_devtools.sam.aws import aws_environment
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    print(f"sweep: {args.jobs} running Never jobs of {args.job_nodes} nodes ({args.in_flight} in flight each), "
          f"{args.nodes} nodes of {args.images} images, {args.tainted} new and tainted with no hello", flush=True)
    now = time.time()
    objects = padded_nodes(args.nodes, args.images)
    tainted = new_tainted_nodes(objects, args.tainted, now)
    names = [n["metadata"]["name"] for n in objects]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        seed = Path(tmp) / "nodes.json"
        seed.write_text(json.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
        del objects
        gc.collect()
        with KubeApiProcess(seeds=[seed]) as api, MotoProcess() as moto, aws_environment(moto.url):
            stack = LocalStack(moto.url, parameters={"ClusterName": "local"},
                               stack_name=f"sweep-{uuid.uuid4().hex[:6]}").deploy()
            env = stack.env()
            started = time.monotonic()
            seed_jobs(env, names[: args.job_nodes], [n for n in names if n not in set(tainted)], jobs=args.jobs,
                      in_flight=args.in_flight, now=now)
            print(f"  {args.jobs * args.job_nodes} node items and {len(names) - len(tainted)} registrations written "
                  f"in {time.monotonic() - started:.0f} s", flush=True)
            child_args = ["--child", "--scenario", "jobs", "--kube", api.url, "--token", api.token,
                          "--env", json.dumps(env), "--now", str(now)]
            if args.baseline:
                old = Path(tmp) / "baseline"
                old.mkdir()
                archive = subprocess.run(["git", "archive", args.baseline_ref, "layers/shared/python"],
                                         cwd=Path(__file__).resolve().parents[1], capture_output=True, check=True)
                subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
                path = f"{old / 'layers/shared/python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
                results["baseline"] = run_child("sweep", child_args, timeout=1800,
                                                env={**os.environ, "PYTHONPATH": path})
            results["prewarm"] = run_child("sweep", child_args, timeout=900)
    for way, runs in results.items():
        for name, run in runs.items():
            print(f"  {way} {name} run: {run['seconds']} s; {run['taints_released']} taints released (last at "
                  f"{run['last_taint_released_s']} s); jobs read {run['jobs_read']}, deferred {run['jobs_deferred']}; "
                  f"{run['items_read']} items read; peak RSS {run['peak_rss_mb']} MB; AWS {run['aws_calls']}; "
                  f"Kubernetes {run['kubernetes_calls']}", flush=True)
    ours = results["prewarm"]
    met = print_targets([
        Target("first_run_s", ours["first"]["seconds"], BUDGET_S, " s"),
        Target("next_run_s", ours["next"]["seconds"], BUDGET_S, " s"),
        Target("tainted_released_first_run", ours["first"]["taints_released"], args.tainted, at_least=True),
        Target("peak_rss_mb", max(r["peak_rss_mb"] for r in ours.values()), PEAK_MB, " MB"),
    ])
    return {"scenario": "jobs", "jobs": args.jobs, "job_nodes": args.job_nodes, "in_flight": args.in_flight,
            "nodes": args.nodes, "tainted": args.tainted, **results, "targets_met": met}


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
