"""Built-in kinds decode into their Go types, as on a real API server: a value of the wrong type is refused
with encoding/json's words, unknown fields are dropped (warned of, or refused when strict), and what
`prewarm install` ships decodes cleanly under kubectl's strict validation."""

# mypy: disable-error-code="union-attr, arg-type, index, no-untyped-call"

from __future__ import annotations

import copy
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from prewarm_cli.install.render import KIND_PLURALS, render, values_from_stack
from prewarm_devtools.kubeapi import KubeApiServer, SeedError
from tests.support.kube import call
from tests.support.kubectl import kubectl_on

pytestmark = pytest.mark.integration

DAEMON_SETS = "/apis/apps/v1/namespaces/default/daemonsets"


def daemon_set(name: str = "agent", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "agent", "image": "registry.example/agent:1"}]}},
                 **spec},
    }


def container_field(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    body["spec"]["template"]["spec"]["containers"][0].update(fields)
    return body


def http(api: KubeApiServer, method: str, path: str, body: Any = None, *, query: str = "",
         content_type: str = "application/json") -> tuple[int, Any, list[str]]:
    """A raw request: status, parsed body and the Warning headers."""
    request = urllib.request.Request(
        f"{api.url}{path}{'?' + query if query else ''}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {api.token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), answer.headers.get_all("Warning") or []
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers.get_all("Warning") or []


def refused(api: KubeApiServer, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    status, answer, _ = http(api, "POST", path, body)
    return status, answer["reason"], answer["message"]


# -- wrong types -----------------------------------------------------------------------------------


def test_a_boolean_label_is_refused_as_go_refuses_it_and_nothing_is_stored(kube_client: ApiClient) -> None:
    # Given a DaemonSet whose label is a YAML boolean, sent by the official client (its typed call checks
    # types itself, so through call_api, as a dict)
    body = daemon_set()
    body["metadata"]["labels"] = {"enabled": True}
    # When it is created: 400, in the real server's words
    answer = call(kube_client, "POST", DAEMON_SETS, body=body)
    assert (answer.status, answer.body["reason"], answer.body["message"]) == (
        400, "BadRequest",
        'DaemonSet in version "v1" cannot be handled as a DaemonSet: json: cannot unmarshal bool into Go struct '
        "field ObjectMeta.metadata.labels of type string")
    assert "details" not in answer.body
    # And nothing was stored (the old server kept the label as the string "True")
    assert call(kube_client, "GET", f"{DAEMON_SETS}/agent").status == 404


CORE = "/api/v1/namespaces/default"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def _policy(**validation: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "p"}, "spec": {"validations": [{"expression": "true", **validation}]}}


WRONG_TYPES = [
    pytest.param(DAEMON_SETS, daemon_set(revisionHistoryLimit="10"),
                 "DaemonSet", "json: cannot unmarshal string into Go struct field DaemonSetSpec.spec."
                 "revisionHistoryLimit of type int32", id="string for an int32"),
    pytest.param(DAEMON_SETS, daemon_set(minReadySeconds=1.5),
                 "DaemonSet", "json: cannot unmarshal number 1.5 into Go struct field DaemonSetSpec.spec."
                 "minReadySeconds of type int32", id="fraction for an int32"),
    pytest.param(DAEMON_SETS, {**daemon_set(), "spec": {**daemon_set()["spec"], "template": {
        "spec": {"containers": {"name": "agent", "image": "a"}}}}},
                 "DaemonSet", "json: cannot unmarshal object into Go struct field PodSpec.spec.template.spec."
                 "containers of type []v1.Container", id="object for a list"),
    pytest.param(DAEMON_SETS, container_field(daemon_set(), imagePullPolicy=1),
                 "DaemonSet", "json: cannot unmarshal number into Go struct field Container.spec.template.spec."
                 "containers.imagePullPolicy of type v1.PullPolicy", id="number for a named string type"),
    pytest.param(DAEMON_SETS, container_field(daemon_set(), ports=[{"containerPort": "8080"}]),
                 "DaemonSet", "json: cannot unmarshal string into Go struct field ContainerPort.spec.template."
                 "spec.containers.ports.containerPort of type int32", id="string in a list of structs"),
    pytest.param(DAEMON_SETS, container_field(daemon_set(), securityContext={"runAsUser": "0"}),
                 "DaemonSet", "json: cannot unmarshal string into Go struct field SecurityContext.spec.template."
                 "spec.containers.securityContext.runAsUser of type int64", id="string for an int64"),
    pytest.param(DAEMON_SETS, container_field(daemon_set(), resources={"limits": {"memory": "lots"}}),
                 "DaemonSet", "quantities must match the regular expression "
                 "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", id="bad quantity"),
    pytest.param(DAEMON_SETS, daemon_set(updateStrategy={"type": "RollingUpdate",
                                                         "rollingUpdate": {"maxUnavailable": True}}),
                 "DaemonSet", "json: cannot unmarshal bool into Go struct field RollingUpdateDaemonSet.spec."
                 "updateStrategy.rollingUpdate.maxUnavailable of type int32", id="bool for an IntOrString"),
    pytest.param(f"{CORE}/configmaps", {"metadata": {"name": "c"}, "data": {"replicas": 3}},
                 "ConfigMap", "json: cannot unmarshal number into Go struct field ConfigMap.data of type string",
                 id="ConfigMap number value"),
    pytest.param(f"{CORE}/secrets", {"metadata": {"name": "s"}, "data": {"token": "not base64!"}},
                 "Secret", "illegal base64 data at input byte 3", id="Secret data not base64"),
    pytest.param(f"{CORE}/secrets", {"metadata": {"name": "s", "creationTimestamp": "yesterday"}},
                 "Secret", 'parsing time "yesterday" as "2006-01-02T15:04:05Z07:00": cannot parse "yesterday" '
                 'as "2006"', id="time not RFC 3339"),
    pytest.param(f"{CORE}/events", {"metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "n"},
                                    "eventTime": "2026-01-01T00:00:00Z"},
                 "Event", 'parsing time "2026-01-01T00:00:00Z" as "2006-01-02T15:04:05.000000Z07:00": cannot '
                 'parse "Z" as ".000000"', id="MicroTime without microseconds"),
    pytest.param(f"{RBAC}/clusterroles", {"metadata": {"name": "r"}, "rules": {"verbs": ["get"]}},
                 "ClusterRole", "json: cannot unmarshal object into Go struct field ClusterRole.rules of type "
                 "[]v1.PolicyRule", id="ClusterRole rules object"),
    pytest.param(f"{RBAC}/namespaces/default/rolebindings",
                 {"metadata": {"name": "b"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                         "name": "r"}, "subjects": [{"kind": "User", "name": 7}]},
                 "RoleBinding", "json: cannot unmarshal number into Go struct field Subject.subjects.name of type "
                 "string", id="RoleBinding subject name number"),
    pytest.param(f"{ADMISSION}/validatingadmissionpolicies", _policy(expression=True),
                 "ValidatingAdmissionPolicy", "json: cannot unmarshal bool into Go struct field Validation.spec."
                 "validations.expression of type string", id="policy expression bool"),
    pytest.param("/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": "p"}, "value": "high"},
                 "PriorityClass", "json: cannot unmarshal string into Go struct field PriorityClass.value of type "
                 "int32", id="PriorityClass value string"),
]


