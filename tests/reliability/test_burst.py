"""A burst: 50 jobs applied at once on a 200-node synthetic EKS cluster, through template.yaml.

The stack runs on a moto server (`LocalStack`: the real event source mappings, batch sizes, stream
filter and redrive), the cluster on the embedded Kubernetes API, and a fleet of simulated agents
takes tasks off the 200 node queues and reports through the status queue. Every job must complete
with exact counters: desired = the nodes its selector names, the scripted failures as failedNodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from moto.dynamodb.models.table import StreamShard

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import PullTask, StatusReport, parse_node_message
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.kubeapi.synthetic import generate_cluster
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.reliability.invariants import assert_invariant
from tests.support.manifests import IMAGE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOBS = 50
NODES = 200


class Fleet:
    """The agents of every node: take tasks off the node queues and report the outcome, after a Pulling
    report on the `progress` nodes (a fifth of them: each report costs a transaction on moto)."""

    def __init__(self, sqs: Any, queues: NodeQueues, status_url: str, failing: set[tuple[str, str]],
                 progress: set[str]) -> None:
        self.sqs, self.queues, self.status_url = sqs, queues, status_url
        self.failing, self.progress = failing, progress
        self.tasks: Counter[tuple[str, str]] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=16)

    def poll(self) -> int:
        """One pass over every node queue; returns the reports sent."""
        urls = self.queues.list_node_queues().values()
        return sum(self._pool.map(self._work, urls))

    def _work(self, url: str) -> int:
        got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        reports = []
        for m in got:
            task = parse_node_message(m["Body"])
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            if not isinstance(task, PullTask):
                continue
            self.tasks[(task.job, task.node)] += 1
            ref = {"job": task.job, "job_uid": task.job_uid, "round": task.round, "node": task.node}
            if task.node in self.progress:
                reports.append(StatusReport(**ref, phase="Pulling", seq=1, bytes_done=0, bytes_total=1000))
            if (task.job, task.node) in self.failing:
                reports.append(StatusReport(**ref, phase="Failed", seq=2, message="rpc error: code = Unavailable"))
            else:
                reports.append(StatusReport(**ref, phase="Succeeded", seq=2, bytes_done=1000, bytes_total=1000,
                                            image_id="sha256:" + "5" * 64))
        for r in reports:
            self.sqs.send_message(QueueUrl=self.status_url, MessageBody=r.model_dump_json())
        return len(reports)

    def close(self) -> None:
        self._pool.shutdown()


@pytest.fixture
def _stream_records_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    # moto deep-copies a table, stream records included, before every transaction (to roll back):
    # the copy grows with every write and a burst would cost quadratic time. Rolling back never
    # needs the stream, so the copy shares it.
    monkeypatch.setattr(StreamShard, "__deepcopy__", lambda self, memo: self, raising=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[KubeApiServer, list[dict[str, Any]]]]:
    nodes = generate_cluster(NODES, seed=8)
    with KubeApiServer() as api:
        api.seed_objects(nodes)
        yield api, nodes


def burst(nodes: list[dict[str, Any]]) -> list[tuple[dict[str, Any], set[str]]]:
    """50 jobs and the nodes each must select: node names (4 at a time) or a node group and zone."""
    names = [n["metadata"]["name"] for n in nodes]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    jobs = []
    for i in range(JOBS):
        spec: dict[str, Any] = {"image": IMAGE.replace("a" * 64, f"{i:064x}"), "parallelism": (1, 2, 4)[i % 3]}
        if i % 10:
            chosen = {names[(4 * i + k) % NODES] for k in range(4)}
            spec["selector"] = {"names": sorted(chosen)}
        else:
            group, zone = ("gpu", "batch-spot", "general-arm64")[i % 3], f"us-west-2{'abc'[i % 3]}"
            spec["selector"] = {"matchLabels": {"eks.amazonaws.com/nodegroup": group,
                                                "topology.kubernetes.io/zone": zone}}
            chosen = {n for n, lab in labels.items()
                      if lab["eks.amazonaws.com/nodegroup"] == group and lab["topology.kubernetes.io/zone"] == zone}
        doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
               "metadata": {"name": f"burst-{i:02d}", "namespace": "default"}, "spec": spec}
        jobs.append((doc, chosen))
    return jobs


@pytest.mark.usefixtures("_stream_records_not_copied")
def test_fifty_jobs_at_once_on_two_hundred_nodes_all_complete_with_exact_counters(
    cluster: tuple[KubeApiServer, list[dict[str, Any]]],
) -> None:
    api, nodes = cluster
    jobs = burst(nodes)
    # one node in every seventh job fails its pull
    failing = {(f"default/{doc['metadata']['name']}", sorted(chosen)[0]) for i, (doc, chosen) in enumerate(jobs)
               if i % 7 == 0}
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        stack.prime_streams()
        env = stack.env()
        store = DynamoJobStore(env["TABLE_NAME"], client=aws.client("dynamodb"))
        queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=aws.client("sqs"))
        for node in nodes:
            queues.ensure_queue(node["metadata"]["name"])  # as each node's agent does at start
        fleet = Fleet(aws.client("sqs"), queues, env["STATUS_QUEUE_URL"], failing,
                      {n["metadata"]["name"] for n in nodes[::5]})
        try:
            # Given 50 jobs applied at once
            for doc, _ in jobs:
                assert apply_manifest(store, doc, now=1.0).outcome == "created"
            # When the stack and the agents run until nothing moves: the control plane drains its
            # stream and status queue, then the agents take the tasks that wave handed out
            for _ in range(40):
                stack.run_until_idle(timeout=120, idle_rounds=1)
                if not fleet.poll():
                    break
        finally:
            fleet.close()
        # Then every job completed, its counters exact, each selected node pulled it once
        wrong = []
        for doc, chosen in jobs:
            key = f"default/{doc['metadata']['name']}"
            record = store.get_job(key)
            assert record is not None
            failed = sorted(node for job, node in failing if job == key)
            c = record.counters
            got = (record.state, c.desired, c.active, c.waiting, c.succeeded, c.failed, sorted(store.failed_nodes(key)))
            want = ("Completed", len(chosen), 0, 0, len(chosen) - len(failed), len(failed), failed)
            if got != want or {n for (j, n) in fleet.tasks if j == key} != chosen:
                wrong.append(f"{key}: {got} != {want}")
            assert_invariant(store, key)
        assert not wrong, "\n".join(wrong)
        assert sum(fleet.tasks.values()) == sum(len(chosen) for _, chosen in jobs) >= 200
        # nothing dead-lettered on the way
        for dlq in ("StatusDLQ", "DispatchDLQ", "NodeDLQ"):
            attributes = stack.sqs.get_queue_attributes(QueueUrl=stack.physical[dlq].ref,
                                                        AttributeNames=["ApproximateNumberOfMessages"])
            assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0", dlq
