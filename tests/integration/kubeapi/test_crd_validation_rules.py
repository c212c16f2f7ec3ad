"""A custom resource's `x-kubernetes-validations` (CEL) and list types, and its schema defaults, as the
embedded API applies them over HTTP: messages as Kubernetes 1.33 words them, transition rules, defaults
stored on create and update and filled in on reads."""

# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, ApiException, ApiextensionsV1Api, CustomObjectsApi

from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kube import status_of
from tests.support.kubectl import kubectl_on

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "example.dev", "v1", "widgets"


def rule(expression: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"rule": expression, **({"message": message} if message else {}), **extra}


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer", "x-kubernetes-validations": [rule("self <= 10", "at most 10")]},
                "name": {"type": "string",
                         "x-kubernetes-validations": [rule("self == oldSelf", "name is immutable")]},
                "mode": {"type": "string", "default": "Fast"},
                "low": {"type": "integer"},
                "high": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "required": ["name"],
                              "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                              "x-kubernetes-validations": [rule("self.port == oldSelf.port", "port is fixed")]},
                },
                "plain": {"type": "array", "items": {
                    "type": "object", "properties": {"v": {"type": "integer"}},
                    "x-kubernetes-validations": [rule("self.v == oldSelf.v", "never correlated")]}},
                "options": {"type": "object", "default": {}, "properties": {
                    "retries": {"type": "integer", "default": 3}}},
                "kind": {"type": "string", "enum": ["A", "B"]},
            },
            "x-kubernetes-validations": [
                rule("!has(self.low) || !has(self.high) || self.low <= self.high", fieldPath=".low",
                     messageExpression="'low (' + string(self.low) + ') must not exceed high (' + "
                                       "string(self.high) + ')'"),
                rule("!has(self.kind) || self.kind != 'B' || has(self.size)", "B needs a size",
                     reason="FieldValueRequired", fieldPath=".size"),
                rule("!has(self.mode) || self.mode != 'Forbidden'", "this mode is forbidden",
                     reason="FieldValueForbidden", fieldPath=".mode"),
                rule("!has(self.size) || self.size != 7"),
                rule("!has(self.high) || self.high / (self.high - 5) >= -100"),
            ],
        },
    },
}


