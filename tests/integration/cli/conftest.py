"""One local stack (template.yaml on a moto server) for the CLI tests, its state file, and the CLI run against it.

The tests play the control plane's other parts themselves: `plan_job` with a small fake cluster
stands in for the dispatch function, and `record_report` for the agents' reports.
"""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import CancelTask, PullTask, StatusReport, parse_node_message
from prewarm.services.dispatch import PlanResult, plan_job
from prewarm.services.jobs import job_key
from prewarm.services.reports import ReportOutcome, record_report
from prewarm_cli.app import cli
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.sam.aws import MotoServer
from prewarm_devtools.sam.stack import LocalStack

NODES = ("node-a", "node-b", "node-c")


def job_yaml(name: str, *, nodes: tuple[str, ...] = NODES, parallelism: int = 3, image: str = "nginx:1.25",
             completion: str = "Always", namespace: str = "default") -> str:
    """An ImagePullJob on named nodes, as people write it."""
    names = ", ".join(nodes)
    return textwrap.dedent(f"""\
        apiVersion: apps.kruise.io/v1alpha1
        kind: ImagePullJob
        metadata:
          name: {name}
          namespace: {namespace}
        spec:
          image: {image}
          parallelism: {parallelism}
          selector:
            names: [{names}]
          completionPolicy:
            type: {completion}
        """)


class FakeCluster:
    """The `Cluster` port with a few Ready linux/amd64 nodes."""

    def __init__(self, names: tuple[str, ...] = NODES) -> None:
        self.nodes = {
            name: {
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "general"}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
                },
            }
            for name in names
        }

    def list_nodes(self, label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        return list(self.nodes.values())

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def list_pods(self, namespace: str | None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        return []

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


@dataclass
class ControlPlane:
    """The stack's table and queues, driven as dispatch and the agents would."""

    store: DynamoJobStore
    queues: NodeQueues
    sqs: Any
    cluster: FakeCluster = field(default_factory=FakeCluster)
    _seq: int = 0

    def plan(self, name: str, namespace: str = "default") -> PlanResult:
        return plan_job(self.store, self.cluster, self.queues, job_key(namespace, name), now=time.time())

    def report(self, name: str, node: str, phase: str, namespace: str = "default", **fields: Any) -> ReportOutcome:
        record = self.store.get_job(job_key(namespace, name))
        assert record is not None, f"no job {namespace}/{name}"
        self._seq += 1
        report = StatusReport(job=record.key, job_uid=record.uid, round=record.round, node=node, phase=phase,
                              attempt=fields.pop("attempt", 1), seq=self._seq, **fields)
        return record_report(self.store, self.queues, report, now=time.time())

    def node_messages(self, node: str) -> list[PullTask | CancelTask]:
        """Takes every message off a node's queue (none when the queue was never created)."""
        url = self.queues.queue_url(node)
        got: list[PullTask | CancelTask] = []
        while True:
            try:
                # Node queues long-poll by default: ask for what is there now.
                batch = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=0).get("Messages", [])
            except self.sqs.exceptions.QueueDoesNotExist:
                return got
            if not batch:
                return got
            for message in batch:
                got.append(parse_node_message(message["Body"]))
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture(scope="package")
def local_stack() -> Iterator[LocalStack]:
    # moto keeps its backends per process, not per server: a stack name of its own keeps this stack's
    # table and queues apart from other tests' stacks.
    with MotoServer() as server:
        yield LocalStack(server.url, parameters={"ClusterName": "local"},
                         stack_name=f"prewarm-cli-{uuid.uuid4().hex[:8]}").deploy()


@pytest.fixture(scope="package")
def state_file(local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prewarm-home") / "local.json"
    return write_local_state(LocalState.of_stack(local_stack, pid=os.getpid()), path)


@pytest.fixture(scope="package")
def control_plane(local_stack: LocalStack) -> ControlPlane:
    env = local_stack.env()
    sqs = local_stack.sqs
    return ControlPlane(
        store=DynamoJobStore(env["TABLE_NAME"], client=local_stack.dynamodb),
        queues=NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], dlq_arn=env["NODE_DLQ_ARN"], client=sqs),
        sqs=sqs,
    )


@pytest.fixture
def cli_env(state_file: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a CLI run: the local state file, and no other target configured."""
    monkeypatch.setenv(STATE_ENV, str(state_file))
    for name in (ENDPOINT_ENV, STACK_ENV, "PREWARM_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return {STATE_ENV: str(state_file)}


Run = Callable[..., Result]


@pytest.fixture
def prewarm(cli_env: dict[str, str]) -> Run:
    """Runs `prewarm --local ARGS...` in-process; stdout and stderr are kept apart."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli, ["--local", *args], input=input, catch_exceptions=False)

    return run

