"""Requests to a Kubernetes API server (the embedded one) through the official client, and the objects
they send."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, ApiException

#: The small EKS cluster of `samplefiles/`, as local mode seeds it.
SAMPLE_CLUSTER = Path(__file__).resolve().parents[2] / "samplefiles" / "cluster.yaml"


@dataclass
class Answer:
    status: int
    body: Any


def call(
    client: ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str | None = None,
    authenticate: bool = True,
) -> Answer:
    """One request through `ApiClient.param_serialize` and `call_api`, as the generated API does."""
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    method, url, headers, body, post = client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"] if authenticate else [],
    )
    response = client.call_api(method, url, headers, body, post)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data.decode()
    return Answer(response.status, parsed)


def status_of(error: ApiException) -> dict[str, Any]:
    """The `Status` body of a failed typed call."""
    assert error.body, f"ApiException {error.status} without a body"
    body: dict[str, Any] = json.loads(error.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == error.status
    return body


def node(name: str, labels: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
    if unschedulable:
        obj["spec"] = {"unschedulable": True}
    return obj


def pod(name: str, namespace: str, node_name: str | None = None, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "registry.example/app:1.0"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name.split("-")[0]}},
        "spec": spec,
        "status": {"phase": phase},
    }
