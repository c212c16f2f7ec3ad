"""The startup taint's admission policy, evaluated offline: its CEL (with cel-python, a CEL
implementation of its own: Kubernetes' type checking and CEL libraries are not there, and the policy
uses neither) against the updates the agent makes and those it must not."""

from __future__ import annotations

import copy
import re
from typing import Any

import celpy
import kubernetes_validate
import pytest

from prewarm.domain.warming import parse_taint
from prewarm_agent.settings import TAINT_KEY_PATTERN
from prewarm_cli.install.render import base_documents

AGENT = "system:serviceaccount:prewarm-system:prewarm-agent"
NODE_NAME = "authentication.kubernetes.io/node-name"
WARMING = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def shipped(kind: str, name: str = "prewarm-agent-startup-taint") -> dict[str, Any]:
    (doc,) = [d for d in base_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def params(**data: str) -> dict[str, Any]:
    config = copy.deepcopy(next(d for d in base_documents() if d["kind"] == "ConfigMap"))
    config["data"].update(data)
    return config


def node(name: str = "ip-10-0-1-5", taints: list[dict[str, str]] | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"providerID": f"aws:///us-west-2a/i-{name}"}
    if taints:
        spec["taints"] = taints
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "gpu", **labels}},
            "spec": spec}


def admit(old: dict[str, Any], new: dict[str, Any], *, user: str = AGENT, bound: str | None = "ip-10-0-1-5",
          config: dict[str, Any] | None = None, groups: tuple[str, ...] = (),
          policy_name: str = "prewarm-agent-startup-taint") -> list[str]:
    """The messages of the policy's failed validations (empty: admitted), as the API server evaluates it."""
    policy = shipped("ValidatingAdmissionPolicy", policy_name)["spec"]
    env = celpy.Environment()
    extra = {NODE_NAME: [bound]} if bound is not None else {}
    activation: dict[str, Any] = {
        "object": new, "oldObject": old, "params": config or params(),
        "request": {"operation": "UPDATE", "userInfo": {"username": user, "groups": list(groups), "extra": extra}},
    }

    def evaluate(expression: str, variables: dict[str, Any]) -> Any:
        program = env.program(env.compile(expression))
        return program.evaluate({k: celpy.json_to_cel(v) for k, v in {**activation, "variables": variables}.items()})

    variables: dict[str, Any] = {}
    if not all(evaluate(c["expression"], variables) for c in policy["matchConditions"]):
        return []
    for variable in policy.get("variables", []):
        variables[variable["name"]] = evaluate(variable["expression"], variables)
    failed = []
    for validation in policy["validations"]:
        if not evaluate(validation["expression"], variables):
            failed.append(str(evaluate(validation["messageExpression"], variables)
                              if "messageExpression" in validation else validation["message"]))
    return failed


def without(node_: dict[str, Any], taint: dict[str, str]) -> dict[str, Any]:
    changed = copy.deepcopy(node_)
    changed["spec"]["taints"] = [t for t in changed["spec"]["taints"] if t != taint]
    if not changed["spec"]["taints"]:
        del changed["spec"]["taints"]
    return changed


def test_the_policy_and_its_binding_validate_for_the_kubernetes_api_and_read_the_agents_configmap() -> None:
    policy, binding = shipped("ValidatingAdmissionPolicy"), shipped("ValidatingAdmissionPolicyBinding")
    config = shipped("ConfigMap", "prewarm-agent")

    for doc in (policy, binding):
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"] == {"name": config["metadata"]["name"],
                                           "namespace": config["metadata"]["namespace"],
                                           "parameterNotFoundAction": "Deny"}
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}


def test_the_agent_may_remove_the_startup_taint_from_its_own_node() -> None:
    before = node(taints=[OTHER, WARMING])

    assert admit(before, without(before, WARMING)) == []
    assert admit(node(taints=[WARMING]), node()) == []
    # Nothing to remove is no change at all.
    assert admit(node(taints=[OTHER]), node(taints=[OTHER])) == []


