"""The control plane's use cases against moto in-process (no network) and an in-memory cluster."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import parse_node_message
from prewarm_devtools.sam.template import create_table, load_template

REGION = "us-west-2"


def make_node(name: str, *, arch: str = "amd64", ready: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", **labels}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def make_pod(name: str, namespace: str, node: str | None, phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


@dataclass
class FakeCluster:
    """The `Cluster` port over plain dicts. Returns every node: the domain re-checks selectors."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def list_nodes(self, label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        return list(self.nodes)

    def get_node(self, name: str) -> dict[str, Any] | None:
        return next((n for n in self.nodes if n["metadata"]["name"] == name), None)

    def list_pods(self, namespace: str | None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.pods if namespace is None or p["metadata"]["namespace"] == namespace]

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get((namespace, name))


@dataclass
class ControlPlane:
    store: DynamoJobStore
    queues: NodeQueues
    sqs: Any
    cluster: FakeCluster
    clock: Iterator[float]

    def now(self) -> float:
        return next(self.clock)

    def drain(self, node: str) -> list[Any]:
        """Every message waiting on the node's queue, parsed (and deleted)."""
        url = self.queues.queue_url(node)
        out = []
        while True:
            try:
                got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            except self.sqs.exceptions.QueueDoesNotExist:
                return out
            msgs = got.get("Messages", [])
            if not msgs:
                return out
            for m in msgs:
                out.append(parse_node_message(m["Body"]))
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    with mock_aws():
        yield


@pytest.fixture
def plane(aws: None) -> ControlPlane:
    ddb = boto3.client("dynamodb", region_name=REGION)
    sqs = boto3.client("sqs", region_name=REGION)
    create_table(ddb, load_template(), "jobs")
    status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
    dlq = sqs.create_queue(QueueName="prewarm-nodes-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return ControlPlane(
        store=DynamoJobStore("jobs", client=ddb),
        queues=NodeQueues("pw", status, dlq_arn=dlq_arn, client=sqs),
        sqs=sqs,
        cluster=FakeCluster(),
        clock=itertools.count(1_800_000_000, 1),
    )
