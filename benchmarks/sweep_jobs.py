"""`sweep.py --scenario jobs` (issue 35): the sweep with 20 running `Never` jobs of 5,000 nodes each.

The cluster of the departures scenario with `--jobs` running jobs of `--job-nodes` nodes, `--in-flight`
nodes of each still pulling (last reported 2 s before the run), the rest succeeded, and `--tainted` new
nodes that joined with the startup taint and whose agent never said hello. Every other node is
registered. Two runs a minute apart in one fresh process (the first a cold function instance), each
with the function's 55 s budget.

**Seeding.** moto runs in this process (a `ThreadedMotoServer` behind the AWS limits layer), so the
jobs' node items (100,000 at full scale) are written straight into moto's table: no HTTP, no limits
layer, no stream records (nothing reads the stream here). The jobs themselves, their plans and the
registrations go through the product's own store, over HTTP.

**Measured** (each run, in the child process that runs the sweep): wall time per phase, on moto and
this machine; the calls; DynamoDB items read and read units, by DynamoDB's rules ("Read/write capacity
mode": an item of a GetItem or BatchGetItem, or a Query's items together, rounded up to 4 KB; half for
an eventually consistent read; a miss costs the minimum) from each request and the items returned,
since moto reports no real consumed capacity; peak resident memory; the process's CPU time.
**Modelled** (the time on AWS): each call at its published latency (`capacity_calls.LATENCY_S`), a
phase's calls one after another, the job loop's jobs on its 8 workers in order; plus the CPU time scaled
to the function's 512 MB (a vCPU at 1,769 MB). moto's own speed (a query on its server, its JSON) is
not the product's: the wall times here are an upper bound, the counts carry over.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.capacity_calls import FULL_VCPU_MB, latency
from benchmarks.measure import Target, peak_rss_mb, print_machine, print_targets, run_child
from benchmarks.servers import KubeApiProcess
from benchmarks.sweep_parts import BUDGET_S, PEAK_MB, CountingCluster, outside_repairs, padded_nodes, time_left_from

MEMORY_MB = 512  # the sweep function's MemorySize (template.yaml, Globals)
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
# A run's phases, in order: fail-open, departures and the clusters' other work; the job and node
# listings; the job loop; the parked jobs' plans.
PHASES = ("clusters", "listings", "job loop", "the rest")


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


def write_straight(moto: Any, table_name: str, items: Sequence[dict[str, Any]]) -> None:
    """Puts wire-format `items` straight into moto's table in this process, with no stream records."""
    from moto.dynamodb.models import dynamodb_backends

    from prewarm_devtools.account import ACCOUNT, REGION

    table = dynamodb_backends[ACCOUNT][REGION].get_table(table_name)
    with moto.layer.dynamodb.write_lock if moto.layer is not None else contextlib.nullcontext():
        stream, table.stream_shard = table.stream_shard, None
        try:
            for item in items:
                table.put_item(item)
        finally:
            table.stream_shard = stream


def seed_jobs(moto: Any, env: dict[str, str], names: list[str], registered: list[str], *, jobs: int,
              in_flight: int, now: float) -> None:
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
        # The node items as the store writes them (`put_tasks`), straight into the table; then, through
        # the store, what else a plan writes beside them (with no items: the `flight` index's marker).
        write_straight(moto, env["TABLE_NAME"], [store._task_item(key, t, shards) for t in tasks])
        store.put_tasks(key, [], shards=shards)
        store.commit_plan(key, plan_id=record.plan_id, expected_version=record.version,
                          counters=Counters(desired=len(names), active=len(pulling),
                                            succeeded=len(names) - len(pulling)), extra={"start_time": now - 600})

    def hello(name: str) -> None:
        store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux", queue_url="",
                                      last_hello=now - 60))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(job, range(jobs)))
        list(pool.map(hello, registered))


# --- what a run calls and reads, and its time on AWS --------------------------------------------------


