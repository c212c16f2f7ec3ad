"""End to end in local mode: an image pushed to ECR, to the first node pulling, to every node done.

Local mode (`prewarm_devtools.localmode.LocalMode`) runs everything on this machine: template.yaml's
functions on moto, the embedded Kubernetes API with `--nodes` synthetic nodes, a registry playing
ECR, and on every node a private containerd and an agent (as root). A PrewarmRule matches the
repository; each push (a fresh `--image-mb` image, so nothing is cached) is delivered as ECR's PUSH
event and the job it creates is watched to completion:

- push_to_first_pull_s: from the PUSH event to the first node's `started_at` (its first attempt
  began: the agent's first Pulling report);
- push_to_done_s: from the PUSH event to the job's completion (every node reported Succeeded and
  the status function counted it);
- new_node_join_to_untaint_s: a `Never` job for the last pushed image selects a pool no node is in;
  then a node of that pool joins with the startup taint (`prewarm.dev/warming=true:NoSchedule`,
  as Karpenter's `startupTaints` sets it): from the Node's creation to the taint removed by its
  agent (which starts its containerd, says hello, is sent the job's task and the list of required
  images, pulls, and removes the taint). `describe node`'s hello-to-warm time is printed beside it;
- direct_pull_s: the floor, one CRI PullImage of the same image from the same registry on a fresh
  containerd, with nothing else running.

To say where the time goes it also records, without changing them: when an agent first received
each job's task (a botocore hook on the agents' SQS clients), each function's invocations, records and
busy time (`LocalStack.invoke` wrapped), and the time moto spends in DynamoDB `TransactWriteItems`.

Before measuring, the benchmark checks that the nodes fit the machine: local mode must start, leave
at least 1 GiB of memory available and, idle, use at most half of the cores. If it does not fit, it
says what it measured and halves the nodes until it does, printing the count it used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.agent_overhead import direct_pull, require_node_tools, scratch_dir
from benchmarks.measure import (
    BenchmarkError,
    Target,
    emit,
    load_average,
    median,
    print_machine,
    print_targets,
    rss_mb,
)

REPOSITORY = "bench/e2e"
NAMESPACE = "default"
RULE_NAME = "bench-e2e"
TARGET_FIRST_PULL_S = 1.0
MIN_AVAILABLE_MB = 1024.0
MAX_IDLE_CORES_SHARE = 0.5
IDLE_SAMPLE_S = 3.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rule_manifest(parallelism: int) -> dict[str, Any]:
    """Every release tag of the benchmark's repository goes to every node, all at once."""
    return {
        "apiVersion": "prewarm.dev/v1alpha1",
        "kind": "PrewarmRule",
        "metadata": {"name": RULE_NAME},
        "spec": {
            "repositories": [REPOSITORY],
            "tags": ["v*"],
            "template": {
                "metadata": {"namespace": NAMESPACE},
                "spec": {
                    "parallelism": parallelism,
                    "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3},
                    "completionPolicy": {"type": "Always"},
                },
            },
        },
    }


