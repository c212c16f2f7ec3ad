"""ValidatingAdmissionPolicies enforced by the embedded API: the startup taint policy `prewarm install`
ships lets the agent's node-bound token remove the startup taint from its own node and nothing else,
as EKS (Kubernetes 1.30+) does; a policy that does not compile fails closed; `Warn` bindings warn."""

# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from prewarm_cli.install.render import base_documents
from prewarm_devtools.kubeapi import KubeApiServer, service_account
from tests.support.kube import call

pytestmark = pytest.mark.integration

WARMING = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
POLICY = "prewarm-agent-startup-taint"


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "gpu"}},
            "spec": {"taints": [dict(GPU), dict(WARMING)]}}


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    """What `prewarm install` ships (RBAC, the ConfigMap, the policy and its binding), two tainted nodes,
    and agent tokens bound to n1 and to no node."""
    with KubeApiServer() as server:
        server.seed_objects([d for d in base_documents() if d["kind"] != "DaemonSet"])
        server.seed_objects([node("n1"), node("n2")])
        server.add_identity("agent-n1", service_account("prewarm-system", "prewarm-agent", node="n1"))
        server.add_identity("agent-unbound", service_account("prewarm-system", "prewarm-agent"))
        yield server


def patch(api: KubeApiServer, token: str, name: str, ops: Any, content_type: str = JSON_PATCH) -> tuple[int, Any]:
    with api.api_client(token) as client:
        answer = call(client, "PATCH", f"/api/v1/nodes/{name}", body=ops, content_type=content_type)
    return answer.status, answer.body


def remove_warming(index: int = 1) -> list[dict[str, Any]]:
    return [{"op": "test", "path": f"/spec/taints/{index}", "value": WARMING},
            {"op": "remove", "path": f"/spec/taints/{index}"}]


def taints(api: KubeApiServer, name: str) -> list[dict[str, Any]]:
    obj = api.get_object("nodes", name)
    assert obj is not None
    return list(obj["spec"].get("taints") or [])


def denied(answer: tuple[int, Any], code: int = 403) -> str:
    status, body = answer
    assert status == code, body
    assert body["kind"] == "Status" and body["reason"] == ("Forbidden" if code == 403 else "Invalid")
    message: str = body["message"]
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: " in message, message
    return message


def test_the_agent_removes_the_startup_taint_from_its_own_node(api: KubeApiServer) -> None:
    status, body = patch(api, "agent-n1", "n1", remove_warming())

    assert status == 200, body
    assert taints(api, "n1") == [GPU]


def test_the_agent_may_not_touch_another_node_or_anything_else_on_its_own(api: KubeApiServer) -> None:
    # Another node's taint: refused, naming both nodes
    assert "the prewarm agent of node n1 may not change node n2" in denied(patch(api, "agent-n1", "n2",
                                                                                 remove_warming()))
    # Another taint of its own node, or adding one: refused
    other = [{"op": "remove", "path": "/spec/taints/0"}]
    assert "may only remove the startup taint prewarm.dev/warming:NoSchedule" in denied(
        patch(api, "agent-n1", "n1", other))
    added = [{"op": "add", "path": "/spec/taints/-", "value": {"key": "x", "effect": "NoExecute"}}]
    denied(patch(api, "agent-n1", "n1", added))
    # A label, or the spec besides the taint: refused
    assert "may not change a node's labels" in denied(
        patch(api, "agent-n1", "n1", {"metadata": {"labels": {"pool": "cpu"}}}, MERGE_PATCH))
    assert "may not change a node's spec other than removing the startup taint" in denied(
        patch(api, "agent-n1", "n1", {"spec": {"unschedulable": True}}, MERGE_PATCH))
    # A token bound to no node (a legacy Secret token) may not even remove the taint
    assert "must use a service account token bound to its node" in denied(
        patch(api, "agent-unbound", "n1", remove_warming()))
    # Nothing changed, and the admin is not bound by the policy
    assert taints(api, "n1") == [GPU, WARMING] and taints(api, "n2") == [GPU, WARMING]
    assert patch(api, api.token, "n2", [{"op": "remove", "path": "/spec/taints/0"}])[0] == 200


def test_the_policy_follows_the_taint_in_the_agents_configmap_and_denies_without_it(api: KubeApiServer) -> None:
    # Given the ConfigMap names another taint: removing prewarm.dev/warming is now refused
    config = api.get_object("configmaps", "prewarm-agent", "prewarm-system")
    assert config is not None
    changed = copy.deepcopy(config)
    changed["data"]["STARTUP_TAINT_KEY"] = "nvidia.com/gpu"
    with api.api_client() as client:
        assert call(client, "PUT", "/api/v1/namespaces/prewarm-system/configmaps/prewarm-agent",
                    body=changed).status == 200
    assert "may only remove the startup taint nvidia.com/gpu:NoSchedule" in denied(
        patch(api, "agent-n1", "n1", remove_warming()))
    assert patch(api, "agent-n1", "n1", [{"op": "remove", "path": "/spec/taints/0"}])[0] == 200
    # Without the ConfigMap (parameterNotFoundAction: Deny) every agent write is refused
    with api.api_client() as client:
        assert call(client, "DELETE", "/api/v1/namespaces/prewarm-system/configmaps/prewarm-agent").status == 200
    assert "no params found for policy binding" in denied(patch(api, "agent-n1", "n1", remove_warming(0)), 422)


def test_a_policy_that_does_not_compile_fails_closed_and_a_warn_binding_warns(api: KubeApiServer) -> None:
    # Given two policies on ConfigMaps in `default`: one whose CEL does not parse, bound to Deny; one
    # that refuses a label, bound to Warn only
    def policy(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
                    "validations": [{"expression": expression}]}}

    def binding(name: str, actions: list[str]) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": actions,
                                                     "matchResources": {"namespaceSelector": {"matchLabels": {
                                                         "kubernetes.io/metadata.name": "default"}}}}}

    with api.api_client() as client:
        for doc in (policy("warn-label", "!has(object.metadata.labels)"), binding("warn-label", ["Warn"])):
            kind = "validatingadmissionpolicies" if doc["kind"].endswith("Policy") else \
                "validatingadmissionpolicybindings"
            assert call(client, "POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", body=doc).status == 201

    # When a labelled ConfigMap is created in `default`: it is created, with the warning
    request = urllib.request.Request(
        f"{api.url}/api/v1/namespaces/default/configmaps", method="POST",
        data=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "labels": {"a": "b"}}}
                        ).encode(),
        headers={"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201
        warnings = answer.headers.get_all("Warning") or []
    assert any("Validation failed for ValidatingAdmissionPolicy 'warn-label' with binding 'warn-label': "
               "failed expression: !has(object.metadata.labels)" in w for w in warnings), warnings

    # And with a policy that does not compile bound to Deny, the next one is refused (failurePolicy: Fail)
    with api.api_client() as client:
        for doc in (policy("broken", "object.metadata.name ==="), binding("broken", ["Deny"])):
            kind = "validatingadmissionpolicies" if doc["kind"].endswith("Policy") else \
                "validatingadmissionpolicybindings"
            assert call(client, "POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", body=doc).status == 201
        refused = call(client, "POST", "/api/v1/namespaces/default/configmaps",
                       body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}})
    assert refused.status == 422, refused.body
    assert "ValidatingAdmissionPolicy 'broken' with binding 'broken' denied request: compilation failed" in \
        refused.body["message"]
