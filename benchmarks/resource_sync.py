"""`sync_resources` over a cluster of many job resources: does a sync fit in its one-minute period, and
does it write only what changed?

The embedded Kubernetes API (its own process) serves the prewarm.dev CRDs `prewarm install` ships and
`--jobs` ImagePullJob resources over `--namespaces` namespaces; template.yaml's table is on moto (its
own process, behind the AWS limits layer). Three syncs run as the scheduled function runs them:

1. **first**: every resource is new: each is applied to the table and gets its status;
2. **steady**: nothing changed: the sync should read and write nothing but its lists;
3. **edited**: `--edit` of the resources had their spec changed: only those are applied and written.

Each prints its wall time and its calls: Kubernetes lists and status writes, and DynamoDB calls by
operation. The counts carry over to AWS; the wall times are moto's and this machine's (moto answers a
call in milliseconds where DynamoDB takes single-digit milliseconds, so they are an upper bound here).

Target: every sync under 60 s (the schedule's period), and the steady sync making no writes at all.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Target, emit, print_machine, print_targets
from benchmarks.servers import KubeApiProcess, MotoProcess

API = "prewarm.dev/v1alpha1"
PERIOD_S = 60.0


class CountingCluster:
    """The Kubernetes API, counting what the sync asks of it."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.calls: collections.Counter[str] = collections.Counter()

    def list_objects(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["list"] += 1
        return self.cluster.list_objects(*args, **kwargs)

    def replace_status(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["status write"] += 1
        return self.cluster.replace_status(*args, **kwargs)

    def delete_object(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["delete"] += 1
        return self.cluster.delete_object(*args, **kwargs)


def counting_client(client: Any) -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    client.meta.events.register("before-call.dynamodb.*",
                                lambda model, **_: calls.update([model.name]))
    return calls


def one_sync(name: str, store: Any, cluster: CountingCluster, ddb_calls: collections.Counter[str]) -> dict[str, Any]:
    from prewarm.services.resources import sync_resources

    cluster.calls.clear()
    ddb_calls.clear()
    started = time.perf_counter()
    report = sync_resources(store, cluster, now=time.time())
    seconds = time.perf_counter() - started
    writes = sum(n for op, n in ddb_calls.items() if op in ("PutItem", "UpdateItem", "DeleteItem",
                                                            "BatchWriteItem", "TransactWriteItems"))
    print(f"  {name}: {seconds:.1f} s; listed {report.listed}, applied {len(report.applied)}, unchanged "
          f"{report.unchanged}, statuses written {report.statuses_written}; Kubernetes {dict(cluster.calls)}; "
          f"DynamoDB {dict(sorted(ddb_calls.items()))} ({writes} writes)", flush=True)
    return {"seconds": round(seconds, 2), "applied": len(report.applied), "unchanged": report.unchanged,
            "statuses_written": report.statuses_written, "kubernetes_calls": dict(cluster.calls),
            "dynamodb_calls": dict(ddb_calls), "dynamodb_writes": writes}


def benchmark(jobs: int, namespaces: int, edit: int) -> dict[str, Any]:
    import boto3

    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.kube import KubeCluster
    from prewarm_cli.install.crds import custom_resource_definitions
    from prewarm_devtools.sam.aws import aws_environment
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    print(f"resource_sync: {jobs} ImagePullJob resources over {namespaces} namespaces; {edit} edited")
    with KubeApiProcess() as api, MotoProcess() as moto, aws_environment(moto.url):
        stack = LocalStack(moto.url, parameters={"ClusterName": "local"},
                           stack_name=f"sync-{uuid.uuid4().hex[:6]}").deploy()
        ddb = boto3.client("dynamodb")
        ddb_calls = counting_client(ddb)
        store = DynamoJobStore(stack.env()["TABLE_NAME"], client=ddb)
        with KubeCluster(api.url, lambda: api.token) as admin:
            for crd in custom_resource_definitions():
                admin.create_object("apiextensions.k8s.io/v1", "customresourcedefinitions", crd)
            time.sleep(0.5)  # the API server serves a new CRD's resources once it is Established
            for n in range(namespaces):
                admin.create_object("v1", "namespaces", {"metadata": {"name": f"team-{n}"}})
            for i in range(jobs):
                namespace = f"team-{i % namespaces}"
                admin.create_object(API, "imagepulljobs", {
                    "apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": f"job-{i}", "namespace": namespace},
                    "spec": {"image": f"registry.example/app-{i}:1", "parallelism": 2,
                             "selector": {"matchLabels": {"pool": "gpu"}}}}, namespace)
            cluster = CountingCluster(admin)
            runs = {"first": one_sync("first", store, cluster, ddb_calls),
                    "steady": one_sync("steady", store, cluster, ddb_calls)}
            for i in range(edit):
                namespace = f"team-{i % namespaces}"
                current = admin.get_object(API, "imagepulljobs", f"job-{i}", namespace)
                current["spec"]["parallelism"] = 4
                admin.replace_object(API, "imagepulljobs", f"job-{i}", current, namespace)
            runs["edited"] = one_sync("edited", store, cluster, ddb_calls)
    first, steady, edited = runs["first"], runs["steady"], runs["edited"]
    met = print_targets([
        Target("first_sync_s", first["seconds"], PERIOD_S, " s"),
        Target("steady_sync_s", steady["seconds"], PERIOD_S, " s"),
        Target("edited_sync_s", edited["seconds"], PERIOD_S, " s"),
        Target("steady_writes", steady["dynamodb_writes"] + steady["statuses_written"], 0),
        Target("edited_table_writes_per_edit", edited["dynamodb_writes"] / max(edit, 1), 2),
    ])
    return {"jobs": jobs, "namespaces": namespaces, "edit": edit, **runs, "targets_met": met}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=1000, help="ImagePullJob resources (default 1000)")
    parser.add_argument("--namespaces", type=int, default=50, help="namespaces they are spread over (default 50)")
    parser.add_argument("--edit", type=int, default=100, help="resources whose spec changes before the third sync")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.namespaces < 1 or not 0 <= args.edit <= args.jobs:
        parser.error("--jobs and --namespaces must be at least 1, --edit between 0 and --jobs")
    emit(benchmark(args.jobs, args.namespaces, args.edit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