# --- does it fit ---------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def available_mb() -> float:
    """MemAvailable from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise BenchmarkError("/proc/meminfo has no MemAvailable line")


@dataclass(frozen=True)
class Fit:
    """What local mode with `nodes` nodes takes from this machine, idle."""

    nodes: int
    start_s: float
    process_mb: float
    containerd_mb: float
    available_mb: float
    idle_cores: float  # CPU seconds per second: this process, the containerds and the registry

    @property
    def problems(self) -> list[str]:
        found = []
        if self.available_mb < MIN_AVAILABLE_MB:
            found.append(f"only {self.available_mb:.0f} MB of memory left available (want {MIN_AVAILABLE_MB:.0f})")
        cores = os.cpu_count() or 1
        if self.idle_cores > MAX_IDLE_CORES_SHARE * cores:
            found.append(f"idle, it keeps {self.idle_cores:.2f} of {cores} cores busy "
                         f"(want at most {MAX_IDLE_CORES_SHARE * cores:g})")
        return found

    def line(self) -> str:
        return (f"{self.nodes} nodes: started in {self.start_s:.1f} s; this process {self.process_mb:.0f} MB, "
                f"{self.nodes} containerds {self.containerd_mb:.0f} MB; {self.available_mb:.0f} MB still available; "
                f"idle it uses {self.idle_cores:.2f} cores (this process, containerds, registry)")


def measure_fit(mode: Any, start_s: float) -> Fit:
    pids = [node.containerd.pid for node in mode.nodes.values() if node.containerd.pid]
    if mode.registry is not None and mode.registry.pid:
        pids.append(mode.registry.pid)
    before = time.process_time() + sum(_cpu_seconds(pid) for pid in pids)
    time.sleep(IDLE_SAMPLE_S)
    after = time.process_time() + sum(_cpu_seconds(pid) for pid in pids)
    containerds = [node.containerd.pid for node in mode.nodes.values() if node.containerd.pid]
    return Fit(
        nodes=len(mode.nodes),
        start_s=start_s,
        process_mb=rss_mb(),
        containerd_mb=sum(rss_mb(pid) for pid in containerds),
        available_mb=available_mb(),
        idle_cores=(after - before) / IDLE_SAMPLE_S,
    )


def start_fitting(nodes: int) -> tuple[Any, Fit]:
    """Local mode with `nodes` nodes, or the largest halving of it that fits; the caller stops it."""
    from prewarm_devtools.localmode import LocalMode

    while True:
        started = time.perf_counter()
        mode = LocalMode(nodes=nodes)
        try:
            mode.start()
        except Exception as e:  # noqa: BLE001 - any start failure means "does not fit": say it, try fewer
            problems = [f"local mode did not start: {type(e).__name__}: {str(e)[:500]}"]
            fit = None
        else:
            fit = measure_fit(mode, time.perf_counter() - started)
            print(f"  fit: {fit.line()}")
            problems = fit.problems
            if fit.nodes != nodes:
                print(f"  ({nodes} synthetic nodes, {fit.nodes} of them get an agent: the others are not Ready "
                      "or virtual-kubelet nodes)")
        if not problems and fit is not None:
            return mode, fit
        mode.stop()
        print(f"  {nodes} nodes do not fit this machine: {'; '.join(problems)}")
        if nodes == 1:
            raise BenchmarkError("even one node does not fit this machine")
        nodes = max(1, nodes // 2)
        print(f"  trying {nodes} nodes")


# --- one push ------------------------------------------------------------------------------------


class FunctionClock:
    """Invocations, records and busy seconds of each function, by wrapping `LocalStack.invoke` (each function
    runs in a process of its own); the handlers themselves are untouched."""

    def __init__(self, stack: Any) -> None:
        self.calls: Counter[str] = Counter()
        self.records: Counter[str] = Counter()
        self.busy: dict[str, float] = {}
        self._invoke = stack.invoke
        stack.invoke = self._timed

    def _timed(self, name: str, event: Mapping[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return self._invoke(name, event)
        finally:
            self.calls[name] += 1
            self.records[name] += len(event.get("Records") or ()) or 1
            self.busy[name] = self.busy.get(name, 0.0) + time.perf_counter() - started

    def snapshot(self) -> dict[str, tuple[int, int, float]]:
        return {name: (self.calls[name], self.records[name], self.busy[name]) for name in self.calls}

    def since(self, before: dict[str, tuple[int, int, float]]) -> dict[str, tuple[int, int, float]]:
        """(invocations, records, busy seconds) of each function since `before`."""
        now = self.snapshot()
        out = {}
        for name, (calls, records, busy) in now.items():
            was = before.get(name, (0, 0, 0.0))
            if calls > was[0]:
                out[name] = (calls - was[0], records - was[1], busy - was[2])
        return out


class MotoTransactions:
    """Calls and seconds of moto's DynamoDB `transact_write_items` in this process (local mode runs moto
    here): moto deep-copies the whole table for every item of a transaction, so it slows as the table grows."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._original: Any = None

    def __enter__(self) -> MotoTransactions:
        from moto.dynamodb.models import DynamoDBBackend

        self._original = original = DynamoDBBackend.transact_write_items

        def timed(backend: Any, transact_items: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(backend, transact_items)
            finally:
                with self._lock:
                    self.calls += 1
                    self.seconds += time.perf_counter() - started

        setattr(DynamoDBBackend, "transact_write_items", timed)  # noqa: B010 - moto's own signature is narrower
        return self

    def __exit__(self, *exc: object) -> None:
        from moto.dynamodb.models import DynamoDBBackend

        setattr(DynamoDBBackend, "transact_write_items", self._original)  # noqa: B010

    def snapshot(self) -> tuple[int, float]:
        with self._lock:
            return self.calls, self.seconds


class TaskReceipts:
    """When an agent first received a task of each job: a botocore hook on every agent's SQS client."""

    def __init__(self, agents: Sequence[Any]) -> None:
        self.first: dict[str, float] = {}
        self._lock = threading.Lock()
        for agent in agents:
            agent.sqs.meta.events.register("after-call.sqs.ReceiveMessage", self._received)

    def _received(self, parsed: Mapping[str, Any] | None = None, **_: Any) -> None:
        now = time.time()
        for message in (parsed or {}).get("Messages") or ():
            job = json.loads(message.get("Body") or "{}").get("job")
            if job:
                with self._lock:
                    self.first.setdefault(job, now)


def push_and_watch(mode: Any, store: Any, functions: FunctionClock, receipts: TaskReceipts,
                   transactions: MotoTransactions, tag: str, image_mb: float, timeout: float) -> dict[str, Any]:
    """Push a fresh image, and follow the job its PUSH event creates until it completes."""
    from prewarm.services.jobs import view_job

    before = functions.snapshot()
    transactions_before = transactions.snapshot()
    pushed = mode.push(REPOSITORY, tag, size_mb=image_mb)
    created = time.time()
    if len(pushed.jobs) != 1:
        raise BenchmarkError(f"the push of {REPOSITORY}:{tag} created {len(pushed.jobs)} jobs, not 1: {pushed.jobs}")
    name = pushed.jobs[0].split("/", 1)[1].split()[0]
    deadline = time.monotonic() + timeout
    while True:
        view = view_job(store, NAMESPACE, name, now=time.time(), with_tasks=True)
        if view.completion_time is not None:
            break
        if time.monotonic() > deadline:
            raise BenchmarkError(f"job {NAMESPACE}/{name} did not complete in {timeout:g} s: {view.message}")
        time.sleep(0.1)
    if view.failed or view.succeeded != view.desired:
        raise BenchmarkError(f"job {name}: {view.succeeded} of {view.desired} nodes succeeded, {view.failed} failed "
                             f"({', '.join(view.failed_nodes)}): {view.message}")
    event = pushed.pushed_at
    dispatched = [t.dispatched_at for t in view.tasks if t.dispatched_at]
    started = [t.started_at for t in view.tasks if t.started_at]
    finished = [t.finished_at for t in view.tasks if t.finished_at]
    if len(started) != view.desired or len(finished) != view.desired:
        raise BenchmarkError(f"job {name}: {len(started)} started and {len(finished)} finished times "
                             f"for {view.desired} nodes")
    return {
        "job": name,
        "reference": pushed.reference,
        "bytes": pushed.size_bytes,
        "desired": view.desired,
        "excluded": [f"{e.name}: {e.reason}" for e in view.excluded],
        "push_to_first_pull_s": min(started) - event,
        "push_to_done_s": view.completion_time - event,
        "steps": {
            "job_created": created - event,
            "first_dispatch": min(dispatched) - event if dispatched else float("nan"),
            "first_receipt": receipts.first.get(f"{NAMESPACE}/{name}", float("nan")) - event,
            "first_pull": min(started) - event,
            "last_pull_started": max(started) - event,
            "last_pull_finished": max(finished) - event,
            "done": view.completion_time - event,
        },
        "pull_s": [t.finished_at - t.started_at for t in view.tasks if t.finished_at and t.started_at],
        "functions": functions.since(before),
        "moto_transactions": tuple(now - was for now, was in zip(transactions.snapshot(), transactions_before,
                                                                  strict=True)),
    }


STEP_NAMES = {
    "job_created": "PUSH event handled, job stored (on_image_push)",
    "first_dispatch": "first task sent (table stream, dispatch_job)",
    "first_receipt": "first task received by an agent (its long poll returned)",
    "first_pull": "first node pulling (ImageStatus, ECR token, PullImage started)",
    "last_pull_started": "last node pulling",
    "last_pull_finished": "last node finished (agent's clock)",
    "done": "job complete (record_status counted every node)",
}


def floor_pull(mode: Any, base: Path, reference: str) -> float:
    """One CRI pull of `reference` from the registry playing ECR, on a containerd that has nothing."""
    from prewarm_devtools.localecr import ecr_host
    from prewarm_devtools.node.containerd import PrivateContainerd

    containerd = PrivateContainerd(base / "floor")
    containerd.add_registry_mirror(ecr_host(), mode.registry.url)
    with containerd, containerd.cri_client(timeout=60) as cri:
        return direct_pull(cri, reference, auth=mode.registry.auth)


JOIN_POOL = "bench-joining"
# From a node's join to its taint removed, beyond the floor (one direct pull): the node's containerd
# and agent starting, the hello, the task and the list of required images, and the taint's removal.
TARGET_JOIN_OVERHEAD_S = 5.0


def measure_join_to_untaint(mode: Any, reference: str, timeout: float) -> dict[str, float]:
    """A `Never` job for `reference`, then a node of its pool joining with the startup taint: seconds
    from the Node's creation to the taint gone, and the hello-to-warm time the control plane recorded."""
    from prewarm.domain.warming import StartupTaint
    from prewarm.services.jobs import apply_manifest

    taint = StartupTaint()  # the default, as Karpenter's startupTaints would set it
    store = mode.job_store()
    job = {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "bench-join", "namespace": NAMESPACE},
        "spec": {"image": reference, "parallelism": 10, "selector": {"matchLabels": {"pool": JOIN_POOL}},
                 "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3}, "completionPolicy": {"type": "Never"}},
    }
    apply_manifest(store, job, now=time.time())
    deadline = time.monotonic() + 60
    while (record := store.get_job(f"{NAMESPACE}/bench-join")) is None or record.planned != record.plan_id:
        if time.monotonic() > deadline:
            raise BenchmarkError("the Never job for the joining node was not planned within 60 s")
        time.sleep(0.05)
    name = "bench-join-1"
    joined = time.monotonic()
    mode.add_node(name, labels={"pool": JOIN_POOL},
                  taints=[{"key": taint.key, "value": "true", "effect": taint.effect}])
    try:
        while taint.held_by(mode.kube.get_object("nodes", name)):
            if time.monotonic() - joined > timeout:
                raise BenchmarkError(f"the startup taint of {name} was still on after {timeout:g} s")
            time.sleep(0.02)
        untainted = time.monotonic() - joined
        node = mode.nodes[name]
        if not node.image_present(reference):
            raise BenchmarkError(f"the startup taint of {name} came off without {reference} on the node")
        deadline = time.monotonic() + 30
        while (registered := store.get_node(name)) is None or registered.warm is None:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"the control plane did not record how {name} warmed within 30 s")
            time.sleep(0.05)
        warm = registered.warm
        if warm.outcome != "warm":
            raise BenchmarkError(f"{name} warmed by timeout, missing {', '.join(warm.missing)}")
    finally:
        mode.remove_node(name)
    print(f"  new node: taint removed {untainted:.3f} s after it joined; recorded hello to warm "
          f"{warm.hello_to_warm:.3f} s, join to warm {warm.join_to_warm:.3f} s")
    return {"join_to_untaint_s": untainted, "hello_to_warm_s": warm.hello_to_warm}


