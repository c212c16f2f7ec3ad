"""Local mode's memory over many jobs: the stack's RSS stays flat, as DynamoDB's does.

`prewarm local up` runs everything in one process (`prewarm_devtools.localmode.LocalMode`: moto's
server, template.yaml's functions, the embedded Kubernetes API, and `--nodes` agents, each with its
own containerd). A PrewarmRule matches the benchmark's repository; `--jobs` fresh `--image-mb` images
are pushed one after another, each job watched to completion. After each job the benchmark reads the
process's RSS, how many stream records moto holds, and the job's push-to-done time.

Target: RSS after the last job within 150 MB of RSS after the first, the push-to-done time of the
last jobs no worse than that of the first, and `prewarm --local get jobs` (a new CLI process) under
1 s. `--hours H` makes it a soak: the jobs are spread evenly over H hours (the stack idles between
them, its schedules firing as they do) and `get jobs` is timed after every 10th job too.
`--no-limits` runs moto without the AWS limits layer, as
before it existed: moto keeps every stream record and copies the table, stream included, on each
transaction.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.agent_overhead import require_node_tools, scratch_dir
from benchmarks.e2e_latency import NAMESPACE, REPOSITORY, rule_manifest
from benchmarks.measure import BenchmarkError, Target, emit, median, print_machine, print_targets, rss_mb

TARGET_GROWTH_MB = 150.0
# The last jobs' median push-to-done time may exceed the first jobs' by this factor (noise), no more.
TARGET_LAG_RATIO = 1.5


def stream_records() -> int:
    """Stream records moto holds now, over every table of this process's moto."""
    from moto.dynamodb.models import dynamodb_backends

    return sum(len(table.stream_shard.items) for account in dynamodb_backends.values()
               for backend in account.values() for table in backend.tables.values() if table.stream_shard)


def run_job(mode: Any, store: Any, tag: str, image_mb: float, timeout: float) -> float:
    """Push a fresh image and wait for the job its PUSH event creates; returns push-to-done seconds."""
    from prewarm.services.jobs import view_job

    started = time.monotonic()
    pushed = mode.push(REPOSITORY, tag, size_mb=image_mb)
    if len(pushed.jobs) != 1:
        raise BenchmarkError(f"the push of {REPOSITORY}:{tag} created {len(pushed.jobs)} jobs, not 1")
    name = pushed.jobs[0].split("/", 1)[1].split()[0]
    while True:
        view = view_job(store, NAMESPACE, name, now=time.time())
        if view.completion_time is not None:
            if view.succeeded != view.desired:
                raise BenchmarkError(f"job {name}: {view.succeeded} of {view.desired} nodes succeeded: {view.message}")
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise BenchmarkError(f"job {name} did not complete in {timeout:g} s: {view.message}")
        time.sleep(0.1)


