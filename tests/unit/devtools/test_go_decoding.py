"""The embedded API's Go types of the built-in kinds (read from kubernetes-validate's schemas), and the
values Go's decoders parse, against what Go answers (time.Parse, resource.ParseQuantity,
base64.StdEncoding, encoding/json's UnmarshalTypeError)."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm_devtools.kubeapi.builtindecoding import GoDecodeError, decode_json, decode_unstructured, go_format
from prewarm_devtools.kubeapi.builtintypes import GoType, kind_type, struct_fields, struct_name
from prewarm_devtools.kubeapi.gonames import NAMED_FIELDS
from prewarm_devtools.kubeapi.govalues import RFC3339_MICRO, parse_base64, parse_quantity, parse_time
from prewarm_devtools.kubeapi.resources import RESOURCES


def _reachable(t: GoType, seen: dict[str, str]) -> None:
    if t.kind == "struct" and t.model not in seen.values():
        seen[struct_name(t.model)] = t.model
        for field in struct_fields(t.model).values():
            _reachable(field, seen)
    elif t.elem is not None:
        _reachable(t.elem, seen)


def _served_structs() -> dict[str, str]:
    models: dict[str, str] = {}
    for rtype in RESOURCES.values():
        t = kind_type(rtype.api_version, rtype.kind)
        assert t is not None, rtype.kind
        _reachable(t, models)
    return models


def test_every_stored_built_in_kind_has_its_go_type_and_no_field_is_left_untyped() -> None:
    # An untyped field (`interface {}`) would take anything.
    models = _served_structs()
    untyped = [f"{m}.{name}" for m in models.values() for name, t in struct_fields(m).items()
               if t.name == "interface {}"]
    assert untyped == []
    assert {"PodSpec", "Container", "PolicyRule", "ValidatingAdmissionPolicySpec"} <= set(models)
    assert kind_type("apiextensions.k8s.io/v1", "CustomResourceDefinition") is None
    assert kind_type("prewarm.io/v1", "ImagePullJob") is None


def test_the_named_types_table_names_only_fields_the_schemas_have() -> None:
    models = _served_structs()
    for struct, fields in NAMED_FIELDS.items():
        assert set(fields) <= set(struct_fields(models[struct])), struct


@pytest.mark.parametrize(("model", "field", "go_type"), [
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "labels", "map[string]string"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "generation", "int64"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "creationTimestamp", "v1.Time"),
    ("io.k8s.api.apps.v1.DaemonSetSpec", "revisionHistoryLimit", "int32"),
    ("io.k8s.api.core.v1.PodSpec", "containers", "[]v1.Container"),
    ("io.k8s.api.core.v1.PodSpec", "terminationGracePeriodSeconds", "int64"),
    ("io.k8s.api.core.v1.Container", "imagePullPolicy", "v1.PullPolicy"),
    ("io.k8s.api.core.v1.ResourceRequirements", "limits", "v1.ResourceList"),
    ("io.k8s.api.apps.v1.RollingUpdateDaemonSet", "maxUnavailable", "intstr.IntOrString"),
    ("io.k8s.api.core.v1.Secret", "data", "map[string][]uint8"),
    ("io.k8s.api.core.v1.Event", "eventTime", "v1.MicroTime"),
    ("io.k8s.api.rbac.v1.ClusterRoleBinding", "subjects", "[]v1.Subject"),
])
def test_fields_have_the_go_type_reflect_names(model: str, field: str, go_type: str) -> None:
    assert struct_fields(model)[field].name == go_type


def test_fields_newer_than_the_served_version_are_unknown() -> None:
    # 1.34 added PodSpec.hostnameOverride; the embedded API plays 1.33
    pod = kind_type("v1", "Pod")
    assert pod is not None
    decoded = decode_json(pod, {"metadata": {"name": "p"}, "spec": {"hostnameOverride": "h", "containers": []}})
    assert decoded.strict == ['unknown field "spec.hostnameOverride"']


@pytest.mark.parametrize(("value", "error"), [
    ("2026-01-02T03:04:05Z", None),
    ("2026-01-02T03:04:05.123+05:30", None),
    ("2026-01-02T3:04:05Z", None),  # the hour may have one digit
    ("2026-01-02", 'parsing time "2026-01-02" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "T"'),
    ("2026-1-02T03:04:05Z", 'parsing time "2026-1-02T03:04:05Z" as "2006-01-02T15:04:05Z07:00": cannot parse '
                            '"1-02T03:04:05Z" as "01"'),
    ("2026-13-02T03:04:05Z", 'parsing time "2026-13-02T03:04:05Z": month out of range'),
    ("2026-02-29T03:04:05Z", 'parsing time "2026-02-29T03:04:05Z": day out of range'),
    ("2026-01-02T03:04:05", 'parsing time "2026-01-02T03:04:05" as "2006-01-02T15:04:05Z07:00": cannot parse "" '
                            'as "Z07:00"'),
    ("2026-01-02T03:04:05Z trailing", 'parsing time "2026-01-02T03:04:05Z trailing": extra text: " trailing"'),
])
def test_times_parse_as_go_s_rfc3339_layout_does(value: str, error: str | None) -> None:
    assert parse_time(value) == error


def test_micro_times_need_six_fractional_digits() -> None:
    assert parse_time("2026-01-02T03:04:05.000001Z", RFC3339_MICRO) is None
    assert parse_time("2026-01-02T03:04:05.1Z", RFC3339_MICRO) == (
        'parsing time "2026-01-02T03:04:05.1Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse ".1Z" as '
        '".000000"')


FORMAT = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


@pytest.mark.parametrize(("text", "error"), [
    ("1", None), ("250m", None), ("1.5Gi", None), ("-2", None), ("1e3", None), ("1E", None), ("+5k", None),
    ("", FORMAT), ("lots", FORMAT), ("1Gb", FORMAT), ("1 Gi", FORMAT),
    ("1K", "unable to parse quantity's suffix"), ("1Mi2", "unable to parse quantity's suffix"),
])
def test_quantities_parse_as_resource_parse_quantity_does(text: str, error: str | None) -> None:
    assert parse_quantity(text) == error


@pytest.mark.parametrize(("text", "error"), [
    ("aGVsbG8=", None), ("aGVs\r\nbG8=", None), ("", None),
    ("aGVsbG8", "illegal base64 data at input byte 4"),
    ("aGVsbG8=x", "illegal base64 data at input byte 8"),
    ("a!==", "illegal base64 data at input byte 1"),
    ("aG=", "illegal base64 data at input byte 3"),
])
def test_base64_decodes_as_go_s_std_encoding_does(text: str, error: str | None) -> None:
    assert parse_base64(text) == error


def _daemon_set(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "a"}, "spec": spec}


def test_the_first_type_error_in_document_order_is_reported_after_the_whole_body_is_read() -> None:
    go_type = kind_type("apps/v1", "DaemonSet")
    assert go_type is not None
    body = _daemon_set(minReadySeconds="1", revisionHistoryLimit=True, colour="red")
    with pytest.raises(GoDecodeError, match=r"DaemonSetSpec\.spec\.minReadySeconds of type int32$"):
        decode_json(go_type, body)
    # A type with its own UnmarshalJSON stops decoding at once: its error wins over one saved before it
    body = _daemon_set(minReadySeconds="1", updateStrategy={"rollingUpdate": {"maxSurge": [1]}})
    with pytest.raises(GoDecodeError) as raised:
        decode_json(go_type, body)
    assert str(raised.value) == ("json: cannot unmarshal array into Go struct field RollingUpdateDaemonSet.spec."
                                 "updateStrategy.rollingUpdate.maxSurge of type int32")


def test_unknown_fields_are_found_with_list_indices_and_dropped_on_demand() -> None:
    go_type = kind_type("v1", "Pod")
    assert go_type is not None
    body: dict[str, Any] = {"metadata": {"name": "p", "labels": {"any": "key"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "x": 1}], "volumes": [{"name": "v", "y": {}}]}}
    decoded = decode_json(go_type, body)
    assert decoded.strict == ['unknown field "spec.containers[1].x"', 'unknown field "spec.volumes[0].y"']
    assert body["spec"]["containers"][1] == {"name": "b", "x": 1}
    decoded.drop_unknown()
    assert body["spec"]["containers"][1] == {"name": "b"} and body["spec"]["volumes"] == [{"name": "v"}]


@pytest.mark.parametrize(("spec", "error"), [
    ({"minReadySeconds": "5"}, "unrecognized type: int32"),
    ({"minReadySeconds": 1.5}, "cannot convert float64 to int32"),
    ({"template": {"spec": {"restartPolicy": 1}}}, "cannot convert int64 to v1.RestartPolicy"),
    ({"template": []}, "cannot restore struct from: slice"),
    ({"template": {"spec": {"containers": {}}}}, "cannot restore slice from map"),
    ({"updateStrategy": {"rollingUpdate": {"maxSurge": 1.5}}},
     "json: cannot unmarshal number 1.5 into Go value of type int32"),
])
def test_a_strategic_merge_patch_result_converts_as_the_unstructured_converter_does(
    spec: dict[str, Any], error: str
) -> None:
    go_type = kind_type("apps/v1", "DaemonSet")
    assert go_type is not None
    with pytest.raises(GoDecodeError) as raised:
        decode_unstructured(go_type, _daemon_set(**spec))
    assert str(raised.value) == error


def test_go_formats_a_patch_as_percent_v_does() -> None:
    assert go_format({"b": [1, 2.5, None], "a": {"x": True, "y": "s"}, "c": 1e6}) == (
        "map[a:map[x:true y:s] b:[1 2.5 <nil>] c:1e+06]")