@pytest.mark.parametrize(("path", "body", "kind", "error"), WRONG_TYPES)
def test_a_value_of_the_wrong_type_is_400_with_go_s_error(
    kube_api: KubeApiServer, path: str, body: dict[str, Any], kind: str, error: str
) -> None:
    assert refused(kube_api, path, body) == (
        400, "BadRequest", f'{kind} in version "v1" cannot be handled as a {kind}: {error}')


def test_values_go_s_decoders_take_beyond_their_python_type_are_accepted(kube_api: KubeApiServer) -> None:
    # Quantities as numbers, IntOrString as either, base64 broken over lines, times, nulls
    body = daemon_set(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                      revisionHistoryLimit=None)
    container_field(body, resources={"limits": {"cpu": 1, "memory": "128Mi"}, "requests": {"cpu": 0.5}},
                    livenessProbe={"httpGet": {"port": 8080, "path": "/"}},
                    readinessProbe={"tcpSocket": {"port": "http"}}, ports=[{"name": "http", "containerPort": 8080}])
    assert http(kube_api, "POST", DAEMON_SETS, body)[0] == 201
    secret = {"metadata": {"name": "s", "creationTimestamp": "2026-01-01T10:00:00.5+02:00"},
              "data": {"token": "aGVs\nbG8="}, "stringData": {"extra": "x"}}
    assert http(kube_api, "POST", f"{CORE}/secrets", secret)[0] == 201
    event = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "n"},
             "eventTime": "2026-01-01T00:00:00.000001Z", "reportingComponent": "c", "reportingInstance": "i",
             "action": "Pulled", "reason": "Pulled", "type": "Normal"}
    status, answer, _ = http(kube_api, "POST", f"{CORE}/events", event)
    assert status == 201, answer