def cli_get_seconds(jobs: int) -> float:
    """Wall time of `prewarm --local get jobs` in a new process, as a user runs it (best of 3)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "from prewarm_cli.app import main; main()", "--local", "get",
                               "jobs", "-A"], capture_output=True, text=True, timeout=60, check=False)
        best = min(best, time.perf_counter() - started)
        if done.returncode != 0 or len(done.stdout.splitlines()) < jobs:
            raise BenchmarkError(f"`prewarm --local get jobs` failed: {done.stderr.strip() or done.stdout[:200]}")
    return best


def benchmark(
    nodes: int, jobs: int, image_mb: float, timeout: float, limits: bool, hours: float = 0.0
) -> dict[str, Any]:
    from prewarm.services.jobs import apply_manifest
    from prewarm_devtools.localmode import LocalMode

    print_machine()
    print(f"local_memory: local mode with {nodes} nodes, {jobs} jobs of a fresh {image_mb:g} MB image each, "
          f"AWS limits layer {'on' if limits else 'off'}" + (f", over {hours:g} hours" if hours else ""))
    os.environ["PREWARM_AWS_LIMITS"] = "on" if limits else "off"
    rss, lags, records, gets = [], [], [], []
    spacing = hours * 3600 / jobs
    began = time.monotonic()
    with scratch_dir("pw-mem-") as base:
        os.environ["PREWARM_LOCAL_STATE"] = str(base / "local.json")
        mode = LocalMode(nodes=nodes, base_dir=base).start()
        try:
            store = mode.job_store()
            apply_manifest(store, rule_manifest(len(mode.nodes)), now=time.time())
            mode.write_state()
            for number in range(1, jobs + 1):
                if spacing:
                    time.sleep(max(0.0, began + (number - 1) * spacing - time.monotonic()))
                lags.append(run_job(mode, store, f"v{number}", image_mb, timeout))
                rss.append(rss_mb())
                records.append(stream_records())
                print(f"  job {number}: done in {lags[-1]:.2f} s; RSS {rss[-1]:.0f} MB; "
                      f"stream records held {records[-1]}; {(time.monotonic() - began) / 60:.0f} min in",
                      flush=True)
                if spacing and number % 10 == 0 and number < jobs:
                    gets.append(cli_get_seconds(number))
                    print(f"  `prewarm --local get jobs` after {number} jobs: {gets[-1]:.2f} s; load average "
                          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
            get_s = cli_get_seconds(jobs)
            gets.append(get_s)
            print(f"  `prewarm --local get jobs` after {jobs} jobs: {get_s:.2f} s (a new CLI process, best of 3)")
        finally:
            mode.stop()
    window = max(1, min(10, jobs // 5))
    first_lag, last_lag = median(lags[:window]), median(lags[-window:])
    growth = rss[-1] - rss[0]
    print(f"  RSS after job 1: {rss[0]:.0f} MB, after job {jobs}: {rss[-1]:.0f} MB (+{growth:.0f} MB); "
          f"peak {max(rss):.0f} MB")
    print(f"  push to done, median of the first {window} jobs: {first_lag:.2f} s, "
          f"of the last {window}: {last_lag:.2f} s")
    met = print_targets([Target("rss_growth_mb", growth, TARGET_GROWTH_MB, " MB"),
                         Target("lag_ratio", last_lag / first_lag, TARGET_LAG_RATIO),
                         Target("get_jobs_s", max(gets), 1.0, " s")])
    return {"nodes": nodes, "jobs": jobs, "image_mb": image_mb, "limits": limits,
            "rss_first_mb": round(rss[0], 1), "rss_last_mb": round(rss[-1], 1), "rss_growth_mb": round(growth, 1),
            "stream_records_last": records[-1], "lag_first_s": round(first_lag, 3), "lag_last_s": round(last_lag, 3),
            "get_jobs_s": round(get_s, 3), "get_jobs_max_s": round(max(gets), 3), "hours": hours,
            "wall_s": round(time.monotonic() - began), "load_average": os.getloadavg(), "targets_met": met}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=3, help="nodes, each with its agent and containerd (default 3)")
    parser.add_argument("--jobs", type=int, default=50, help="jobs, one after another (default 50)")
    parser.add_argument("--image-mb", type=float, default=1.0, help="size of each pushed image in MiB (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds each job may take (default 300)")
    parser.add_argument("--no-limits", action="store_true", help="moto without the AWS limits layer")
    parser.add_argument("--hours", type=float, default=0.0,
                        help="spread the jobs over this many hours (a soak; default 0: one after another)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.jobs < 2 or args.image_mb <= 0 or args.hours < 0:
        parser.error("--nodes must be at least 1, --jobs at least 2, --image-mb positive, --hours not negative")
    require_node_tools("local_memory")
    emit(benchmark(args.nodes, args.jobs, args.image_mb, args.timeout, not args.no_limits, args.hours))
    return 0


if __name__ == "__main__":
    sys.exit(main())
