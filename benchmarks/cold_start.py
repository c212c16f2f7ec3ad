"""Cold start of every function under functions/: the handler module's import and its first invoke.

template.yaml is deployed (`LocalStack`) onto moto's ThreadedMotoServer, and the embedded Kubernetes
API serves samplefiles/cluster.yaml; both run in child processes. For each function, a fresh
interpreter (`benchmarks/lambda_init.py`) gets the function's environment from the template plus
what Lambda sets (LAMBDA_TASK_ROOT and an X-Ray trace header: with `Tracing: Active` Powertools'
Tracer patches botocore at import, as it does in Lambda; segments go to 127.0.0.1:2000 over UDP,
where nothing listens), imports the handler module with its code directory first on sys.path, and
invokes `lambda_handler` once on the function's sample event from events/. The table is reset and
re-seeded (a rule for the push, the job of the stream insert) before every run. Median of `--repeat`.

As Lambda runs the code: both layers are built as `sam build` builds them (layers/shared/Makefile: the
package; layers/deps/Makefile: the wheels of layers/deps/requirements.txt, for this machine's platform;
each with bytecode from `compileall --invalidation-mode unchecked-hash`) into a temporary directory,
under this interpreter (the runtime's python3.13 when it is the one running this), and put on
PYTHONPATH as Lambda puts /opt/python on sys.path. Each function's code and the baseline are copied
there without bytecode, everything is made read-only, and every interpreter runs with
PYTHONDONTWRITEBYTECODE=1: the layers' modules load from their .pyc, the handler module is compiled
each time, as on Lambda's read-only /opt and /var/task. The benchmark checks that `prewarm` and
`botocore` came from the built layers and that no bytecode was written.

Baseline: `benchmarks/naive_handler.py`, imported the same way: typed Kubernetes client, Powertools
Logger, Metrics and Tracer, boto3 clients made at import.

A function whose import misses the target is run once more under `python -X importtime`, and the
imports it pays for are printed: by package (self time summed) and the handler's direct imports
(cumulative). `--explain` does that for every function.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import (
    ROOT,
    BenchmarkError,
    Target,
    emit,
    median,
    print_machine,
    print_targets,
)
from benchmarks.servers import KubeApiProcess, MotoProcess
from prewarm_devtools.lambda_layers import build_layers, lambda_code_dir, set_writable

TARGET_IMPORT_MS = 300.0
# Every function's import against the naive handler's, in the same run.
TARGET_RATIO = 0.5
EVENTS = ROOT / "events"
# The sample event each function is invoked with.
FUNCTION_EVENTS = {
    "dispatch_job": "dynamodb_stream_job_insert",
    "on_image_push": "ecr_push",
    "record_status": "sqs_status_batch",
    "refresh_ecr_credentials": "schedule_refresh_credentials",
    "repull_daily": "schedule_repull",
    "run_cron_job": "schedule_run_cron_job",
    "sweep": "schedule_sweep",
    "sync_resources": "schedule_sync_resources",
    "bake_snapshots": "schedule_bake_snapshots",
}
# Matches events/ecr_push.json, so the push creates a job.
PUSH_RULE = {
    "apiVersion": "prewarm.dev/v1alpha1",
    "kind": "PrewarmRule",
    "metadata": {"name": "inference"},
    "spec": {"repositories": ["ml/*"], "tags": ["v*"],
             "template": {"metadata": {"namespace": "ml"}, "spec": {"parallelism": 4}}},
}
BASELINE = "baseline (naive_handler)"
_TRACE_HEADER = "Root=1-6a1b2c3d-4e5f60718293a4b5c6d7e8f9;Parent=53995c3f42cd8ad8;Sampled=1"


@dataclass(frozen=True)
class Subject:
    """What one cold start imports and invokes, in which environment."""

    name: str
    code_dir: Path
    module: str
    env: dict[str, str]
    event: Path | None


def discover_functions() -> list[str]:
    """Every function directory with an app.py; each must have a sample event."""
    names = sorted(p.parent.name for p in (ROOT / "functions").glob("*/app.py"))
    missing = [n for n in names if n not in FUNCTION_EVENTS]
    if missing:
        raise BenchmarkError(f"no sample event chosen for {', '.join(missing)}: add it to FUNCTION_EVENTS")
    return names


def read_only_copy(source: Path, target: Path) -> Path:
    """`source` (a directory or one file) copied into `target` without bytecode, as a function's code ships."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        target.mkdir(parents=True)
        shutil.copy2(source, target / source.name)
    return target


