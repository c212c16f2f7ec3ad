"""Local mode's execution environments: the memory of one, and of the stack's cap of them.

template.yaml is deployed (`LocalStack`) onto a moto server in this process; `start()` starts one
environment per function (a `python -m prewarm_devtools.sam.runtime` process that has imported the
function's handler: boto3, kubernetes, Powertools, the shared package). Once every handler has loaded,
and once each function has served one invocation (a scheduled function is fired, the others are sent
an empty event, which most refuse: the error is the invocation's, its imports are done either way),
the benchmark reads each process's RSS and PSS (`/proc/PID/smaps_rollup`: shared pages split between
the processes sharing them). It then has `--concurrent` invocations of one function (the status
function, on an event of no records) overlap, each in its own environment, and reads their RSS too.

Target: the stack's cap (`ENVIRONMENT_LIMIT`) times the largest RSS within `--budget-gb` (2.5 GB, an
eighth of a 24 GB machine that several engineers' stacks share).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Target, emit, load_average, median, print_machine, print_targets, rss_mb


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=4, help="overlapping invocations of one function")
    parser.add_argument("--budget-gb", type=float, default=2.5)
    args = parser.parse_args(argv)

    import io

    from prewarm_devtools.sam.aws import MotoServer, aws_environment
    from prewarm_devtools.sam.environments import ENVIRONMENT_LIMIT, FunctionError
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=io.StringIO()).deploy()
        try:
            began = time.monotonic()
            stack.start(schedules=False)
            for fn in stack.functions.values():
                scheduled = any(e["Type"].startswith("Schedule") for e in fn.events.values())
                # One that refuses its event has done its imports all the same.
                with contextlib.suppress(FunctionError):
                    stack.fire(fn.logical_id) if scheduled else stack.invoke(fn.logical_id, {})
            warm_s = time.monotonic() - began
            pids = [p.pid for p in stack.environments.processes()]
            rss, pss = [rss_mb(pid) for pid in pids], [pss_mb(pid) for pid in pids]
            status = stack.function("record_status")
            threads = [threading.Thread(target=stack.invoke, args=(status.logical_id, {"Records": []}))
                       for _ in range(args.concurrent)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            status_rss = [rss_mb(p.pid) for p in stack.environments.processes(status)]
        finally:
            stack.stop()
    per = median(rss)
    print(f"{len(pids)} environments, one per function, warm in {warm_s:.1f} s")
    print(f"RSS per environment: median {per:.0f} MB (min {min(rss):.0f}, max {max(rss):.0f}); "
          f"PSS median {median(pss):.0f} MB; all of them {sum(rss):.0f} MB RSS, {sum(pss):.0f} MB PSS")
    print(f"{args.concurrent} overlapping invocations of record_status: {len(status_rss)} environments, "
          f"median RSS {median(status_rss):.0f} MB")
    capped_gb = ENVIRONMENT_LIMIT * max(rss) / 1024
    met = print_targets([Target(f"{ENVIRONMENT_LIMIT} environments (the cap) x the largest RSS", capped_gb,
                                args.budget_gb, "GB")])
    emit({"environments": len(pids), "rss_median_mb": round(per, 1), "rss_max_mb": round(max(rss), 1),
          "pss_median_mb": round(median(pss), 1), "rss_total_mb": round(sum(rss)), "pss_total_mb": round(sum(pss)),
          "status_environments": len(status_rss), "limit": ENVIRONMENT_LIMIT, "capped_gb": round(capped_gb, 2),
          "warm_s": round(warm_s, 1), "load_average": load_average(), "targets_met": met})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
