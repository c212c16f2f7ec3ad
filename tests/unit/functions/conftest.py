"""Handlers fed the sample events of `events/`, against moto in-process (no network)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm import bootstrap
from prewarm_devtools.sam.events import LambdaContext
from prewarm_devtools.sam.template import ROOT, create_table, load_template
from tests.unit.services.conftest import FakeCluster

REGION = "us-east-1"
EVENTS = ROOT / "events"


def load_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def load_handler(function: str) -> ModuleType:
    path = ROOT / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"handler_under_test_{function}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    for k, v in {
        "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_TRACE_DISABLED": "1", "POWERTOOLS_METRICS_NAMESPACE": "Prewarm", "TABLE_NAME": "jobs",
        "NODE_QUEUE_PREFIX": "pw", "CLUSTER_NAME": "",
    }.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        create_table(ddb, load_template(), "jobs")
        status = sqs.create_queue(QueueName="status")["QueueUrl"]
        monkeypatch.setenv("STATUS_QUEUE_URL", status)
        bootstrap.reset()
        cluster = FakeCluster()
        monkeypatch.setattr(bootstrap, "cluster", lambda: cluster)
        monkeypatch.setattr(bootstrap, "cluster_or_none", lambda: cluster)
        context = LambdaContext("test", REGION, "123456789012", memory_mb=512, timeout_s=60)
        yield {"ddb": ddb, "sqs": sqs, "cluster": cluster, "ctx": context}
        monkeypatch.undo()
        bootstrap.reset()


def event_path(name: str) -> Path:
    return EVENTS / f"{name}.json"