# -- unknown fields --------------------------------------------------------------------------------


def _with_unknown_fields() -> dict[str, Any]:
    body = container_field(daemon_set(), colour="red")
    body["spec"]["template"]["spec"]["hostname2"] = "x"
    body["metadata"]["owner"] = "me"
    return body


def test_unknown_fields_under_strict_validation_are_400_naming_each(kube_api: KubeApiServer) -> None:
    status, answer, _ = http(kube_api, "POST", DAEMON_SETS, _with_unknown_fields(), query="fieldValidation=Strict")
    assert (status, answer["message"]) == (
        400, 'DaemonSet in version "v1" cannot be handled as a DaemonSet: strict decoding error: '
        'unknown field "metadata.owner", unknown field "spec.template.spec.containers[0].colour", '
        'unknown field "spec.template.spec.hostname2"')
    assert http(kube_api, "GET", f"{DAEMON_SETS}/agent")[0] == 404


@pytest.mark.parametrize(("validation", "warned"), [("Warn", True), ("", True), ("Ignore", False)])
def test_unknown_fields_are_dropped_with_a_warning_or_silently(
    kube_api: KubeApiServer, validation: str, warned: bool
) -> None:
    query = f"fieldValidation={validation}" if validation else ""
    status, created, warnings = http(kube_api, "POST", DAEMON_SETS, _with_unknown_fields(), query=query)
    assert status == 201
    assert warnings == ([
        '299 - "unknown field \\"metadata.owner\\""',
        '299 - "unknown field \\"spec.template.spec.containers[0].colour\\""',
        '299 - "unknown field \\"spec.template.spec.hostname2\\""',
    ] if warned else [])
    stored = http(kube_api, "GET", f"{DAEMON_SETS}/agent")[1]
    for obj in (created, stored):
        assert "owner" not in obj["metadata"] and "hostname2" not in obj["spec"]["template"]["spec"]
        assert "colour" not in obj["spec"]["template"]["spec"]["containers"][0]


def test_a_replace_decodes_as_a_create_does(kube_api: KubeApiServer) -> None:
    _, created, _ = http(kube_api, "POST", DAEMON_SETS, daemon_set())
    wrong = copy.deepcopy(created)
    wrong["metadata"]["labels"] = {"enabled": False}
    status, answer, _ = http(kube_api, "PUT", f"{DAEMON_SETS}/agent", wrong)
    assert (status, answer["message"]) == (
        400, 'DaemonSet in version "v1" cannot be handled as a DaemonSet: json: cannot unmarshal bool into Go '
        "struct field ObjectMeta.metadata.labels of type string")
    unknown = {**copy.deepcopy(created), "extra": 1}
    status, answer, _ = http(kube_api, "PUT", f"{DAEMON_SETS}/agent", unknown, query="fieldValidation=Strict")
    assert (status, answer["message"]) == (
        400, 'DaemonSet in version "v1" cannot be handled as a DaemonSet: strict decoding error: unknown field '
        '"extra"')


# -- patches ---------------------------------------------------------------------------------------


def test_a_merge_patch_of_the_wrong_type_is_422_showing_the_patched_object(kube_api: KubeApiServer) -> None:
    http(kube_api, "POST", f"{CORE}/configmaps", {"metadata": {"name": "c"}, "data": {"a": "b"}})
    status, answer, _ = http(kube_api, "PATCH", f"{CORE}/configmaps/c", {"data": {"a": True}},
                             content_type="application/merge-patch+json")
    assert (status, answer["reason"]) == (422, "Invalid")
    message = answer["message"]
    assert message.startswith(' "" is invalid: patch: Invalid value: "{\\"apiVersion\\":\\"v1\\",\\"data\\":'
                              '{\\"a\\":true},\\"kind\\":\\"ConfigMap\\",\\"metadata\\":{')
    assert message.endswith('": json: cannot unmarshal bool into Go struct field ConfigMap.data of type string')
    assert answer["details"]["causes"][0]["field"] == "patch"