def bytecode_written(root: Path, layers: Sequence[Path]) -> list[Path]:
    """Bytecode under `root` outside the built layers: a cold start wrote it, which Lambda's could not."""
    return [p for p in root.rglob("*.pyc") if not any(p.is_relative_to(layer) for layer in layers)]


def lambda_env(function_env: dict[str, str], aws_url: str, region: str, name: str, code_dir: Path,
               memory: int, layers: Sequence[Path]) -> dict[str, str]:
    """This machine's PATH and the like, the function's environment, and what Lambda itself sets.

    The built layers are on PYTHONPATH (Lambda's /opt/python) and no bytecode is written (read-only code).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "POWERTOOLS_", "_X_AMZN", "PYTHON"))}
    env.update(function_env)
    env.update({
        "PYTHONPATH": os.pathsep.join(str(layer) for layer in layers), "PYTHONDONTWRITEBYTECODE": "1",
        "AWS_ENDPOINT_URL": aws_url, "AWS_REGION": region, "AWS_DEFAULT_REGION": region,
        "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_LAMBDA_FUNCTION_NAME": name, "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory), "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
        "LAMBDA_TASK_ROOT": str(code_dir), "_X_AMZN_TRACE_ID": _TRACE_HEADER,
        "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000", "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
    })
    return env


def cold_start(subject: Subject, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "benchmarks.lambda_init",
               str(subject.code_dir), subject.module]
    if subject.event is not None:
        command += ["--event", str(subject.event)]
    done = subprocess.run(command, cwd=ROOT, env=subject.env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"cold start of {subject.name} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def measure(subject: Subject, layers: Sequence[Path]) -> dict[str, Any]:
    done = cold_start(subject)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result.get("error"):
        raise BenchmarkError(f"{subject.name} failed on {subject.event}: {result['error']}\n{done.stderr[-2000:]}")
    shared, deps = layers
    for package, came_from, layer in (("prewarm", result.get("shared_package"), shared),
                                      ("botocore", result.get("deps_package"), deps)):
        if (subject.event is not None or package == "botocore") and (
                came_from is None or not Path(came_from).is_relative_to(layer)):
            raise BenchmarkError(f"{subject.name} imported {package} from {came_from}, "
                                 f"not from the built layer {layer}")
    return result


@dataclass(frozen=True)
class ImportLine:
    self_ms: float
    cumulative_ms: float
    depth: int
    name: str


def parse_importtime(stderr: str) -> list[ImportLine]:
    """The lines of `-X importtime`: `import time: self [us] | cumulative | <indent>name`."""
    lines = []
    for raw in stderr.splitlines():
        if not raw.startswith("import time:") or "self [us]" in raw:
            continue
        fields = raw[len("import time:"):].split("|")
        if len(fields) != 3:
            continue
        self_us, cumulative_us, name = fields
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        lines.append(ImportLine(int(self_us) / 1000, int(cumulative_us) / 1000, depth, name.strip()))
    return lines


def least(runs: list[list[ImportLine]]) -> list[ImportLine]:
    """The first run's import tree, each module's figures the least any run measured (noise only adds)."""
    best: dict[str, ImportLine] = {}
    for line in (line for run in runs for line in run):
        kept = best.get(line.name)
        best[line.name] = line if kept is None else ImportLine(
            min(kept.self_ms, line.self_ms), min(kept.cumulative_ms, line.cumulative_ms), kept.depth, line.name
        )
    return [ImportLine(best[x.name].self_ms, best[x.name].cumulative_ms, x.depth, x.name) for x in runs[0]]


@dataclass
class ImportCosts:
    """Where a cold start's import time goes."""

    total_ms: float
    by_package: list[tuple[str, float, str]]  # top-level package, summed self time, who imported it
    heaviest: list[tuple[str, float]]  # single modules, self time
    direct: list[tuple[str, float]]  # the handler module's own imports, cumulative
    on_invoke: list[tuple[str, float]]  # imported during the first invoke, cumulative


