"""`AgentHarness`: one real agent in this process, against moto's SQS and a private containerd, with
the test sending it tasks and reading what it reports."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import CancelTask, Hello, PullTask, StatusReport, node_queue_name, parse_agent_message
from prewarm_agent.agent import Agent
from prewarm_agent.node import NodeFacts, local_architecture
from prewarm_agent.settings import AgentSettings
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.sam.aws import MotoServer

QUEUE_PREFIX = "prewarm-agent-it"
FINAL_PHASES = ("Succeeded", "Failed", "Cancelled")


class AgentHarness:
    """One agent for one node, with its own status queue; sends it tasks and collects its reports."""

    def __init__(self, aws: MotoServer, containerd: PrivateContainerd, env: dict[str, str], node: str = "",
                 collaborators: Mapping[str, Any] | None = None) -> None:
        self.aws = aws
        self.sqs = aws.client("sqs")
        suffix = uuid.uuid4().hex[:10]
        self.node = node or f"ip-10-0-{suffix}.ec2.internal"
        self.status_url = self.sqs.create_queue(QueueName=f"status-{suffix}")["QueueUrl"]
        dlq_url = self.sqs.create_queue(QueueName=f"dlq-{suffix}")["QueueUrl"]
        self.dlq_url = dlq_url
        dlq_arn = self.sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.dlq_arn = dlq_arn
        self.environment = {
            "NODE_NAME": self.node,
            "NODE_QUEUE_PREFIX": QUEUE_PREFIX,
            "STATUS_QUEUE_URL": self.status_url,
            "NODE_DLQ_ARN": dlq_arn,
            "AWS_REGION": aws.region,
            "AWS_ENDPOINT_URL": aws.url,
            "CRI_SOCKET": str(containerd.socket_path),
            "REGISTRY_CONFIG_PATH": str(containerd.certs_dir),
            "RECEIVE_WAIT_SECONDS": "1",
            "PROGRESS_INTERVAL_SECONDS": "0.5",
            "HTTP_BIND_ADDRESS": "127.0.0.1",
            "HTTP_PORT": "0",
            "SHUTDOWN_GRACE_SECONDS": "2",
            **env,
        }
        self.settings = AgentSettings.from_env(self.environment)
        # Without a Kubernetes API the hello says what this machine is, without a warning per test.
        facts = None if "KUBE_API_ENDPOINT" in env else (
            lambda: NodeFacts(name=self.node, architecture=local_architecture())
        )
        options: dict[str, Any] = {"node": facts, **(collaborators or {})}
        self.agent = Agent(self.settings, **options)
        self.messages: list[StatusReport | Hello] = []
        self._jobs = 0

    @property
    def queue_url(self) -> str:
        """The node queue (made before the agent starts, as the control plane makes it on its hello)."""
        name = node_queue_name(QUEUE_PREFIX, self.node)
        return str(self.sqs.get_queue_url(QueueName=name)["QueueUrl"])

    def make_queue(self) -> str:
        """The node's queue, made as the control plane makes it on the agent's hello (nothing reads the
        hellos here), for an agent that waits for it."""
        return NodeQueues(QUEUE_PREFIX, self.status_url, dlq_arn=self.dlq_arn, client=self.sqs).ensure_queue(self.node)

    def start(self) -> AgentHarness:
        self.make_queue()
        self.agent.start()
        return self

    def stop(self, grace: float = 0.0) -> None:
        self.agent.stop(grace)

    def task(self, image: str, **fields: Any) -> PullTask:
        self._jobs += 1
        values = {"job": f"default/job-{self._jobs}", "job_uid": uuid.uuid4().hex, "round": 0, "node": self.node,
                  "image": image, "timeout_seconds": 60, "backoff_limit": 0, **fields}
        return PullTask.model_validate(values)

    def send(self, message: PullTask | CancelTask | str) -> None:
        body = message if isinstance(message, str) else message.model_dump_json()
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body)

    def cancel(self, task: PullTask, reason: str = "job deleted") -> None:
        self.send(CancelTask(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, reason=reason))

    def collect(self) -> None:
        """Move every message of the status queue into `messages`."""
        while True:
            answer = self.sqs.receive_message(QueueUrl=self.status_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            batch = answer.get("Messages") or []
            if not batch:
                return
            for message in batch:
                self.messages.append(parse_agent_message(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.status_url, ReceiptHandle=message["ReceiptHandle"])

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the in-process agent's metrics (`prewarm_agent_pull_calls_total`, ...)."""
        return self.agent.metrics.sample(name, labels)

    def reports(self, task: PullTask) -> list[StatusReport]:
        self.collect()
        return sorted(
            (m for m in self.messages if isinstance(m, StatusReport) and m.job_uid == task.job_uid),
            key=lambda report: report.seq,
        )

    def hellos(self) -> list[Hello]:
        self.collect()
        return [m for m in self.messages if isinstance(m, Hello)]

    def wait_for(self, task: PullTask, condition: Callable[[list[StatusReport]], bool], timeout: float
                 ) -> list[StatusReport]:
        deadline = time.monotonic() + timeout
        while True:
            reports = self.reports(task)
            if condition(reports):
                return reports
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s; reports: {_show(reports)}")
            time.sleep(0.1)

    def final(self, task: PullTask, timeout: float = 60) -> StatusReport:
        """The task's final report, waiting for it."""
        reports = self.wait_for(task, lambda rs: any(r.phase in FINAL_PHASES for r in rs), timeout)
        return next(r for r in reports if r.phase in FINAL_PHASES)

    def queue_depth(self, url: str | None = None) -> tuple[int, int]:
        """(visible, in flight) messages of the node queue (or `url`)."""
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])


def _show(reports: list[StatusReport]) -> str:
    return json.dumps([r.model_dump(exclude_none=True) for r in reports], indent=1)
