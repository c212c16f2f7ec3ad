"""The whole control plane on one machine: template.yaml on a moto server, the sample cluster on the
embedded Kubernetes API, and a test playing the agents' side of the queues.

moto emits no EventBridge event on an ECR push and never fires schedules: the test delivers the push
event and fires the schedules itself, as local mode does.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import CancelTask, Hello, PullTask, StatusReport, parse_node_message
from prewarm.services.jobs import apply_manifest, request_deletion, view_job
from prewarm_cli.install.render import MANIFESTS
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.invocation import WiringError
from prewarm_devtools.sam.stack import LocalStack
from prewarm_devtools.sam.template import ROOT, TEMPLATE
from tests.support.local_functions import intercept, invoking

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "7" * 64
EXCLUDED = {
    "fargate-ip-10-0-140-7.us-west-2.compute.internal": "virtual-kubelet node",
    "ip-10-0-90-150.us-west-2.compute.internal": "node is not Ready",
}


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_from_file(ROOT / "samplefiles" / "cluster.yaml")
        # The agent DaemonSet as `prewarm install` ships it: dispatch reads where agents run from it.
        for manifest in ("00-namespace.yaml", "40-daemonset.yaml"):
            api.seed_from_file(MANIFESTS / manifest)
        stack = LocalStack(aws.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        stack.prime_streams()
        e = stack.env()
        yield {
            "stack": stack, "api": api, "aws": aws,
            "store": DynamoJobStore(e["TABLE_NAME"], client=aws.client("dynamodb")),
            "queues": NodeQueues(e["NODE_QUEUE_PREFIX"], e["STATUS_QUEUE_URL"], client=aws.client("sqs")),
            "sqs": aws.client("sqs"), "status_url": e["STATUS_QUEUE_URL"],
        }
        stack.stop()


def push_event(repository: str, tag: str, digest: str = DIGEST) -> dict[str, Any]:
    event = json.loads((ROOT / "events" / "ecr_push.json").read_text())
    event["region"] = "us-west-2"
    event["detail"].update({"repository-name": repository, "image-tag": tag, "image-digest": digest})
    return event


def rule(name: str, repositories: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": name},
            "spec": {"repositories": repositories, "template": {"metadata": {"namespace": "ml"}, "spec": spec}}}


class Agents:
    """Plays every node's agent: takes tasks off the node queues and reports through the status queue."""

    def __init__(self, env: dict[str, Any], nodes: list[str]) -> None:
        self.env, self.nodes = env, nodes
        self.tasks: dict[str, list[PullTask | CancelTask]] = {n: [] for n in nodes}
        for node in nodes:
            env["queues"].ensure_queue(node)  # each agent's hello makes its queue as it starts

    def take(self) -> list[PullTask | CancelTask]:
        got = []
        for node in self.nodes:
            url = self.env["queues"].queue_url(node)
            try:
                msgs = self.env["sqs"].receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                       WaitTimeSeconds=0).get("Messages", [])
            except self.env["sqs"].exceptions.QueueDoesNotExist:
                continue
            for m in msgs:
                parsed = parse_node_message(m["Body"])
                self.tasks[node].append(parsed)
                got.append(parsed)
                self.env["sqs"].delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return got

    def report(self, task: PullTask, phase: str, seq: int, **kw: Any) -> None:
        msg = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase=phase,
                           seq=seq, **kw)
        self.env["sqs"].send_message(QueueUrl=self.env["status_url"], MessageBody=msg.model_dump_json())


def node_names(env: dict[str, Any]) -> list[str]:
    return sorted(n["metadata"]["name"] for n in env["api"].list_objects("nodes"))


def test_push_to_completed_job_on_the_sample_cluster_with_exact_counters(env: dict[str, Any]) -> None:
    stack, store = env["stack"], env["store"]
    assert apply_manifest(store, rule("llm", ["ml/*"], {"parallelism": 3}), now=1.0).outcome == "created"
    results = stack.put_event(push_event("ml/llm", "v1"))
    assert results == [{"jobs": [f"imagepulljob.apps.kruise.io/llm-{'7' * 12} created"]}]
    stack.put_event(push_event("ml/llm", "v1"))  # EventBridge delivers at least once: nothing new
    stack.put_event(push_event("other/repo", "v1"))  # no rule matches
    agents = Agents(env, node_names(env))
    key = ("ml", f"llm-{'7' * 12}")
    stack.run_until_idle()
    view = view_job(store, *key, now=0)
    assert view.desired == 10 and view.active == 3
    assert {e.name: e.reason for e in view.excluded} == EXCLUDED
    failed_node = "ip-10-0-27-143.us-west-2.compute.internal"
    reported: set[str] = set()
    while len(reported) < 10:
        batch = [t for t in agents.take() if isinstance(t, PullTask)]
        assert batch, "the control plane stopped handing out tasks"
        assert view_job(store, *key, now=0).active <= 3
        for task in batch:
            assert task.image == f"123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/llm@{DIGEST}"
            agents.report(task, "Pulling", 1, bytes_done=0, bytes_total=100)
            if task.node == failed_node:
                agents.report(task, "Failed", 2, message="rpc error: code = NotFound desc = not found")
            else:
                agents.report(task, "Succeeded", 2, image_id="sha256:" + "9" * 64)
                agents.report(task, "Succeeded", 2, image_id="sha256:" + "9" * 64)  # a duplicate
            reported.add(task.node)
        stack.run_until_idle()
    view = view_job(store, *key, now=0)
    assert (view.desired, view.active, view.succeeded, view.failed) == (10, 0, 9, 1)
    assert view.failed_nodes == [failed_node]
    # (the pushed digest is an event's alone, not in ECR: its layer count unknown, as the message adds)
    assert view.message.split("; ")[0] == "job has completed" and view.completion_time is not None
    assert sorted(n for n, ts in agents.tasks.items() if ts) == sorted(set(node_names(env)) - set(EXCLUDED))