def test_another_nodes_taint_or_an_unbound_token_is_refused() -> None:
    other = node("ip-10-0-9-9", taints=[WARMING])

    assert admit(other, without(other, WARMING)) == [
        "the prewarm agent of node ip-10-0-1-5 may not change node ip-10-0-9-9"]
    before = node(taints=[WARMING])
    assert admit(before, without(before, WARMING), bound=None) == [
        "the prewarm agent must use a service account token bound to its node"]


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda n: n["spec"].update(taints=[WARMING]), "may only remove the startup taint"),
    (lambda n: n["spec"].update(taints=[OTHER, WARMING, {**OTHER, "key": "new"}]), "may only remove the startup taint"),
    (lambda n: n["spec"].update(taints=[WARMING, OTHER]), "may only remove the startup taint"),
    (lambda n: n["metadata"]["labels"].update(pool="cpu"), "labels, annotations, finalizers"),
    (lambda n: n["metadata"].update(annotations={"a": "b"}), "labels, annotations, finalizers"),
    (lambda n: n["spec"].update(unschedulable=True), "spec other than removing the startup taint"),
    (lambda n: n["spec"].pop("providerID"), "spec other than removing the startup taint"),
], ids=["other taint removed", "taint added", "reordered", "label", "annotation", "cordon", "provider id"])
def test_any_other_change_by_the_agent_is_refused(change: Any, refusal: str) -> None:
    before = node(taints=[OTHER, WARMING])
    after = copy.deepcopy(before)
    change(after)

    (message,) = admit(before, after)

    assert refusal in message


def test_the_taint_comes_from_the_agents_settings_and_others_are_not_judged() -> None:
    custom = {"key": "example.com/cold", "value": "", "effect": "NoExecute"}
    before = node(taints=[WARMING, custom])
    config = params(STARTUP_TAINT_KEY="example.com/cold", STARTUP_TAINT_EFFECT="NoExecute")

    assert admit(before, without(before, custom), config=config) == []
    assert admit(before, without(before, WARMING), config=config) != []
    assert admit(before, node(), user="system:node:ip-10-0-1-5") == []


def test_a_readiness_k8s_io_startup_taint_is_the_agents_to_remove_when_its_settings_name_it() -> None:
    # The Node Readiness Controller's prefix (docs/operations.md): Karpenter takes such a taint as temporary
    readiness = {"key": "readiness.k8s.io/prewarm.dev-warm", "value": "pending", "effect": "NoSchedule"}
    before = node(taints=[OTHER, readiness])
    config = params(STARTUP_TAINT_KEY=readiness["key"])

    assert admit(before, without(before, readiness), config=config) == []
    assert admit(before, without(before, OTHER), config=config) != []
    assert parse_taint("readiness.k8s.io/prewarm.dev-warm=pending:NoSchedule").key == readiness["key"]
    assert re.fullmatch(TAINT_KEY_PATTERN, readiness["key"])


# --- the PrewarmWarm condition: record_status (group prewarm-node-warm) on the status subresource -------

CONTROL_PLANE = "arn:aws:sts::111122223333:assumed-role/prewarm-RecordStatusRole/record_status"


def with_status(*conditions: dict[str, str], **fields: Any) -> dict[str, Any]:
    shown = node(taints=[WARMING])
    shown["status"] = {"conditions": [{"type": "Ready", "status": "True"}, *conditions],
                       "capacity": {"cpu": "8"}, **fields}
    return shown


def admit_status(old: dict[str, Any], new: dict[str, Any], groups: tuple[str, ...] = ("prewarm-node-warm",)
                 ) -> list[str]:
    return admit(old, new, user=CONTROL_PLANE, bound=None, groups=groups, policy_name="prewarm-node-warm-condition")


