"""What every benchmark shares: the machine, targets, memory readings, child runs and the JSON line."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


class BenchmarkError(RuntimeError):
    """A benchmark could not measure what it set out to (a child failed, results disagree)."""


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python and the load average: the figures mean little without them."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's answer stands
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "load_average": load_average(),
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: recorded beside each result."""
    return [round(x, 2) for x in os.getloadavg()]


def print_machine() -> None:
    m = machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}, Python {m['python']}, load average {m['load_average']}")


def rss_mb(pid: int | None = None) -> float:
    """The resident set size now of process `pid`, this process by default."""
    with open(f"/proc/{pid or 'self'}/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_MB


def peak_rss_mb() -> float:
    """The highest resident set size this program has had (`VmHWM`, as Lambda's "Max Memory Used").

    Not `ru_maxrss`: Linux carries it over `exec` from the forked parent, so a child run by
    `run_child` would report its parent's peak whenever that is the higher."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise BenchmarkError("no VmHWM in /proc/self/status")


@dataclass(frozen=True)
class Target:
    """A figure and the bound it should respect: `at_most` or `at_least`."""

    name: str
    value: float
    bound: float
    unit: str = ""
    at_least: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def line(self) -> str:
        sign = ">=" if self.at_least else "<="
        verdict = "met" if self.met else "NOT met"
        return f"  target {self.name}: {self.value:.3g}{self.unit} (want {sign} {self.bound:g}{self.unit}) {verdict}"


def print_targets(targets: Iterable[Target]) -> bool:
    """Prints each target with its verdict; True when all are met."""
    targets = list(targets)
    for target in targets:
        print(target.line())
    return all(t.met for t in targets)


def emit(result: dict[str, Any]) -> None:
    """The last line of a benchmark's output: one JSON object."""
    print(json.dumps(result), flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile of `values` by nearest rank (the smallest value with at least q of them at or
    below it); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run_child(module: str, args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600) -> Any:
    """Runs `python -m benchmarks.<module> args` in a fresh interpreter; its last stdout line is JSON."""
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"{' '.join(command[2:])} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise BenchmarkError(f"{' '.join(command[2:])} printed nothing:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])
