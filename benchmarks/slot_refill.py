"""How soon a freed parallelism slot is refilled, and how soon a pull's result is stored, in local mode.

Local mode with real nodes (one containerd and agent each, a registry playing ECR): one `Always` job of
parallelism `--parallelism` over `--nodes` nodes pulls a `--image-mb` image. From the stored node items:
- refill: for each node dispatched after the plan, its `dispatched_at` minus the `finished_at` of the
  report that freed its slot (the latest earlier finish);
- stored: each node's `updated_at` (when its final phase was written) minus its `finished_at` (when the
  agent saw the pull end).
Target: every slot refilled within 1 s of the report that freed it, on a quiet machine. On AWS the status
event source's batching window (1 s) comes on top at low traffic; local mode does not wait it out.

    python benchmarks/slot_refill.py --nodes 10 --parallelism 5 --image-mb 30

Needs root, containerd and docker-registry (`make node-deps`); exits 2 naming what is missing. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import BenchmarkError, Target, emit, load_average, print_machine, print_targets


def refill_lags(tasks: Sequence[Any], planned_at: float) -> list[float]:
    """Seconds from each freeing report to the dispatch of the node that took its slot."""
    finishes = sorted(t.finished_at for t in tasks if t.finished_at is not None)
    lags = []
    for t in sorted(tasks, key=lambda t: t.dispatched_at or 0):
        if t.dispatched_at is None or t.dispatched_at <= planned_at + 1e-6:
            continue  # dispatched by the plan itself, not into a freed slot
        freed = [f for f in finishes if f <= t.dispatched_at]
        if freed:
            lags.append(t.dispatched_at - freed[-1])
    return lags


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def benchmark(nodes: int, parallelism: int, image_mb: float, timeout: float) -> dict[str, Any]:
    from prewarm.services.jobs import apply_manifest, view_job
    from prewarm_devtools.localmode import LocalMode, LocalModeUnavailableError

    print_machine()
    mode = LocalMode(nodes=nodes)
    try:
        mode.start()
    except LocalModeUnavailableError as e:
        raise BenchmarkError(str(e)) from e
    try:
        assert mode.stack is not None and mode.aws is not None
        store = mode.job_store()
        pushed = mode.push("bench/refill", "v1", size_mb=image_mb)
        manifest = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                    "metadata": {"name": "refill", "namespace": "default"},
                    "spec": {"image": pushed.reference, "parallelism": parallelism,
                             "completionPolicy": {"type": "Always"}}}
        applied_at = time.time()
        apply_manifest(store, manifest, now=applied_at)
        deadline = time.monotonic() + timeout
        while True:
            view = view_job(store, "default", "refill", now=time.time(), with_tasks=True)
            if view.completion_time is not None:
                break
            if time.monotonic() > deadline:
                raise BenchmarkError(f"the job did not complete within {timeout:g} s: {view.message}")
            time.sleep(0.2)
        record = store.get_job("default/refill")
        assert record is not None and record.start_time is not None
        tasks = view.tasks
        planned_at = min(t.dispatched_at for t in tasks if t.dispatched_at is not None)
        lags = refill_lags(tasks, planned_at)
        stored = [t.updated_at - t.finished_at for t in tasks if t.updated_at and t.finished_at]
        total = view.completion_time - applied_at
    finally:
        mode.stop()
    print(f"  {len(tasks)} nodes, parallelism {parallelism}, {image_mb:g} MB: done {total:.2f} s after apply")
    print(f"  slot refill after the freeing report: p50 {percentile(lags, 0.5):.3f} s, max {max(lags, default=0):.3f} s"
          f" ({len(lags)} refills)")
    print(f"  final phase stored after the pull ended: p50 {percentile(stored, 0.5):.3f} s, "
          f"max {max(stored, default=0):.3f} s")
    met = print_targets([Target("slowest slot refill", max(lags, default=0.0), 1.0, " s")])
    return {"nodes": len(tasks), "parallelism": parallelism, "image_mb": image_mb, "refills": len(lags),
            "slot_refill_p50_s": round(percentile(lags, 0.5), 3), "slot_refill_max_s": round(max(lags, default=0), 3),
            "stored_after_pull_p50_s": round(percentile(stored, 0.5), 3),
            "stored_after_pull_max_s": round(max(stored, default=0), 3), "job_seconds": round(total, 2),
            "load_average": load_average(), "targets_met": met}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--parallelism", type=int, default=5)
    parser.add_argument("--image-mb", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        emit(benchmark(args.nodes, args.parallelism, args.image_mb, args.timeout))
    except BenchmarkError as e:
        print(f"slot_refill: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