def measure_pushes(mode: Any, pushes: int, image_mb: float, timeout: float) -> list[dict[str, Any]]:
    """Apply the rule, then push `pushes` fresh images one after another, each job watched to completion."""
    from prewarm.services.jobs import apply_manifest

    store = mode.job_store()
    apply_manifest(store, rule_manifest(len(mode.nodes)), now=time.time())
    functions = FunctionClock(mode.stack)
    receipts = TaskReceipts([node.agent for node in mode.nodes.values()])
    runs = []
    with MotoTransactions() as transactions:
        for number in range(1, pushes + 1):
            run = push_and_watch(mode, store, functions, receipts, transactions, f"v{number}", image_mb, timeout)
            runs.append(run)
            steps = run["steps"]
            print(f"  push {number} ({run['bytes']:,} bytes, job {run['job']} on {run['desired']} nodes): "
                  f"first task sent {steps['first_dispatch']:.3f} s, received {steps['first_receipt']:.3f} s, "
                  f"first pull {steps['first_pull']:.3f} s, last node finished {steps['last_pull_finished']:.3f} s, "
                  f"job complete {steps['done']:.3f} s; load average {load_average()}")
            transact_calls, transact_s = run["moto_transactions"]
            print("    functions (invocations, records, busy s): " + ", ".join(
                f"{name} {calls}/{records}/{busy:.2f}" for name, (calls, records, busy) in
                sorted(run["functions"].items()))
                + f"; moto TransactWriteItems {transact_calls} calls, {transact_s:.2f} s")
    for line in runs[0]["excluded"]:
        print(f"  excluded by the job: {line}")
    return runs


