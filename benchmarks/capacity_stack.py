"""capacity.py's stack: moto in this process, the template's table and queues, and the real `record_status`
handler run batch by batch with its calls recorded (`Stack`); what template.yaml says of the function and
its event source (`FunctionConfig`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.capacity_calls import CallTrace, Invocation, RecordingCluster
from benchmarks.fleet_moto import REGION


@dataclass(frozen=True)
class FunctionConfig:
    """What template.yaml says about record_status and its event source."""

    memory_mb: int
    timeout_s: float
    batch_size: int
    window_s: float
    concurrency: int
    visibility_s: float
    max_receives: int

    @classmethod
    def from_template(cls) -> FunctionConfig:
        from prewarm_devtools.sam.template import load_template, resource

        template = load_template()
        fn = resource(template, "RecordStatusFunction", "AWS::Serverless::Function")
        defaults = template.get("Globals", {}).get("Function", {})
        source = fn["Events"]["StatusReports"]["Properties"]
        queue = resource(template, "StatusQueue", "AWS::SQS::Queue")
        parameters = template.get("Parameters", {})

        def value(given: Any) -> Any:
            """A setting, or the default of the parameter it names (`!Ref StatusConcurrency`)."""
            return parameters[given["Ref"]]["Default"] if isinstance(given, dict) and "Ref" in given else given

        return cls(
            memory_mb=int(fn.get("MemorySize", defaults.get("MemorySize", 128))),
            timeout_s=float(fn.get("Timeout", defaults.get("Timeout", 3))),
            batch_size=int(value(source.get("BatchSize", 10))),
            window_s=float(source.get("MaximumBatchingWindowInSeconds", 0)),
            concurrency=int(value(source.get("ScalingConfig", {}).get("MaximumConcurrency", 1000))),
            visibility_s=float(queue.get("VisibilityTimeout", 30)),
            max_receives=int(queue["RedrivePolicy"]["maxReceiveCount"]),
        )


class Stack:
    """moto in-process with the template's table, a status queue and the node DLQ; `invoke` runs
    record_status's handler on a batch of bodies and returns the recorded invocation."""

    def __init__(self, cluster: Any | None = None) -> None:
        self.trace = CallTrace()
        self._cluster = cluster

    def __enter__(self) -> Stack:
        import boto3

        from tests.support.aws import serial_mock_aws

        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            os.environ.pop(name, None)
        os.environ.update(AWS_DEFAULT_REGION=REGION, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_EC2_METADATA_DISABLED="true", POWERTOOLS_LOG_LEVEL="WARNING",
                          POWERTOOLS_METRICS_DISABLED="true", POWERTOOLS_METRICS_NAMESPACE="Prewarm",
                          POWERTOOLS_TRACE_DISABLED="true")
        from prewarm_devtools import aws_limits

        # The limits layer's tables: a transaction saves the items it touches, where moto deep-copies the
        # whole table (seconds a transaction at 20,000 node items); its quotas stay out of the way here.
        self._limits = aws_limits.limits()
        self._limits.__enter__()
        self._mock = serial_mock_aws()
        self._mock.__enter__()
        self._serving = self.trace.serving()
        self._serving.__enter__()
        from prewarm_devtools.sam.template import create_table, load_template

        ddb = boto3.client("dynamodb", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        create_table(ddb, load_template(), "jobs")
        status = sqs.create_queue(QueueName="prewarm-status")["QueueUrl"]
        dlq = sqs.create_queue(QueueName="prewarm-node-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        os.environ.update(TABLE_NAME="jobs", STATUS_QUEUE_URL=status, NODE_QUEUE_PREFIX="pw", NODE_DLQ_ARN=dlq_arn)
        from prewarm import bootstrap
        from prewarm.settings import settings
        from tests.support.handlers import load_handler

        settings.cache_clear()
        bootstrap.store.cache_clear()
        bootstrap.node_queues.cache_clear()
        bootstrap.queues.cache_clear()
        self.store, self.queues = bootstrap.store(), bootstrap.node_queues()
        self.trace.attach(self.store.client)
        self.trace.attach(self.queues.client)
        if self._cluster is not None:
            self.cluster = RecordingCluster(self._cluster, self.trace)
            bootstrap.own_cluster = lambda *_: self.cluster  # type: ignore[assignment, return-value]
            bootstrap.clusters.cache_clear()
        self.handler = load_handler("record_status").lambda_handler
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(None, None, None)
        self._mock.__exit__(None, None, None)
        self._limits.__exit__(None, None, None)

    def invoke(self, bodies: Sequence[str], config: FunctionConfig) -> tuple[Invocation, set[int]]:
        """One invocation on `bodies`: what it did, and the indexes of the items it returned."""
        from prewarm_devtools.sam.events import LambdaContext

        event = {"Records": [{"messageId": str(i), "receiptHandle": str(i), "body": b, "attributes": {},
                              "eventSource": "aws:sqs"} for i, b in enumerate(bodies)]}
        context = LambdaContext("record_status", REGION, "123456789012", config.memory_mb, int(config.timeout_s))
        with self.trace.invocation() as inv:
            out = self.handler(event, context)
        return inv, {int(f["itemIdentifier"]) for f in out["batchItemFailures"]}