def test_a_strategic_merge_patch_is_converted_as_the_unstructured_converter_does(kube_api: KubeApiServer) -> None:
    http(kube_api, "POST", DAEMON_SETS, daemon_set())
    patch = {"metadata": {"labels": {"enabled": True}}}
    status, answer, _ = http(kube_api, "PATCH", f"{DAEMON_SETS}/agent", patch,
                             content_type="application/strategic-merge-patch+json")
    assert (status, answer["message"]) == (
        422, ' "" is invalid: patch: Invalid value: "map[metadata:map[labels:map[enabled:true]]]": '
        "unrecognized type: string")
    unknown = {"spec": {"template": {"spec": {"containers": [{"name": "agent", "colour": "red"}]}}}}
    status, answer, _ = http(kube_api, "PATCH", f"{DAEMON_SETS}/agent", unknown, query="fieldValidation=Strict",
                             content_type="application/strategic-merge-patch+json")
    assert (status, answer["message"]) == (
        422, ' "" is invalid: patch: Invalid value: "map[spec:map[template:map[spec:map[containers:[map[colour:red '
        'name:agent]]]]]]": strict decoding error: unknown field "spec.template.spec.containers[0].colour"')
    status, patched, warnings = http(kube_api, "PATCH", f"{DAEMON_SETS}/agent", unknown,
                                     content_type="application/strategic-merge-patch+json")
    assert status == 200 and "colour" not in patched["spec"]["template"]["spec"]["containers"][0]
    assert warnings == ['299 - "unknown field \\"spec.template.spec.containers[0].colour\\""']


# -- seeds -----------------------------------------------------------------------------------------


def test_seeded_built_in_objects_must_decode(kube_api: KubeApiServer) -> None:
    body = daemon_set()
    body["metadata"]["labels"] = {"enabled": True}
    with pytest.raises(SeedError, match=re.escape("ObjectMeta.metadata.labels of type string")):
        kube_api.seed_objects([body])
    with pytest.raises(SeedError, match=re.escape('unknown field "spec.colour"')):
        kube_api.seed_objects([daemon_set(colour="red")])


# -- what prewarm install ships ----------------------------------------------------------------------

STACK = {
    "STATUS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/210987654321/pw-StatusQueue-AbC",
    "NODE_QUEUE_PREFIX": "pw-node",
    "NODE_DLQ_ARN": "arn:aws:sqs:eu-west-1:210987654321:pw-NodeDLQ-XyZ",
    "SECRET_PREFIX": "prewarm/pw",
    "NODE_QUEUE_SENDER_ARNS": "arn:aws:iam::210987654321:role/pw-DispatchJobRole",
    "AGENT_ROLE_ARN": "arn:aws:iam::210987654321:role/team-prewarm-agents",
}
CREDENTIALS = json.dumps({"registries": [{"account": "210987654321", "region": "eu-west-1"}],
                          "namespaces": ["team-a"], "secretName": "ecr-pull", "serviceAccounts": ["default"]})
INSTALLS: dict[str, dict[str, Any]] = {
    "irsa": {"pull_secret_namespaces": ["shop"], "credentials_config": CREDENTIALS},
    "pod identity, bottlerocket, every namespace": {
        "pod_identity": True, "agent_role_arn": "", "bottlerocket": True, "pull_secret_namespaces": ["*"],
        "pull_secret_names": ["ecr-pull"], "registry_allowlist": ["210987654321.dkr.ecr.eu-west-1.amazonaws.com"]},
}


def _path(obj: dict[str, Any]) -> str:
    api_version, plural, namespaced = KIND_PLURALS[obj["kind"]]
    base = f"/api/{api_version}" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{obj['metadata']['namespace']}/{plural}" if namespaced else f"{base}/{plural}"


