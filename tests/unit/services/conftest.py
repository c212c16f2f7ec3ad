"""The control plane's use cases against moto in-process (no network) and an in-memory cluster."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm_devtools.sam.template import create_table, load_template
from tests.support.aws import mocked_aws
from tests.support.clock import Clock
from tests.support.cluster import FakeCluster
from tests.support.control_plane import ControlPlane

REGION = "us-west-2"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with mocked_aws(monkeypatch, REGION):
        yield


@pytest.fixture
def plane(aws: None) -> ControlPlane:
    """A table and queues of their own; every call's time is a second after the last one's."""
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
        clock=Clock(1_800_000_000, tick=1),
    )