def import_costs(lines: list[ImportLine], module: str) -> ImportCosts:
    """The handler module's import tree (the lines before its own, deeper than it) and what follows it."""
    index = max((i for i, line in enumerate(lines) if line.name == module), default=-1)
    if index < 0:
        raise BenchmarkError(f"-X importtime shows no import of {module}")
    root = lines[index]
    start = index
    while start > 0 and lines[start - 1].depth > root.depth:
        start -= 1
    tree = lines[start:index]
    by_package: dict[str, float] = defaultdict(float)
    importer: dict[str, str] = {}
    for position, line in enumerate(tree):
        by_package[line.name.split(".")[0]] += line.self_ms
        if "." not in line.name:
            # A module's importer is the next line up the tree: importtime prints children first.
            parent = next((p for p in lines[start + position + 1 :] if p.depth < line.depth), root)
            importer[line.name] = parent.name
    by_package[module] += root.self_ms
    direct = [(line.name, line.cumulative_ms) for line in tree if line.depth == root.depth + 1]
    on_invoke = [(line.name, line.cumulative_ms) for line in lines[index + 1 :] if line.depth == 0]
    return ImportCosts(
        total_ms=root.cumulative_ms,
        by_package=sorted(((p, ms, importer.get(p, "")) for p, ms in by_package.items()), key=lambda x: -x[1]),
        heaviest=sorted([(line.name, line.self_ms) for line in [*tree, root]], key=lambda kv: -kv[1]),
        direct=sorted(direct, key=lambda kv: -kv[1]),
        on_invoke=sorted(on_invoke, key=lambda kv: -kv[1]),
    )


def explain(subject: Subject, prepare: Callable[[], None], runs: int, top: int = 10) -> ImportCosts:
    """Prints where `subject`'s import time goes: the least of `runs` runs under `-X importtime`."""
    measured = []
    for _ in range(runs):
        prepare()
        measured.append(parse_importtime(cold_start(subject, importtime=True).stderr))
    costs = import_costs(least(measured), subject.module)
    print(f"  {subject.name}: -X importtime says {costs.total_ms:.0f} ms (least of {runs} runs, its overhead included)")
    print("    by package (self time, imported by): " + ", ".join(
        f"{p} {ms:.0f} ms" + (f" ({via})" if via and via.split(".")[0] not in (p, subject.module) else "")
        for p, ms, via in costs.by_package[:top]))
    print("    heaviest modules (self time): " + ", ".join(f"{n} {ms:.0f} ms" for n, ms in costs.heaviest[:top]))
    print("    its imports (cumulative): " + ", ".join(f"{n} {ms:.0f} ms" for n, ms in costs.direct[:top]))
    if costs.on_invoke:
        print("    imported on first invoke: " + ", ".join(f"{n} {ms:.0f} ms" for n, ms in costs.on_invoke[:top]))
    return costs