def benchmark(nodes: int, image_mb: float, pushes: int, timeout: float) -> dict[str, Any]:
    print_machine()
    print(f"e2e_latency: local mode with {nodes} synthetic nodes, {pushes} pushes of a fresh {image_mb:g} MB image")
    with scratch_dir("pw-e2e-") as base:
        # Local mode writes where `prewarm --local` finds it: keep it away from anyone else's.
        os.environ["PREWARM_LOCAL_STATE"] = str(base / "local.json")
        mode, fit = start_fitting(nodes)
        try:
            runs = measure_pushes(mode, pushes, image_mb, timeout)
            join = measure_join_to_untaint(mode, runs[-1]["reference"], timeout)
            direct = floor_pull(mode, base, runs[-1]["reference"])
        finally:
            mode.stop()
    return summarize(fit, runs, direct, join)


def summarize(fit: Fit, runs: list[dict[str, Any]], direct: float, join: Mapping[str, float]) -> dict[str, Any]:
    first = median([run["push_to_first_pull_s"] for run in runs])
    done = median([run["push_to_done_s"] for run in runs])
    print(f"  medians over {len(runs)} pushes, from the PUSH event:")
    for key, name in STEP_NAMES.items():
        print(f"    {name:<60} {median([run['steps'][key] for run in runs]):7.3f} s")
    pulls = [s for run in runs for s in run["pull_s"]]
    print(f"  a node's pull (started_at to finished_at, all nodes pulling at once): median {median(pulls):.3f} s, "
          f"longest {max(pulls):.3f} s; alone on a fresh containerd (the floor): {direct:.3f} s")
    untaint = join["join_to_untaint_s"]
    print(f"  a new node with the startup taint: joined to untainted {untaint:.3f} s against {direct:.3f} s for one "
          f"direct pull of the same image ({untaint - direct:+.3f} s)")
    print_targets([Target("push_to_first_pull_s", first, TARGET_FIRST_PULL_S, " s"),
                   Target("new_node_join_to_untaint_s - direct_pull_s", untaint - direct, TARGET_JOIN_OVERHEAD_S,
                          " s")])
    return {
        "nodes": fit.nodes,
        "push_to_first_pull_s": round(first, 3),
        "push_to_done_s": round(done, 3),
        "new_node_join_to_untaint_s": round(untaint, 3),
        "new_node_hello_to_warm_s": round(join["hello_to_warm_s"], 3),
        "direct_pull_s": round(direct, 3),
        "desired": runs[0]["desired"],
        "pushes": len(runs),
        "load_average": load_average(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/e2e_latency.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20, help="synthetic nodes, each with containerd and an agent")
    parser.add_argument("--image-mb", type=float, default=20.0, help="size of each pushed image in MiB (default 20)")
    parser.add_argument("--pushes", type=int, default=3, help="pushes, one job each; medians count (default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a job may take (default 600)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.image_mb <= 0 or args.pushes < 1 or args.timeout <= 0:
        parser.error("--nodes and --pushes must be at least 1, --image-mb and --timeout positive")
    require_node_tools("e2e_latency")
    emit(benchmark(args.nodes, args.image_mb, args.pushes, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