class RunCalls:
    """A run's calls: DynamoDB's by operation, the items they read and their read units (see the module);
    each AWS and Kubernetes call's modelled latency, summed per phase, and in the job loop per job."""

    def __init__(self, session: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.items = 0
        self.read_units = 0.0
        self.phase = PHASES[0]
        self.latency_s: collections.Counter[str] = collections.Counter()  # per phase, one call after another
        self.jobs_s: dict[str, float] = {}  # per job of the job loop, one call after another
        self.counting_cpu_s = 0.0  # this class's own CPU, not the sweep's
        # Per server, the seconds its answers were waited for, summed over the threads (moto, the API).
        self.waited_s: collections.Counter[str] = collections.Counter()
        self.job = threading.local()  # `key`: the job a job loop thread sweeps; `fanned`: a fan-out's send
        self._lock = threading.Lock()
        session.events.register("before-parameter-build.dynamodb.*", self._params)
        session.events.register("before-call.*.*", self._before)
        session.events.register("after-call.*.*", self._waited)
        session.events.register("after-call.dynamodb.*", self._after)

    def clear(self) -> None:
        self.calls.clear()
        self.latency_s.clear()
        self.jobs_s.clear()
        self.waited_s.clear()
        self.items, self.read_units, self.counting_cpu_s, self.phase = 0, 0.0, 0.0, PHASES[0]

    def charge(self, op: str, count: int = 1) -> None:
        """`count` calls of `op` ("dynamodb:Query", "kubernetes:get_node") one after another, at its modelled
        latency; a send of a fan-out is not (`fan_out` charges those)."""
        if getattr(self.job, "fanned", False):
            return
        seconds = latency(op) * count
        job = getattr(self.job, "key", None)
        with self._lock:
            if job is None:
                self.latency_s[self.phase] += seconds
            else:
                self.jobs_s[job] = self.jobs_s.get(job, 0.0) + seconds

    def fan_out(self, queues: Any) -> None:
        """`queues.send_many` sends on `queues.workers` threads: charged as its rounds of SendMessage, to the
        phase or job that called it."""
        if not hasattr(queues, "_send_or_fail"):  # an older adapter (`--baseline`): its sends charged one by one
            return
        send_many, send_or_fail = queues.send_many, queues._send_or_fail

        def fanned_send(message: Any) -> Any:
            self.job.fanned = True
            try:
                return send_or_fail(message)
            finally:
                self.job.fanned = False

        def fanned_send_many(messages: Sequence[Any]) -> Any:
            self.charge("sqs:SendMessage", -(-len(messages) // queues.workers))
            return send_many(messages)

        queues._send_or_fail, queues.send_many = fanned_send, fanned_send_many

    def _params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = params

    def _before(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model.service_name
        context["bench_started"] = time.monotonic()
        with self._lock:
            self.calls[f"{service} {model.name}"] += 1
        self.charge(f"{service}:{model.name}")

    def _waited(self, context: dict[str, Any], **_: Any) -> None:
        self.wait("moto", time.monotonic() - context.get("bench_started", time.monotonic()))

    def wait(self, server: str, seconds: float) -> None:
        with self._lock:
            self.waited_s[server] += seconds

    def _after(self, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        from prewarm_devtools.aws_limits import item_size, read_units

        started = time.thread_time()
        params = context.get("bench_params") or {}
        units, items = 0.0, 0
        if model.name == "GetItem":
            items = int("Item" in parsed)
            units = read_units(item_size(parsed.get("Item")), consistent=bool(params.get("ConsistentRead")))
        elif model.name in ("Query", "Scan"):
            items = len(parsed.get("Items", []))
            units = read_units(sum(item_size(i) for i in parsed.get("Items", [])),
                               consistent=bool(params.get("ConsistentRead")))
        elif model.name == "BatchGetItem":
            for table, spec in params.get("RequestItems", {}).items():
                got = parsed.get("Responses", {}).get(table, [])
                left = len(parsed.get("UnprocessedKeys", {}).get(table, {}).get("Keys", []))
                misses = len(spec.get("Keys", [])) - left - len(got)
                consistent = bool(spec.get("ConsistentRead"))
                items += len(got)
                units += sum(read_units(item_size(i), consistent=consistent) for i in got)
                units += misses * read_units(0, consistent=consistent)
        with self._lock:
            self.items += items
            self.read_units += units
            self.counting_cpu_s += time.thread_time() - started

    def job_loop_s(self, workers: int) -> float:
        """The job loop's modelled time: each job's calls one after another, the jobs started in order on
        the first of `workers` free."""
        free = [0.0] * workers
        for seconds in self.jobs_s.values():
            free[free.index(min(free))] += seconds
        return max(free)


class Phases:
    """Wall and CPU time at each phase's start: the sweep's steps wrapped to mark them."""

    def __init__(self, calls: RunCalls) -> None:
        self.calls = calls
        self.marks: list[tuple[str, float, float]] = []

    def start(self, phase: str) -> None:
        self.calls.phase = phase
        self.marks.append((phase, time.monotonic(), time.process_time()))

    def spans(self, end: tuple[float, float]) -> dict[str, tuple[float, float]]:
        """Per phase, (wall seconds, CPU seconds)."""
        bounds = [*self.marks, ("", *end)]
        return {name: (b[1] - a[1], b[2] - a[2]) for (name, *_), a, b in zip(self.marks, bounds, bounds[1:],
                                                                            strict=False)}

    def install(self) -> None:
        """Marks the phases of this sweep; an older one (`--baseline`) lacking a step is not marked there."""
        import importlib

        import prewarm.services.schedules as schedules

        def marking(phase: str, after: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                self.start(phase)
                try:
                    return original(*args, **kwargs)
                finally:
                    self.start(after)

            return run

        def per_job(one_job: Callable[..., Any]) -> Callable[..., Any]:
            def job(store: Any, queues: Any, record: Any, **kwargs: Any) -> Any:
                self.calls.job.key = record.key
                try:
                    return one_job(store, queues, record, **kwargs)
                finally:
                    self.calls.job.key = None

            return job

        for name, phase, after in (("_sweep_clusters", "clusters", "listings"), ("sweep_jobs", "job loop", "the rest")):
            if hasattr(schedules, name):
                setattr(schedules, name, marking(phase, after, getattr(schedules, name)))
        with contextlib.suppress(ImportError):
            jobs = importlib.import_module("prewarm.services.sweep_jobs")
            jobs.sweep_job = per_job(jobs.sweep_job)


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
    calls = RunCalls(session)
    phases = Phases(calls)
    phases.install()
    store = DynamoJobStore(env["TABLE_NAME"], client=session.client("dynamodb"))
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=session.client("sqs"))
    calls.fan_out(queues)
    kube = KubeCluster(args.kube, lambda: args.token)
    counting = CountingCluster(kube, on_call=calls.charge)
    patched: list[float] = []
    request = kube._request

    def timed(method: str, path: str, *rest: Any, **kwargs: Any) -> Any:
        if method == "PATCH":
            patched.append(time.monotonic())
        started = time.monotonic()
        try:
            return request(method, path, *rest, **kwargs)
        finally:
            calls.wait("kubernetes api", time.monotonic() - started)

    kube._request = timed
    clusters = StackClusters(store, "", own_api=lambda: kube, registered_api=KubeCluster.for_registered)
    settled = SettledNodes()
    config = SweepSettings(prefix=env["NODE_QUEUE_PREFIX"], no_agent_grace_seconds=120)
    runs = {}
    for index, name in enumerate(("first", "next")):
        calls.clear()
        counting.calls.clear()
        patched.clear()
        phases.marks.clear()
        gc.collect()
        started, cpu = time.monotonic(), time.process_time()
        phases.start("clusters")
        result = sweep(store, queues, clusters, now=args.now + 60 * index, config=config,
                       budget=TimeBudget(time_left_from(started)), settled=settled)
        end = (time.monotonic(), time.process_time())
        spans = phases.spans(end)
        cpu_s = end[1] - cpu - calls.counting_cpu_s
        scale = FULL_VCPU_MB / MEMORY_MB
        modelled = {phase: calls.latency_s[phase] for phase in PHASES}
        modelled["job loop"] += calls.job_loop_s(getattr(config, "job_workers", 1))  # an older sweep: one at a time
        runs[name] = {
            "seconds": round(end[0] - started, 2),
            "phases_s": {phase: round(spans.get(phase, (0.0, 0.0))[0], 2) for phase in PHASES},
            "taints_released": len(result.taints_released),
            "last_taint_released_s": round(max(patched) - started, 2) if patched else None,
            "jobs_read": getattr(result, "jobs_read", None), "jobs_deferred": getattr(result, "jobs_deferred", None),
            "silent_nodes": len(result.silent_nodes), "resent": result.resent,
            "unreachable": dict(getattr(result, "unreachable", {})),
            "items_read": calls.items, "read_units": round(calls.read_units, 1),
            "dynamodb_reads": sum(n for op, n in calls.calls.items()
                                  if op.split()[1] in ("GetItem", "Query", "BatchGetItem", "Scan")),
            "peak_rss_mb": round(peak_rss_mb(), 1), "cpu_s": round(cpu_s, 2),
            "waited_s": {server: round(s, 2) for server, s in sorted(calls.waited_s.items())},
            "modelled_calls_s": {phase: round(s, 2) for phase, s in modelled.items()},
            "modelled_cpu_s": round(cpu_s * scale, 2),
            "modelled_s": round(sum(modelled.values()) + cpu_s * scale, 2),
            # Fail-open is done when the clusters' phase is: its calls, and its CPU time scaled.
            "modelled_fail_open_s": round(modelled["clusters"] + spans.get("clusters", (0.0, 0.0))[1] * scale, 2),
            "kubernetes_calls": dict(sorted(counting.calls.items())), "aws_calls": dict(sorted(calls.calls.items())),
        }
    kube.close()
    return runs


def jobs_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from prewarm_devtools.sam.aws import MotoServer, aws_environment
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    print(f"sweep: {args.jobs} running Never jobs of {args.job_nodes} nodes ({args.in_flight} in flight each), "
          f"{args.nodes} nodes of {args.images} images, {args.tainted} new and tainted with no hello", flush=True)
    now = outside_repairs(time.time(), 2)  # the first and the next run, a minute apart
    objects = padded_nodes(args.nodes, args.images)
    tainted = new_tainted_nodes(objects, args.tainted, now)
    names = [n["metadata"]["name"] for n in objects]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        seed = Path(tmp) / "nodes.json"
        seed.write_text(json.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
        del objects
        gc.collect()
        with KubeApiProcess(seeds=[seed]) as api, MotoServer() as moto, aws_environment(moto.url):
            stack = LocalStack(moto.url, parameters={"ClusterName": "local"},
                               stack_name=f"sweep-{uuid.uuid4().hex[:6]}").deploy()
            env = stack.env()
            started = time.monotonic()
            seed_jobs(moto, env, names[: args.job_nodes], [n for n in names if n not in set(tainted)],
                      jobs=args.jobs, in_flight=args.in_flight, now=now)
            seeding_s = time.monotonic() - started
            print(f"  seeded in {seeding_s:.0f} s: {args.jobs * args.job_nodes} node items straight into moto's "
                  f"table, {args.jobs} jobs and {len(names) - len(tainted)} registrations through the store",
                  flush=True)
            child_args = ["--child", "--scenario", "jobs", "--kube", api.url, "--token", api.token,
                          "--env", json.dumps(env), "--now", str(now)]
            if args.baseline:
                results["baseline"] = run_child("sweep", child_args, timeout=1800, env=baseline_env(args, tmp))
            results["prewarm"] = run_child("sweep", child_args, timeout=900)
    for way, runs in results.items():
        for name, run in runs.items():
            print_run(f"{way} {name}", run)
    ours = results["prewarm"]
    met = print_targets([
        Target("first_run_s", ours["first"]["seconds"], BUDGET_S, " s"),
        Target("next_run_s", ours["next"]["seconds"], BUDGET_S, " s"),
        Target("modelled_first_run_s", ours["first"].get("modelled_s", 0.0), BUDGET_S, " s"),
        Target("modelled_next_run_s", ours["next"].get("modelled_s", 0.0), BUDGET_S, " s"),
        Target("tainted_released_first_run", ours["first"]["taints_released"], args.tainted, at_least=True),
        Target("first_run_jobs_read", ours["first"]["jobs_read"] or 0, args.jobs, at_least=True),
        Target("peak_rss_mb", max(r["peak_rss_mb"] for r in ours.values()), PEAK_MB, " MB"),
    ])
    return {"scenario": "jobs", "jobs": args.jobs, "job_nodes": args.job_nodes, "in_flight": args.in_flight,
            "nodes": args.nodes, "tainted": args.tainted, "seeding_s": round(seeding_s, 1), **results,
            "targets_met": met}


def baseline_env(args: argparse.Namespace, tmp: str) -> dict[str, str]:
    """The environment of a child running `--baseline-ref`'s shared package."""
    old = Path(tmp) / "baseline"
    old.mkdir()
    archive = subprocess.run(["git", "archive", args.baseline_ref, "layers/shared/python"],
                             cwd=Path(__file__).resolve().parents[1], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    return {**os.environ, "PYTHONPATH": f"{old / 'layers/shared/python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def print_run(title: str, run: dict[str, Any]) -> None:
    phases = ", ".join(f"{p} {s} s" for p, s in run.get("phases_s", {}).items())
    print(f"  {title} run: {run['seconds']} s on moto ({phases}); {run['taints_released']} taints released (last at "
          f"{run['last_taint_released_s']} s); jobs read {run['jobs_read']}, deferred {run['jobs_deferred']}; "
          f"DynamoDB reads {run.get('dynamodb_reads')} calls, {run['items_read']} items, "
          f"{run.get('read_units')} read units; peak RSS {run['peak_rss_mb']} MB; CPU {run.get('cpu_s')} s; answers "
          f"waited for (summed over threads) {run.get('waited_s')}", flush=True)
    if "modelled_s" in run:
        print(f"    modelled on AWS: {run['modelled_s']} s (calls {run['modelled_calls_s']}, CPU at {MEMORY_MB} MB "
              f"{run['modelled_cpu_s']} s); fail-open done at {run['modelled_fail_open_s']} s", flush=True)
    print(f"    AWS {run['aws_calls']}; Kubernetes {run['kubernetes_calls']}", flush=True)
    if run.get("unreachable"):
        print(f"    clusters that failed this run: {run['unreachable']}", flush=True)
