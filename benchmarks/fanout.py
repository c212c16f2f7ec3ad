"""Fan-out of one job to every node: from the job's insert to every task enqueued.

template.yaml is deployed (`LocalStack`) onto moto's ThreadedMotoServer, and the embedded
Kubernetes API serves `--nodes` synthetic nodes; each server runs in its own child process, so
neither shares this process's CPU (GIL) or memory. The job selects every node (no selector) with
`parallelism` slots.

- Prewarm: `apply_manifest` inserts the job, then `plan_job` runs with the adapters the functions'
  composition root builds from template.yaml's environment (`prewarm.bootstrap`), as `dispatch_job`
  does for the stream record: nodes listed in raw pages, node items written with `BatchWriteItem`,
  the first `parallelism` tasks sent by 16 threads.
- Baseline: a naive dispatcher: typed `CoreV1Api.list_node()`, one `PutItem` per node item and one
  `SendMessage` per task, in sequence. Measured on every node, or on `--baseline-nodes` of them and
  extrapolated to `--nodes` (list time as measured, per-node time scaled), and then said so.

Node queues exist before the clock starts, as each node's hello makes its queue when its agent starts (a
send creates no queue: a send that finds none waits for the node's hello).
AWS calls are counted by botocore `before-call.*.*` hooks on the clients' event systems (HTTP
attempts, retries included, by `before-send.*.*`); Kubernetes API requests on the client side, at
the urllib3 pool the `kubernetes` ApiClient sends through.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import BenchmarkError, Target, emit, print_machine, print_targets
from benchmarks.servers import KubeApiProcess, MotoProcess

NAMESPACE = "default"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/shop/web@sha256:" + "5" * 64
TARGET_SQS_PER_NODE = 1.0
TARGET_DYNAMODB_PER_NODE = 0.1
TARGET_SECONDS_PER_5000 = 10.0


def job_manifest(name: str, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"image": IMAGE, "parallelism": parallelism, "completionPolicy": {"type": "Always"}},
    }


class AwsCalls:
    """Counts API calls (and HTTP attempts) per operation and per service on the clients it is attached to."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.by_service: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._lock = threading.Lock()  # the sender threads share the counters

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._call)
        client.meta.events.register("before-send.*.*", self._send)
        client.meta.events.register("after-call.*.*", self._done)

    def _call(self, event_name: str, **_: Any) -> None:
        service, operation = event_name.split(".")[1:]
        with self._lock:
            self.calls[operation] += 1
            self.by_service[service] += 1
            self.first.setdefault(operation, time.perf_counter())

    def _done(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.last[event_name.rsplit(".", 1)[-1]] = time.perf_counter()

    def _send(self, event_name: str, **_: Any) -> None:
        with self._lock:
            self.attempts[event_name.rsplit(".", 1)[-1]] += 1

    def span(self, operation: str) -> float:
        """Seconds from the first call of `operation` to the end of its last one."""
        return self.last.get(operation, 0.0) - self.first.get(operation, 0.0)

    def of(self, service: str) -> int:
        """Calls made to `service` (its id in botocore's event names: `sqs`, `dynamodb`)."""
        return self.by_service[service]


@contextmanager
def counted_kube_requests(cluster: Any) -> Iterator[Counter[str]]:
    """Counts the HTTP requests a `KubeCluster` sends, by method and path (query left out)."""
    pool = cluster._client.rest_client.pool_manager  # the adapter keeps its ApiClient private
    original = pool.request
    counts: Counter[str] = Counter()

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        counts[f"{method} {urlsplit(url).path}"] += 1
        return original(method, url, *args, **kwargs)

    pool.request = request
    try:
        yield counts
    finally:
        pool.request = original


def create_node_queues(queues: Any, nodes: list[str]) -> None:
    """What each node's hello has the control plane do when its agent starts: make its queue."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(queues.ensure_queue, nodes))


def prewarm_fanout(nodes: int, parallelism: int) -> dict[str, Any]:
    """Insert, plan and enqueue with Prewarm's adapters; figures and call counts."""
    from prewarm import bootstrap
    from prewarm.services.dispatch import plan_job
    from prewarm.services.jobs import apply_manifest

    bootstrap.reset()
    store, cluster, queues = bootstrap.store(), bootstrap.cluster(), bootstrap.queues()
    aws = AwsCalls()
    aws.attach(store.client)
    aws.attach(bootstrap.node_queues().client)  # the paced queues' own: sends and the budget's write
    name = "fanout"
    with counted_kube_requests(cluster) as kube:
        started, cpu = time.perf_counter(), time.process_time()
        apply_manifest(store, job_manifest(name, parallelism), now=time.time())
        result = plan_job(store, cluster, queues, f"{NAMESPACE}/{name}", now=time.time(),
                          secrets=bootstrap.secret_mirror())
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    expected = min(parallelism, nodes)
    if result.send_failures or result.sent != expected or result.selected != nodes:
        raise BenchmarkError(
            f"plan_job selected {result.selected} of {nodes} nodes and sent {result.sent} of {expected} tasks; "
            f"failures: {result.send_failures[:3]}"
        )
    return {"seconds": seconds, "cpu_s": cpu, "aws": aws, "kube": kube, "sent": result.sent}


def naive_fanout(api_url: str, token: str, measured_nodes: int, total_nodes: int) -> dict[str, Any]:
    """The baseline: typed list, then PutItem and SendMessage one node at a time."""
    from kubernetes.client import ApiClient, Configuration, CoreV1Api

    from prewarm import bootstrap
    from prewarm.adapters.dynamodb import job_pk, node_sk
    from prewarm.domain.messages import PullTask
    from prewarm.services.jobs import apply_manifest

    bootstrap.reset()
    store, queues = bootstrap.store(), bootstrap.node_queues()
    ddb, sqs = store.client, queues.client
    aws = AwsCalls()
    aws.attach(ddb)
    aws.attach(sqs)
    config = Configuration(host=api_url)
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    name = "naive-fanout"
    key = f"{NAMESPACE}/{name}"
    with ApiClient(config) as client:
        started = time.perf_counter()
        apply_manifest(store, job_manifest(name, measured_nodes), now=time.time())
        record = store.get_job(key)
        assert record is not None
        items: list[Any] = CoreV1Api(client).list_node().items
        names = [n.metadata.name for n in items]
        listed = time.perf_counter()
        now = time.time()
        for node in names[:measured_nodes]:
            ddb.put_item(TableName=store.table_name, Item={
                "pk": {"S": job_pk(key)}, "sk": {"S": node_sk(node)}, "kind": {"S": "task"}, "node": {"S": node},
                "round": {"N": "0"}, "phase": {"S": "Waiting"}, "dispatched_at": {"N": str(now)},
                "version": {"N": "0"}, "updated_at": {"N": str(now)},
            })
        for node in names[:measured_nodes]:
            task = PullTask(job=key, job_uid=record.uid, round=0, node=node, image=IMAGE,
                            image_pull_policy="IfNotPresent", timeout_seconds=600, backoff_limit=3)
            sqs.send_message(QueueUrl=queues.queue_url(node), MessageBody=task.model_dump_json())
        ddb.update_item(
            TableName=store.table_name, Key={"pk": {"S": job_pk(key)}, "sk": {"S": "JOB"}},
            UpdateExpression="SET desired = :n, active = :n", ExpressionAttributeValues={":n": {"N": str(len(names))}},
        )
        finished = time.perf_counter()
    per_node = (finished - listed) / measured_nodes
    return {
        "measured_nodes": measured_nodes,
        "measured_s": finished - started,
        "list_s": listed - started,
        "seconds": (listed - started) + per_node * total_nodes,
        "aws": aws,
    }


def benchmark(nodes: int, parallelism: int, baseline_nodes: int) -> dict[str, Any]:
    from prewarm_devtools.sam.aws import aws_environment
    from prewarm_devtools.sam.stack import LocalStack

    print_machine()
    print(f"fanout: one job over {nodes} synthetic nodes, parallelism {parallelism}")
    with KubeApiProcess(nodes=nodes) as api, MotoProcess() as moto, aws_environment(moto.url):
        print(f"  moto ThreadedMotoServer in its own process at {moto.url}; "
              f"embedded Kubernetes API in its own process at {api.url}")
        stack = LocalStack(moto.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        # dispatch_job's environment from template.yaml, signing as its role (node queues take tasks
        # from the stack's sending roles only).
        dispatch = stack.function("DispatchJobFunction")
        identity = dispatch.identity.environment() if dispatch.identity else {}
        with mock.patch.dict(os.environ, {**stack.env(), **identity}):
            from prewarm import bootstrap

            names = [n["metadata"]["name"] for n in bootstrap.cluster().list_nodes()]
            started = time.perf_counter()
            create_node_queues(bootstrap.node_queues(), names)
            print(f"  {len(names)} node queues created first, as their hellos do at start "
                  f"({time.perf_counter() - started:.1f} s, not counted)")
            servers = {"moto": moto, "kube": api}
            before = {name: server.cpu_seconds() for name, server in servers.items()}
            ours = prewarm_fanout(nodes, parallelism)
            ours["server_cpu"] = {name: server.cpu_seconds() - before[name] for name, server in servers.items()}
            naive = naive_fanout(api.url, api.token, min(baseline_nodes, nodes), nodes)
            bootstrap.reset()
    return summarize(nodes, ours, naive)


def summarize(nodes: int, ours: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
    aws: AwsCalls = ours["aws"]
    kube: Counter[str] = ours["kube"]
    total = sum(aws.calls.values())
    sqs, dynamodb = aws.of("sqs"), aws.of("dynamodb")
    seconds = ours["seconds"]
    naive_aws: AwsCalls = naive["aws"]
    print(f"  prewarm : {seconds:.2f} s for {ours['sent']} tasks ({ours['sent'] / seconds:.0f} tasks/s); "
          f"{total} AWS calls ({sum(aws.attempts.values())} HTTP attempts), {sum(kube.values())} Kubernetes requests")
    print("            AWS calls: " + ", ".join(f"{op} {n}" for op, n in aws.calls.most_common()))
    print(f"            SendMessage phase {aws.span('SendMessage'):.2f} s, BatchWriteItem phase "
          f"{aws.span('BatchWriteItem'):.2f} s; CPU meanwhile: {ours['cpu_s']:.2f} s in this process (boto3 and "
          "the adapters), " + ", ".join(f"{name} server {cpu:.2f} s" for name, cpu in ours["server_cpu"].items()))
    print("            Kubernetes: " + ", ".join(f"{what} {n}" for what, n in kube.most_common()))
    extrapolated = naive["measured_nodes"] < nodes
    measured = f"{naive['measured_s']:.2f} s measured for {naive['measured_nodes']} nodes"
    if extrapolated:
        measured += f", {naive['seconds']:.1f} s extrapolated to {nodes} nodes"
    print(f"  baseline: {measured} (typed list of all {nodes} nodes {naive['list_s']:.2f} s); "
          f"{sum(naive_aws.calls.values())} AWS calls: "
          + ", ".join(f"{op} {n}" for op, n in naive_aws.calls.most_common()))
    if aws.calls["CreateQueue"]:
        print("            (it ran after Prewarm's sends had created the node queues: it cannot create them)")
    speedup = naive["seconds"] / seconds
    print(f"  speedup over the naive dispatcher: {speedup:.1f}x" + (" (baseline extrapolated)" if extrapolated else ""))
    print_targets([
        Target("SQS calls per node", sqs / nodes, TARGET_SQS_PER_NODE),
        Target("DynamoDB calls per node", dynamodb / nodes, TARGET_DYNAMODB_PER_NODE),
        Target(f"seconds for {nodes} nodes", seconds, TARGET_SECONDS_PER_5000 * nodes / 5000, " s"),
    ])
    return {
        "nodes": nodes,
        "seconds": round(seconds, 3),
        "calls": dict(aws.calls.most_common()),
        "calls_per_node": round(total / nodes, 4),
        "sqs_calls_per_node": round(sqs / nodes, 4),
        "dynamodb_calls_per_node": round(dynamodb / nodes, 4),
        "kube_calls": sum(kube.values()),
        "cpu_s": {"client": round(ours["cpu_s"], 2), **{k: round(v, 2) for k, v in ours["server_cpu"].items()}},
        "baseline": {
            "seconds": round(naive["seconds"], 2),
            "extrapolated": extrapolated,
            "measured_nodes": naive["measured_nodes"],
            "measured_s": round(naive["measured_s"], 2),
            "calls": dict(naive_aws.calls.most_common()),
        },
        "speedup": round(speedup, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/fanout.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="synthetic nodes, all selected (default 5000)")
    parser.add_argument("--parallelism", type=int, default=5000, help="tasks sent at once (default 5000)")
    parser.add_argument("--baseline-nodes", type=int, default=0,
                        help="measure the naive dispatcher on this many nodes and extrapolate (default: all)")
    args = parser.parse_args(argv)
    if min(args.nodes, args.parallelism) < 1 or args.baseline_nodes < 0:
        parser.error("--nodes and --parallelism must be at least 1, --baseline-nodes not negative")
    emit(benchmark(args.nodes, args.parallelism, args.baseline_nodes or args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