def test_pod_selector_never_job_adds_a_new_node_on_hello_and_deletes_with_cancels(env: dict[str, Any]) -> None:
    stack, store = env["stack"], env["store"]
    job = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
           "metadata": {"name": "inference-warm", "namespace": "ml"},
           "spec": {"image": "registry.k8s.io/pause:3.9", "parallelism": 10,
                    "completionPolicy": {"type": "Never"}, "podSelector": {"matchLabels": {"app": "inference"}}}}
    apply_manifest(store, job, now=1.0)
    stack.run_until_idle()
    agents = Agents(env, [*node_names(env), "ip-10-0-200-1.us-west-2.compute.internal"])
    first = agents.take()
    assert sorted(t.node for t in first) == ["ip-10-0-127-36.us-west-2.compute.internal",
                                            "ip-10-0-35-56.us-west-2.compute.internal"]
    # A new GPU node joins, and an inference pod is scheduled on it; its agent says hello.
    new = "ip-10-0-200-1.us-west-2.compute.internal"
    env["api"].seed_objects([
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": new, "labels": {"kubernetes.io/arch": "amd64"}},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "inference-new", "namespace": "ml",
                                                         "labels": {"app": "inference"}},
         "spec": {"nodeName": new, "containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}},
    ])
    env["sqs"].send_message(QueueUrl=env["status_url"], MessageBody=Hello(node=new, architecture="amd64")
                            .model_dump_json())
    stack.run_until_idle()
    assert [t.node for t in agents.take()] == [new]
    assert view_job(store, "ml", "inference-warm", now=0).desired == 3
    # The operator's delete only marks the job (the node queues' policy refuses the operator's sends) ...
    assert request_deletion(store, "ml", "inference-warm", now=2.0) == 3
    assert agents.take() == []
    # ... and dispatch_job, as its own role, sends the cancels when the job's record reaches it
    stack.run_until_idle()
    cancels = agents.take()
    assert len(cancels) == 3 and all(isinstance(c, CancelTask) for c in cancels)
    assert store.get_job("ml/inference-warm") is None


def test_wrong_event_wiring_in_the_template_fails_deploy(env: dict[str, Any], tmp_path: Path) -> None:
    broken = tmp_path / "template.yaml"
    text = TEMPLATE.read_text()
    assert "Queue: !GetAtt StatusQueue.Arn" in text
    broken.write_text(text.replace("Queue: !GetAtt StatusQueue.Arn", "Queue: !GetAtt StatusDLQ.Arn", 1)
                      .replace("Handler: app.lambda_handler", "Handler: app.handle", 1))
    with pytest.raises(WiringError, match="defines no function handle"):
        LocalStack(env["aws"].url, template_path=broken, stack_name="broken",
                   parameters={"ClusterName": "local"}).deploy()
    shutil.copy(TEMPLATE, broken)
    broken.write_text(text.replace("Stream: !GetAtt JobsTable.StreamArn", "Stream: !GetAtt JobsTable.Arn"))
    with pytest.raises(WiringError, match="is no table stream"):
        LocalStack(env["aws"].url, template_path=broken, stack_name="broken2",
                   parameters={"ClusterName": "local"}).deploy()


def test_status_event_source_gathers_batches_of_100_with_up_to_10_in_flight(
        env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 250 hellos on the status queue, and a handler that notes how many of its invocations overlap
    stack, sqs = env["stack"], env["sqs"]
    fn = stack.function("RecordStatusFunction")
    stack.invoke(fn.logical_id, {"Records": []})  # starts its environment
    real = invoking(stack, fn.logical_id)
    sizes: list[int] = []
    overlap = {"now": 0, "most": 0}
    lock = threading.Lock()

    def handler(event: dict[str, Any], context: Any) -> Any:
        with lock:
            sizes.append(len(event["Records"]))
            overlap["now"] += 1
            overlap["most"] = max(overlap["most"], overlap["now"])
        time.sleep(0.2)
        try:
            return real(event, context)
        finally:
            with lock:
                overlap["now"] -= 1

    names = [f"esm-node-{i:03d}" for i in range(250)]
    for start in range(0, len(names), 10):
        sqs.send_message_batch(QueueUrl=env["status_url"], Entries=[
            {"Id": str(i), "MessageBody": Hello(node=n, architecture="amd64").model_dump_json()}
            for i, n in enumerate(names[start:start + 10])])
    intercept(stack, fn.logical_id, handler, monkeypatch)
    # When the event source mapping pumps once
    handled = stack.pump_sqs()
    # Then it gathered batches of up to BatchSize (100) over several receives, ran them at once, and
    # every hello was registered and deleted from the queue
    assert handled == 250 and sorted(sizes) == [50, 100, 100]
    assert overlap["most"] == 3
    assert set(names) <= {n.name for n in env["store"].list_nodes()}
    attrs = sqs.get_queue_attributes(QueueUrl=env["status_url"], AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
