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


RBAC = "rbac.authorization.k8s.io"


def rule(
    resources: list[str], verbs: list[str], groups: tuple[str, ...] = ("",), names: list[str] | None = None
) -> dict[str, Any]:
    """A PolicyRule on resources of `groups` (the core group by default)."""
    found: dict[str, Any] = {"apiGroups": list(groups), "resources": resources, "verbs": verbs}
    if names:
        found["resourceNames"] = names
    return found


def role(name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> dict[str, Any]:
    """A Role in `namespace`, or a ClusterRole when there is none."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": metadata,
        "rules": rules,
    }


def binding(
    name: str, role_name: str, subjects: list[dict[str, Any]], namespace: str | None = None, role_kind: str = ""
) -> dict[str, Any]:
    """A RoleBinding in `namespace` (of a Role unless `role_kind` says ClusterRole), or a ClusterRoleBinding."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": RBAC, "kind": role_kind or ("Role" if namespace else "ClusterRole"), "name": role_name},
        "subjects": subjects,
    }


def subject(kind: str, name: str, namespace: str = "") -> dict[str, Any]:
    """A binding subject: `User`, `Group` or `ServiceAccount` (in `namespace`)."""
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiGroup": RBAC, "kind": kind, "name": name}