def definition(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced", "names": {"kind": "Widget", "plural": PLURAL},
                 "versions": [{"name": VERSION, "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema}}]},
    }


@pytest.fixture
def widgets(kube_client: ApiClient) -> CustomObjectsApi:
    ApiextensionsV1Api(kube_client).create_custom_resource_definition(definition(SCHEMA))
    return CustomObjectsApi(kube_client)


def widget(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


def create(objects: CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    return objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def refusal(call: Any, *args: Any) -> tuple[int, str, list[dict[str, Any]]]:
    with pytest.raises(ApiException) as raised:
        call(*args)
    status = status_of(raised.value)
    return raised.value.status, status["message"], status["details"].get("causes", [])


def test_a_false_rule_is_refused_naming_the_field_with_its_message(widgets: CustomObjectsApi) -> None:
    code, message, causes = refusal(create, widgets, widget(size=11))
    assert code == 422
    assert message == 'Widget.example.dev "w" is invalid: spec.size: Invalid value: "integer": at most 10'
    assert causes == [{"reason": "FieldValueInvalid", "message": 'Invalid value: "integer": at most 10',
                       "field": "spec.size"}]


def test_message_expression_field_path_and_reason_shape_the_error(widgets: CustomObjectsApi) -> None:
    _, message, _ = refusal(create, widgets, widget(low=9, high=3))
    assert message == ('Widget.example.dev "w" is invalid: spec.low: Invalid value: "object": low (9) must not exceed '
                       "high (3)")
    _, message, causes = refusal(create, widgets, widget(kind="B"))
    assert message == 'Widget.example.dev "w" is invalid: spec.size: Required value: B needs a size'
    assert causes[0]["reason"] == "FieldValueRequired"
    _, message, _ = refusal(create, widgets, widget(mode="Forbidden"))
    assert message == 'Widget.example.dev "w" is invalid: spec.mode: Forbidden: this mode is forbidden'


def test_a_rule_without_a_message_says_the_rule_and_one_that_fails_to_evaluate_says_why(
    widgets: CustomObjectsApi,
) -> None:
    _, message, _ = refusal(create, widgets, widget(size=7))
    assert message == ('Widget.example.dev "w" is invalid: spec: Invalid value: "object": failed rule: '
                       "!has(self.size) || self.size != 7")
    _, message, _ = refusal(create, widgets, widget(high=5))
    assert message == ('Widget.example.dev "w" is invalid: spec: Invalid value: "object": division by zero '
                       "evaluating rule: !has(self.high) || self.high / (self.high - 5) >= -100")


def test_rules_wait_for_the_schema_errors_that_block_them(widgets: CustomObjectsApi) -> None:
    # An enum error is a blocking one: the rules are not run, and the answer says so.
    _, message, _ = refusal(create, widgets, widget(kind="C", size=11))
    assert message == (
        'Widget.example.dev "w" is invalid: [spec.kind: Unsupported value: "C": supported values: "A", "B", '
        '<nil>: Invalid value: "null": some validation rules were not checked because the object was invalid; '
        "correct the existing errors to complete validation]"
    )


def test_a_set_refuses_duplicates(widgets: CustomObjectsApi) -> None:
    _, message, _ = refusal(create, widgets, widget(tags=["a", "b", "a"]))
    assert message == 'Widget.example.dev "w" is invalid: spec.tags[2]: Duplicate value: "a"'


def test_transition_rules_compare_with_the_stored_value_on_update_only(widgets: CustomObjectsApi) -> None:
    created = create(widgets, widget(name="first", ports=[{"name": "http", "port": 80}], plain=[{"v": 1}]))
    changed = copy.deepcopy(created)
    changed["spec"]["name"] = "second"
    _, message, _ = refusal(widgets.replace_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "w", changed)
    assert message == 'Widget.example.dev "w" is invalid: spec.name: Invalid value: "string": name is immutable'
    # Items of a map list correlate by their keys: a new item has no old self, a kept one does
    moved = copy.deepcopy(created)
    moved["spec"]["ports"] = [{"name": "http", "port": 8080}]
    _, message, _ = refusal(widgets.replace_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "w", moved)
    assert message == 'Widget.example.dev "w" is invalid: spec.ports[0]: Invalid value: "object": port is fixed'
    added = copy.deepcopy(created)
    added["spec"]["ports"] = [{"name": "http", "port": 80}, {"name": "https", "port": 443}]
    # Items of other lists never correlate, so their transition rules never run
    added["spec"]["plain"] = [{"v": 2}]
    updated = widgets.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w", added)
    assert updated["spec"]["ports"][1] == {"name": "https", "port": 443}


def test_defaults_are_stored_on_create_and_filled_in_when_read(kube_api: KubeApiServer, kube_client: ApiClient,
                                                               widgets: CustomObjectsApi) -> None:
    created = create(widgets, widget(size=1))
    assert created["spec"] == {"size": 1, "mode": "Fast", "options": {"retries": 3}}
    # When the CRD gains a default after an object was stored
    extensions = ApiextensionsV1Api(kube_client)
    crd = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}").to_dict()
    schema = definition(SCHEMA)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"]["properties"]["colour"] = {"type": "string", "default": "blue"}
    extensions.patch_custom_resource_definition(
        f"{PLURAL}.{GROUP}", {"spec": {"versions": [{**definition(schema)["spec"]["versions"][0]}]}})
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    # Then every read shows it, as the API server's decoder fills defaults in, though storage lacks it
    read = widgets.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    assert read["spec"]["colour"] == "blue"
    listed = widgets.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert listed["items"][0]["spec"]["colour"] == "blue"
    assert "colour" not in kube_api.registry.store.get(f"{PLURAL}.{GROUP}", "default/w").obj["spec"]


def test_deleting_an_object_held_by_a_finalizer_bumps_its_generation(widgets: CustomObjectsApi) -> None:
    # Given an object with a finalizer, at generation 1
    body = widget(size=1)
    body["metadata"]["finalizers"] = ["example.dev/hold"]
    assert create(widgets, body)["metadata"]["generation"] == 1
    # When it is deleted, Then it is marked for deletion and its generation moves, as controllers expect
    widgets.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    held = widgets.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["generation"] == 2
    # And deleting it again changes nothing more
    widgets.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    assert widgets.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")["metadata"]["generation"] == 2


def test_rules_on_the_status_are_checked_on_status_writes_as_kubectl_shows(tmp_path: Path) -> None:
    # Given widgets with a status subresource whose status carries rules (the status strategy runs the rules
    # of the whole object, as the main one does)
    status_schema = {"type": "object", "properties": {
        "ready": {"type": "integer", "x-kubernetes-validations": [rule("self <= 5", "at most 5 ready")]}},
        "x-kubernetes-validations": [rule("!has(self.ready) || self.ready != 3", "three is never ready")]}
    crd = definition({**SCHEMA, "properties": {**SCHEMA["properties"], "status": status_schema}})
    crd["spec"]["versions"][0]["subresources"] = {"status": {}}
    with KubeApiServer(tls=True) as api:
        kubectl = kubectl_on(api, tmp_path)
        assert kubectl("create", "-f", "-", stdin=json.dumps(crd)).returncode == 0
        assert kubectl("create", "-f", "-", stdin=json.dumps(widget(size=1))).returncode == 0

        def set_status(status: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            return kubectl("patch", f"{PLURAL}.{GROUP}", "w", "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": status}))

        # When the status breaks a rule of a field, or of the status itself: refused in the rule's words
        too_many = set_status({"ready": 9})
        assert too_many.returncode != 0
        assert ('The Widget "w" is invalid: status.ready: Invalid value: "integer": at most 5 ready'
                in too_many.stderr)
        three = set_status({"ready": 3})
        assert 'status: Invalid value: "object": three is never ready' in three.stderr
        # And a status the rules allow is written
        assert set_status({"ready": 2}).returncode == 0
        assert api.get_object(PLURAL, "w", "default")["status"] == {"ready": 2}
