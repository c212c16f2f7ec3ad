"""Selecting the nodes of an ImagePullJob from a large cluster: Prewarm's path against a typed client.

The embedded Kubernetes API serves `--nodes` synthetic EKS nodes from its own process. The job
selects two node groups (`eks.amazonaws.com/nodegroup in (batch-spot,general-amd64)`, about 55% of
the nodes: the generator weighs the groups 45/30/15/10).

- Prewarm: `KubeCluster.list_nodes(label_selector=...)` (selector evaluated by the API server, raw
  JSON pages of 500, garbage collector paused while parsing), then `evaluate_nodes`.
- Baseline: typed `CoreV1Api(ApiClient(config)).list_node()` (no selector, no paging), then the
  labels and the Ready condition checked on the models in Python.

Each side runs in a fresh interpreter per repetition, with its imports and client made before the
clock starts. Memory is the rise of the process's peak RSS (`VmHWM` after minus RSS before the
selection), not tracemalloc, whose bookkeeping would slow the timed run several times over.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import (
    BenchmarkError,
    Target,
    emit,
    median,
    peak_rss_mb,
    print_machine,
    print_targets,
    rss_mb,
    run_child,
)
from benchmarks.servers import KubeApiProcess

NODE_GROUP_LABEL = "eks.amazonaws.com/nodegroup"
NODE_GROUPS = ("general-amd64", "batch-spot")
JOB: dict[str, Any] = {
    "apiVersion": "apps.kruise.io/v1alpha1",
    "kind": "ImagePullJob",
    "metadata": {"name": "warm-general", "namespace": "default"},
    "spec": {
        "image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/shop/web:2025.10.2",
        "selector": {"matchExpressions": [{"key": NODE_GROUP_LABEL, "operator": "In", "values": list(NODE_GROUPS)}]},
        "completionPolicy": {"type": "Always"},
    },
}
TARGET_SECONDS = 0.3
TARGET_PEAK_MB = 200.0
TARGET_SPEEDUP = 5.0
SIDES = ("prewarm", "baseline")


def _prewarm_side(url: str, token: str) -> tuple[list[str], float, float, float, float]:
    from prewarm.adapters.kube import KubeCluster
    from prewarm.domain.jobs import ImagePullJob
    from prewarm.domain.manifests import parse_manifest
    from prewarm.domain.placement import evaluate_nodes

    job = parse_manifest(JOB)
    assert isinstance(job, ImagePullJob) and job.spec.selector is not None
    with KubeCluster(url, token_source=lambda: token) as cluster:
        gc.collect()
        before = rss_mb()
        started, cpu = time.perf_counter(), time.process_time()
        nodes = cluster.list_nodes(label_selector=job.spec.selector.to_query())
        selection = evaluate_nodes(job.placement, nodes)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        return selection.selected, seconds, cpu, before, peak_rss_mb()


def _baseline_side(url: str, token: str) -> tuple[list[str], float, float, float, float]:
    from kubernetes.client import ApiClient, Configuration, CoreV1Api

    config = Configuration(host=url)
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    with ApiClient(config) as client:
        api = CoreV1Api(client)
        gc.collect()
        before = rss_mb()
        started, cpu = time.perf_counter(), time.process_time()
        items: list[Any] = api.list_node().items
        selected = sorted(
            node.metadata.name
            for node in items
            if (node.metadata.labels or {}).get(NODE_GROUP_LABEL) in NODE_GROUPS
            and any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())
        )
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        return selected, seconds, cpu, before, peak_rss_mb()


def run_side(side: str, url: str, token: str) -> dict[str, Any]:
    """One measured selection in this (fresh) process."""
    selected, seconds, cpu, before, peak = (_prewarm_side if side == "prewarm" else _baseline_side)(url, token)
    return {
        "side": side,
        "selected": len(selected),
        "digest": hashlib.sha256("\n".join(selected).encode()).hexdigest(),
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_mb": max(0.0, peak - before),
        "process_peak_mb": peak,
    }


def _warm_up(url: str, token: str) -> None:
    # The server's first list builds its caches; neither side should pay for that.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, never via a proxy
    for query in ("?limit=500", ""):
        request = urllib.request.Request(f"{url}/api/v1/nodes{query}", headers={"Authorization": f"Bearer {token}"})
        with direct.open(request, timeout=60) as response:
            response.read()


def benchmark(nodes: int, repeat: int) -> dict[str, Any]:
    print_machine()
    print(f"select_nodes: {nodes} synthetic nodes, selector {NODE_GROUP_LABEL} in ({','.join(NODE_GROUPS)})")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with KubeApiProcess(nodes=nodes) as api:
        print(f"  embedded Kubernetes API in its own process at {api.url}")
        _warm_up(api.url, api.token)
        for index in range(repeat):
            # Alternate which side goes first, so neither always meets a freshly idle server.
            order = SIDES if index % 2 == 0 else SIDES[::-1]
            for side in order:
                server_cpu = api.cpu_seconds()
                run = run_child("select_nodes", ["--side", side, "--url", api.url, "--token", api.token])
                run["server_cpu_s"] = api.cpu_seconds() - server_cpu  # the child's whole life, imports included
                runs[side].append(run)
    digests = {r["digest"] for side in SIDES for r in runs[side]}
    if len(digests) != 1:
        counts = {side: runs[side][0]["selected"] for side in SIDES}
        raise BenchmarkError(f"the two sides selected different nodes: {counts}")
    figures = {
        side: {key: median([r[key] for r in runs[side]]) for key in ("seconds", "cpu_s", "server_cpu_s", "peak_mb")}
        for side in SIDES
    }
    for side in SIDES:
        times = ", ".join(f"{r['seconds']:.3f}" for r in runs[side])
        print(
            f"  {side:8}: {figures[side]['seconds']:.3f} s median of [{times}] "
            f"(CPU: client {figures[side]['cpu_s']:.3f} s, server {figures[side]['server_cpu_s']:.3f} s), "
            f"peak RSS +{figures[side]['peak_mb']:.0f} MB (process peak {runs[side][0]['process_peak_mb']:.0f} MB)"
        )
    selected = runs["prewarm"][0]["selected"]
    speedup = figures["baseline"]["seconds"] / figures["prewarm"]["seconds"]
    print(f"  both selected {selected} of {nodes} nodes; prewarm is {speedup:.1f}x faster, "
          f"uses {figures['baseline']['peak_mb'] / max(figures['prewarm']['peak_mb'], 1):.1f}x less memory")
    print_targets([
        Target("prewarm time", figures["prewarm"]["seconds"], TARGET_SECONDS, " s"),
        Target("prewarm peak memory", figures["prewarm"]["peak_mb"], TARGET_PEAK_MB, " MB"),
        Target("speedup", speedup, TARGET_SPEEDUP, "x", at_least=True),
    ])
    return {
        "nodes": nodes,
        "selected": selected,
        "prewarm_s": round(figures["prewarm"]["seconds"], 4),
        "baseline_s": round(figures["baseline"]["seconds"], 4),
        "speedup": round(speedup, 2),
        "prewarm_peak_mb": round(figures["prewarm"]["peak_mb"], 1),
        "baseline_peak_mb": round(figures["baseline"]["peak_mb"], 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/select_nodes.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="synthetic nodes in the cluster (default 5000)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh-process runs of each side; the median counts")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one measured child run
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        emit(run_side(args.side, args.url, args.token))
        return 0
    if args.nodes < 1 or args.repeat < 1:
        parser.error("--nodes and --repeat must be at least 1")
    emit(benchmark(args.nodes, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
