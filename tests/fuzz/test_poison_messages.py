"""Poison messages on the status queue, through template.yaml's real wiring on a moto server.

`record_status` reports each poison message as a batch item failure; the rest of its batch is applied
and deleted. It also makes the poison visible again at once (ChangeMessageVisibility to 0: it will
not parse later), so SQS hands it back until the queue's redrive policy moves it to StatusDLQ after
maxReceiveCount receives, in seconds rather than five visibility timeouts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import Hello, PullTask, StatusReport, parse_node_message
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.manifests import job_doc

pytestmark = pytest.mark.integration

NODES = ["ip-10-0-1-1.ec2.internal", "ip-10-0-1-2.ec2.internal"]
POISON = [
    "{not json",
    json.dumps({"v": 1, "kind": "status", "job": "default/warm", "phase": "Exploded"}),
    json.dumps({"v": 2, "kind": "hello", "node": NODES[0]}),
]


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/arch": "amd64"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture(scope="module")
def local() -> Iterator[dict[str, Any]]:
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_objects([node(n) for n in NODES])
        stack = LocalStack(aws.url, parameters={"ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        stack.prime_streams()
        env = stack.env()
        sqs = aws.client("sqs")
        queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=sqs)
        for name in NODES:
            queues.ensure_queue(name)  # as each node's agent does at start
        yield {"stack": stack, "sqs": sqs, "env": env, "queues": queues,
               "store": DynamoJobStore(env["TABLE_NAME"], client=aws.client("dynamodb"))}


def queued(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                        "ApproximateNumberOfMessagesNotVisible"])
    return sum(int(v) for v in attributes["Attributes"].values())


def test_poison_messages_end_in_the_dlq_after_max_receives_and_the_rest_of_the_batch_applies(
    local: dict[str, Any],
) -> None:
    stack, sqs, store, status_url = local["stack"], local["sqs"], local["store"], local["env"]["STATUS_QUEUE_URL"]
    dlq_url = stack.physical["StatusDLQ"].ref
    # Given a planned job, and one batch of the status queue holding three poison messages among a
    # success report for the job and a hello
    apply_manifest(store, job_doc(parallelism=2), now=1.0)
    stack.run_until_idle()
    task = parse_node_message(sqs.receive_message(QueueUrl=local["queues"].queue_url(NODES[0]),
                                                  WaitTimeSeconds=0)["Messages"][0]["Body"])
    assert isinstance(task, PullTask)
    report = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase="Succeeded",
                          seq=1)
    batch = [POISON[0], report.model_dump_json(), POISON[1], Hello(node="ip-10-0-9-9.ec2.internal").model_dump_json(),
             POISON[2]]
    sqs.send_message_batch(QueueUrl=status_url, Entries=[{"Id": str(i), "MessageBody": b}
                                                         for i, b in enumerate(batch)])
    # When record_status consumes the queue until it is empty
    deliveries = []
    while queued(sqs, status_url):
        deliveries.append(stack.pump_sqs())
        assert len(deliveries) <= 10, f"the poison never reached the DLQ: {deliveries}"
    # Then the good messages were applied once, and each poison message sits in the DLQ
    record = store.get_job("default/warm")
    assert record is not None and (record.counters.succeeded, record.counters.active) == (1, 1)
    assert [n.name for n in store.list_nodes()] == ["ip-10-0-9-9.ec2.internal"]
    dead = []
    while got := sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                     AttributeNames=["ApproximateReceiveCount"]).get("Messages", []):
        for m in got:
            dead.append(m["Body"])
            sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=m["ReceiptHandle"])
    assert sorted(dead) == sorted(POISON)
    # ...after the redrive policy's maxReceiveCount deliveries: with the good ones, then alone
    redrive = json.loads(sqs.get_queue_attributes(QueueUrl=status_url, AttributeNames=["RedrivePolicy"])
                         ["Attributes"]["RedrivePolicy"])
    assert deliveries == [len(batch)] + [len(POISON)] * (int(redrive["maxReceiveCount"]) - 1) + [0]
