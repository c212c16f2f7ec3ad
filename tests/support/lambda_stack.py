"""A pytest plugin: `stack`, the functions' environment on moto in-process (no network).

One table and status queue as the template makes them, the shared package's bootstrap reset, a
`FakeCluster` in place of the Kubernetes API, and a Lambda context. Registered in `tests/conftest.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm import bootstrap
from prewarm_devtools.sam.events import LambdaContext
from prewarm_devtools.sam.template import create_table, load_template
from tests.support.aws import serial_mock_aws
from tests.support.cluster import FakeCluster

REGION = "us-east-1"


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """{"ddb", "sqs": clients, "cluster": the FakeCluster, "ctx": a LambdaContext}."""
    for k, v in {
        "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_TRACE_DISABLED": "1", "POWERTOOLS_METRICS_NAMESPACE": "Prewarm", "TABLE_NAME": "jobs",
        "NODE_QUEUE_PREFIX": "pw", "CLUSTER_NAME": "",
    }.items():
        monkeypatch.setenv(k, v)
    with serial_mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        create_table(ddb, load_template(), "jobs")
        status = sqs.create_queue(QueueName="status")["QueueUrl"]
        monkeypatch.setenv("STATUS_QUEUE_URL", status)
        bootstrap.reset()
        cluster = FakeCluster()
        monkeypatch.setattr(bootstrap, "own_cluster", lambda *_: cluster)
        context = LambdaContext("test", REGION, "123456789012", memory_mb=512, timeout_s=60)
        yield {"ddb": ddb, "sqs": sqs, "cluster": cluster, "ctx": context}
        monkeypatch.undo()
        bootstrap.reset()
