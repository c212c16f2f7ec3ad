"""`prewarm demo`: local mode, the sample rules and a `Never` job, one push, live progress, verified pulls.

It exits 0 only if every eligible node succeeded and CRI `ImageStatus` on each node finds the image.
With `--output json` the last line printed is one JSON object (see `demo_report`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.manifests import parse_manifests
from prewarm.services.jobs import JobView, apply_manifest, view_job
from prewarm_devtools.localmode import LocalMode
from prewarm_devtools.project import project_files

DEMO_REPOSITORY, DEMO_TAG = "platform/demo", "v1"
BASE_REPOSITORY, BASE_TAG = "tools/node-base", "1.0"


class DemoFailedError(RuntimeError):
    """The demo ran but not every eligible node ended with the image verified present."""


@dataclass
class DemoResult:
    report: dict[str, Any]
    ok: bool


def _apply_file(store: DynamoJobStore, path: Path) -> list[str]:
    lines = []
    for manifest in parse_manifests(path.read_text(encoding="utf-8")):
        lines.append(apply_manifest(store, manifest.to_manifest(), now=time.time()).describe())
    return lines


def _console(output: str) -> Any:
    from rich.console import Console

    # JSON output keeps stdout for the one JSON line: the human part goes to stderr.
    return Console(stderr=output == "json")


def run_demo(
    *, nodes: int | None = 3, image_mb: float = 50.0, output: str = "table", keep: bool = False,
    timeout: float = 300.0,
) -> DemoResult:
    console = _console(output)
    mode = LocalMode(nodes=nodes)
    console.print(f"[bold]Starting local mode[/]: moto, Kubernetes API with "
                  f"{'the sample cluster' if not nodes else f'{nodes} synthetic nodes'}, a registry playing ECR, "
                  "one containerd and one agent per node")
    mode.start()
    try:
        return _run(mode, console, image_mb=image_mb, output=output, timeout=timeout, keep=keep)
    finally:
        if keep:
            console.print("[yellow]--keep[/]: local mode stays up (state written for `prewarm --local`); "
                          "press Ctrl-C to stop it")
            if mode.kubeconfig_written is not None:
                console.print(f"kubectl as the cluster admin: export KUBECONFIG={mode.kubeconfig_written}")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        mode.stop()


def _run(mode: LocalMode, console: Any, *, image_mb: float, output: str, timeout: float, keep: bool) -> DemoResult:
    assert mode.stack is not None and mode.aws is not None
    store = DynamoJobStore(mode.stack.env()["TABLE_NAME"], client=mode.aws.client("dynamodb"))
    console.print(f"Nodes with an agent: {len(mode.nodes)}")
    samples = project_files().samplefiles
    for path in sorted((samples / "rules").glob("*.yaml")):
        for line in _apply_file(store, path):
            console.print(f"  {line}")
    mode.push(BASE_REPOSITORY, BASE_TAG, size_mb=1)
    for line in _apply_file(store, samples / "jobs" / "node-base-never.yaml"):
        console.print(f"  {line}")
    console.print(f"[bold]Pushing[/] {DEMO_REPOSITORY}:{DEMO_TAG} ({image_mb:g} MB) and emitting ECR's PUSH event")
    pushed = mode.push(DEMO_REPOSITORY, DEMO_TAG, size_mb=image_mb)
    if not pushed.jobs:
        raise DemoFailedError(f"no rule matched {DEMO_REPOSITORY}:{DEMO_TAG}; check samplefiles/rules")
    for line in pushed.jobs:
        console.print(f"  {line}")
    name = pushed.jobs[0].split("/", 1)[1].split()[0]
    namespace = "default"
    view = _watch(store, console, namespace, name, pushed.pushed_at, timeout=timeout, show=output != "json")
    report = demo_report(mode, store, view, pushed)
    ok = (view.completion_time is not None and view.failed == 0
          and all(n["verified_present"] and n["phase"] == "Succeeded" for n in report["nodes"]))
    if output == "json":
        print(json.dumps(report, default=str))
    else:
        _print_tables(console, report)
    console.print("[bold green]Demo passed[/]: every eligible node has the image, verified through CRI"
                  if ok else "[bold red]Demo failed[/]: see the node table")
    return DemoResult(report, ok)


def _watch(store: DynamoJobStore, console: Any, namespace: str, name: str, pushed_at: float, *, timeout: float,
           show: bool) -> JobView:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    columns = (TextColumn("{task.description:<14}"), BarColumn(), TextColumn("{task.fields[detail]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not show) as progress:
        nodes_bar = progress.add_task("nodes done", total=None, detail="")
        bytes_bar = progress.add_task("bytes pulled", total=None, detail="")
        while True:
            view = view_job(store, namespace, name, now=time.time(), with_tasks=True)
            total_bytes = sum(t.bytes_total or 0 for t in view.tasks)
            done_bytes = sum(
                (t.bytes_total or 0) if t.phase.value == "Succeeded" else (t.bytes_done or 0) for t in view.tasks
            )
            done = view.succeeded + view.failed
            progress.update(nodes_bar, total=view.desired or None, completed=done,
                            detail=f"{done}/{view.desired}  {view.message}")
            progress.update(bytes_bar, total=total_bytes or None, completed=done_bytes,
                            detail=f"{done_bytes / 1e6:,.1f}/{total_bytes / 1e6:,.1f} MB")
            if view.completion_time is not None:
                return view
            if time.monotonic() > deadline:
                raise DemoFailedError(f"job {namespace}/{name} did not finish in {timeout:g} s: {view.message}")
            time.sleep(0.25)


def demo_report(mode: LocalMode, store: DynamoJobStore, view: JobView, pushed: Any) -> dict[str, Any]:
    """The JSON the demo prints last: job status, nodes (verified through CRI), excluded nodes, timings."""
    nodes = []
    for task in view.tasks:
        local = mode.nodes.get(task.node)
        seconds = (task.finished_at - task.started_at) if task.finished_at and task.started_at else None
        nodes.append({
            "name": task.node,
            "phase": task.phase.value,
            "verified_present": bool(local and local.image_present(pushed.reference)),
            "seconds": round(seconds, 3) if seconds is not None else None,
            "bytes": task.bytes_total or task.bytes_done or 0,
        })
    started = [t.started_at for t in view.tasks if t.started_at]
    return {
        "job": {
            "name": view.record.name, "desired": view.desired, "active": view.active,
            "succeeded": view.succeeded, "failed": view.failed, "failedNodes": view.failed_nodes,
            "message": view.message,
        },
        "nodes": nodes,
        "excluded": [{"name": e.name, "reason": e.reason} for e in view.excluded],
        "timings": {
            "push_to_first_pull_s": round(min(started) - pushed.pushed_at, 3) if started else None,
            "push_to_done_s": round(view.completion_time - pushed.pushed_at, 3) if view.completion_time else None,
        },
    }


def _print_tables(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table

    job = report["job"]
    t = Table(title="ImagePullJob")
    for col in ("NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "MESSAGE"):
        t.add_column(col)
    t.add_row(job["name"], str(job["desired"]), str(job["active"]), str(job["succeeded"]), str(job["failed"]),
              job["message"])
    console.print(t)
    n = Table(title="Nodes")
    for col in ("NODE", "PHASE", "VERIFIED", "SECONDS", "BYTES"):
        n.add_column(col)
    for node in report["nodes"]:
        n.add_row(node["name"], node["phase"], "yes" if node["verified_present"] else "NO",
                  f"{node['seconds']:.2f}" if node["seconds"] is not None else "-", f"{node['bytes']:,}")
    console.print(n)
    for e in report["excluded"]:
        console.print(f"  excluded {e['name']}: {e['reason']}")
    timings = report["timings"]
    console.print(f"push → first pull {timings['push_to_first_pull_s']} s, push → done {timings['push_to_done_s']} s")


def main(argv: list[str] | None = None) -> int:
    """`python -m prewarm_devtools.demo`: the same as `prewarm demo` (the CLI calls `run_demo`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="prewarm demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="synthetic nodes (0: the sample cluster)")
    parser.add_argument("--image-mb", type=float, default=50.0)
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    result = run_demo(nodes=args.nodes or None, image_mb=args.image_mb, output=args.output, keep=args.keep)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