@pytest.mark.parametrize("install", list(INSTALLS))
def test_every_object_prewarm_install_renders_decodes_under_strict_validation(
    kube_api: KubeApiServer, install: str
) -> None:
    arguments = {"region": "eu-west-1", "image": "210987654321.dkr.ecr.eu-west-1.amazonaws.com/prewarm-agent:1",
                 **INSTALLS[install]}
    objects = render(values_from_stack(STACK, **arguments))
    namespaces = {o["metadata"].get("namespace") for o in objects} - {None}
    namespaces -= {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    for namespace in sorted(namespaces - {"default"}):
        assert http(kube_api, "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})[0] == 201
    assert {o["kind"] for o in objects} >= {"DaemonSet", "ClusterRole", "RoleBinding", "ConfigMap",
                                             "ValidatingAdmissionPolicy", "ServiceAccount", "PriorityClass"}
    for obj in objects:
        status, answer, warnings = http(kube_api, "POST", _path(obj), obj, query="fieldValidation=Strict")
        assert (status, warnings) == (201, []), f"{obj['kind']} {obj['metadata']['name']}: {answer}"


# -- kubectl ---------------------------------------------------------------------------------------


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Any]:
    with KubeApiServer(tls=True) as api:
        yield kubectl_on(api, tmp_path)


YAML_BOOLEAN_LABEL = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: default
  labels:
    enabled: true
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - name: agent
        image: registry.example/agent:1
"""


def test_kubectl_refuses_a_yaml_boolean_label_and_the_server_refuses_it_in_the_same_words(
    kubectl: Any, tmp_path: Path
) -> None:
    go_error = "json: cannot unmarshal bool into Go struct field ObjectMeta.metadata.labels of type string"
    manifest = tmp_path / "ds.yaml"
    manifest.write_text(YAML_BOOLEAN_LABEL)
    # kubectl apply decodes a built-in kind itself, and refuses it before sending it
    applied = kubectl("apply", "-f", str(manifest))
    assert applied.returncode != 0 and f'error: unable to decode "{manifest}": {go_error}' in applied.stderr
    # Sent as it is (create --raw), the server refuses it with the real server's message
    raw = tmp_path / "ds.json"
    raw.write_text(json.dumps(yaml.safe_load(YAML_BOOLEAN_LABEL)))
    created = kubectl("create", "--raw", DAEMON_SETS, "-f", str(raw))
    assert created.returncode != 0
    assert ('Error from server (BadRequest): DaemonSet in version "v1" cannot be handled as a DaemonSet: '
            + go_error) in created.stderr
    assert kubectl("get", "daemonset", "agent").returncode != 0
    # And a boolean patched in (a strategic merge patch) is refused as the unstructured converter refuses it
    manifest.write_text(YAML_BOOLEAN_LABEL.replace("enabled: true", 'enabled: "true"'))
    assert kubectl("apply", "-f", str(manifest)).returncode == 0
    patched = kubectl("patch", "daemonset", "agent", "-p", '{"metadata":{"labels":{"x":true}}}')
    assert patched.returncode != 0
    assert ('The request is invalid: patch: Invalid value: "map[metadata:map[labels:map[x:true]]]": '
            "unrecognized type: string") in patched.stderr


def test_kubectl_apply_refuses_an_unknown_field_by_its_default_strict_validation(
    kubectl: Any, tmp_path: Path
) -> None:
    doc = yaml.safe_load(YAML_BOOLEAN_LABEL.replace("enabled: true", 'enabled: "true"'))
    manifest = tmp_path / "ds.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    assert kubectl("apply", "-f", str(manifest)).returncode == 0
    # An unknown field on an update (a strategic merge patch), then on a create
    doc["spec"]["template"]["spec"]["containers"][0]["colour"] = "red"
    manifest.write_text(yaml.safe_dump(doc))
    updated = kubectl("apply", "-f", str(manifest))
    assert updated.returncode != 0
    assert 'strict decoding error: unknown field "spec.template.spec.containers[0].colour"' in updated.stderr
    doc["metadata"]["name"] = "other"
    manifest.write_text(yaml.safe_dump(doc))
    created = kubectl("apply", "-f", str(manifest))
    assert created.returncode != 0
    assert ('DaemonSet in version "v1" cannot be handled as a DaemonSet: strict decoding error: unknown field '
            '"spec.template.spec.containers[0].colour"') in created.stderr