class SampleState:
    """Puts the table back to what every run starts from: the push rule and the stream event's job."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        from prewarm.adapters.dynamodb import DynamoJobStore

        self.dynamodb = dynamodb
        self.table = table
        self.store = DynamoJobStore(table, client=dynamodb)
        stream = json.loads((EVENTS / f"{FUNCTION_EVENTS['dispatch_job']}.json").read_text())
        self.job_item = stream["Records"][0]["dynamodb"]["NewImage"]

    def reset(self) -> None:
        from prewarm.services.jobs import apply_manifest

        pages = self.dynamodb.get_paginator("scan").paginate(TableName=self.table, ProjectionExpression="pk, sk")
        for page in pages:
            for key in page.get("Items", []):
                self.dynamodb.delete_item(TableName=self.table, Key=key)
        apply_manifest(self.store, PUSH_RULE, now=1.0)
        self.dynamodb.put_item(TableName=self.table, Item=self.job_item)


def benchmark(repeat: int, explain_all: bool, explain_runs: int, keep: Path | None) -> dict[str, Any]:
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    names = discover_functions()
    print(f"cold_start: {len(names)} functions, median of {repeat} fresh interpreters each")
    runtime = "the runtime's" if sys.version_info[:2] == (3, 13) else "not the runtime's 3.13, but"
    with (KubeApiProcess(seeds=[ROOT / "samplefiles" / "cluster.yaml"]) as api, MotoProcess() as moto,
          lambda_code_dir(keep) as code):
        print(f"  moto ThreadedMotoServer and the embedded Kubernetes API in their own processes "
              f"({moto.url}, {api.url})")
        layers = build_layers(code)
        print(f"  shared and deps layers built by their Makefiles with Python {platform.python_version()} "
              f"({runtime} the one running the functions here); layers, functions and baseline read-only, "
              "PYTHONDONTWRITEBYTECODE=1")
        stack = LocalStack(moto.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        state = SampleState(stack.dynamodb, stack.env()["TABLE_NAME"])
        subjects = []
        for name in names:
            fn = stack.function(name)
            code_dir = read_only_copy(fn.code_dir, code / "functions" / name)
            subjects.append(Subject(
                name, code_dir, fn.handler.rpartition(".")[0],
                lambda_env(fn.env, moto.url, stack.region, f"{stack.stack_name}-{fn.logical_id}", code_dir,
                           fn.memory, layers),
                EVENTS / f"{FUNCTION_EVENTS[name]}.json",
            ))
        dispatch = stack.function("dispatch_job")
        naive_dir = read_only_copy(ROOT / "benchmarks" / "naive_handler.py", code / "naive")
        baseline = Subject(BASELINE, naive_dir, "naive_handler",
                           lambda_env(dispatch.env, moto.url, stack.region, "naive", naive_dir, 512, layers), None)
        set_writable(code, False)
        runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for _ in range(repeat):
            # Interleaved, so a burst of load on the machine spreads over every function.
            for subject in [*subjects, baseline]:
                if subject.event is not None:
                    state.reset()
                runs[subject.name].append(measure(subject, layers))
        figures = {
            s.name: {key: median([r[key] for r in runs[s.name]]) for key in ("import_ms", "import_cpu_ms")}
            for s in [*subjects, baseline]
        }
        for s in subjects:
            figures[s.name]["first_invoke_ms"] = median([r["first_invoke_ms"] for r in runs[s.name]])
        baseline_ms = figures[BASELINE]["import_ms"]
        width = max(len(n) for n in figures)
        for s in [*subjects, baseline]:
            f = figures[s.name]
            invoke = f"first invoke {f['first_invoke_ms']:6.0f} ms" if "first_invoke_ms" in f else "(import only)"
            print(f"  {s.name:{width}}  import {f['import_ms']:5.0f} ms ({f['import_cpu_ms']:4.0f} ms CPU, "
                  f"{f['import_ms'] / baseline_ms:.2f} of baseline)  {invoke}")
        missed = [s for s in subjects if figures[s.name]["import_ms"] > TARGET_IMPORT_MS]
        to_explain = [*subjects, baseline] if explain_all else missed
        if to_explain:
            print("  where the import time goes:")
            for s in to_explain:
                explain(s, state.reset if s.event is not None else lambda: None, runs=explain_runs)
        written = bytecode_written(code, layers)
        if written:
            raise BenchmarkError(f"cold starts wrote bytecode, which Lambda's read-only code cannot: {written[:5]}")
    worst = max(figures[s.name]["import_ms"] for s in subjects)
    print_targets([
        *(Target(f"{s.name} import", figures[s.name]["import_ms"], TARGET_IMPORT_MS, " ms") for s in subjects),
        Target("worst function import / naive handler's", worst / baseline_ms, TARGET_RATIO, "x"),
    ])
    print(f"  worst function import is {worst / baseline_ms:.2f} of the naive handler's {baseline_ms:.0f} ms")
    return {
        "functions": {
            s.name: {key: round(figures[s.name][key], 1) for key in ("import_ms", "first_invoke_ms", "import_cpu_ms")}
            for s in subjects
        },
        "baseline_import_ms": round(baseline_ms, 1),
        "worst_ratio": round(worst / baseline_ms, 3),
        "layer_python": platform.python_version(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/cold_start.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per function (default 5)")
    parser.add_argument("--explain", action="store_true", help="break down the import time of every function")
    parser.add_argument("--explain-runs", type=int, default=3,
                        help="runs under -X importtime per breakdown, the least kept (default 3)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="build the layers and copy the code into DIR (empty or new) and keep them there")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.explain_runs < 1:
        parser.error("--explain-runs must be at least 1")
    emit(benchmark(args.repeat, args.explain, args.explain_runs, args.keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