def test_record_status_may_set_the_prewarm_warm_condition_and_nothing_else() -> None:
    pulling = {"type": "PrewarmWarm", "status": "False", "reason": "Pulling"}
    warm = {"type": "PrewarmWarm", "status": "True", "reason": "ImagesPresentAtBoot"}
    before = with_status()

    assert admit_status(before, with_status(warm)) == []
    assert admit_status(with_status(pulling), with_status(warm)) == []
    assert admit_status(before, with_status({"type": "Ready", "status": "False"})) == [
        "Prewarm may set only the PrewarmWarm condition of a node"]
    assert admit_status(before, with_status(warm, capacity={"cpu": "64"})) == [
        "Prewarm may not change a node's status other than its PrewarmWarm condition"]
    relabelled = with_status(warm)
    relabelled["metadata"]["labels"]["prewarm.dev/warm"] = "true"
    assert admit_status(before, relabelled) == [
        "Prewarm may not change a node's labels or annotations through its status"]
    # Others (the kubelet) are not judged
    assert admit_status(before, with_status({"type": "Ready", "status": "False"}), groups=("system:nodes",)) == []


def test_the_condition_policy_validates_for_the_kubernetes_api() -> None:
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(shipped(kind, "prewarm-node-warm-condition"), "1.33.0", strict=True)


# --- a rule's node label: record_status (groups prewarm-node-warm and prewarm-startup-taint) on the Node ----

RECORD_STATUS_GROUPS = ("prewarm-control-plane", "prewarm-startup-taint", "prewarm-node-warm")
LABEL = "prewarm.dev/torch"


def labelled(node_: dict[str, Any], **labels: str | None) -> dict[str, Any]:
    changed = copy.deepcopy(node_)
    for key, value in labels.items():
        if value is None:
            changed["metadata"]["labels"].pop(key.replace("__", "/"), None)
        else:
            changed["metadata"]["labels"][key.replace("__", "/")] = value
    return changed


def admit_node(old: dict[str, Any], new: dict[str, Any], groups: tuple[str, ...] = RECORD_STATUS_GROUPS
               ) -> list[str]:
    """Both policies that judge record_status's update of a Node: the startup taint's and the labels'."""
    return [*admit(old, new, user=CONTROL_PLANE, bound=None, groups=groups),
            *admit(old, new, user=CONTROL_PLANE, bound=None, groups=groups, policy_name="prewarm-node-warm-labels")]


def test_record_status_may_set_and_remove_a_rules_node_label_and_release_the_taint_in_the_same_role() -> None:
    before = node(taints=[OTHER, WARMING])

    assert admit_node(before, labelled(before, prewarm__dev__torch="true")) == []
    assert admit_node(labelled(before, prewarm__dev__torch="true"), before) == []
    assert admit_node(before, without(before, WARMING)) == []
    # the agent may still change no label
    assert admit(before, labelled(before, prewarm__dev__torch="true")) == [
        "the prewarm agent may not change a node's labels, annotations, finalizers or owner references"]


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda n: n["metadata"]["labels"].update(pool="cpu"), 'only set or remove node labels valued "true"'),
    (lambda n: n["metadata"]["labels"].pop("pool"), 'only set or remove node labels valued "true"'),
    (lambda n: n["metadata"]["labels"].update({LABEL: "yes"}), 'only set or remove node labels valued "true"'),
    (lambda n: n["metadata"].update(annotations={"a": "b"}), "annotations, finalizers or owner references"),
], ids=["label changed", "label removed", "label of another value", "annotation"])
def test_record_status_may_change_no_other_label_or_metadata(change: Any, refusal: str) -> None:
    before = node(taints=[WARMING])
    after = copy.deepcopy(before)
    change(after)

    assert any(refusal in message for message in admit_node(before, after)), admit_node(before, after)


def test_the_label_group_alone_may_not_change_a_nodes_spec() -> None:
    before = node(taints=[WARMING])
    assert admit(before, without(before, WARMING), user=CONTROL_PLANE, bound=None, groups=("prewarm-node-warm",),
                 policy_name="prewarm-node-warm-labels") == ["Prewarm may not change a node's spec"]


def test_the_label_policy_validates_for_the_kubernetes_api() -> None:
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(shipped(kind, "prewarm-node-warm-labels"), "1.33.0", strict=True)
