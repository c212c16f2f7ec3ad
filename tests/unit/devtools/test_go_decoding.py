"""The embedded API's Go types of the built-in kinds, and the values Go's decoders parse, against what Go
answers (time.Parse, resource.ParseQuantity, base64.StdEncoding, encoding/json's UnmarshalTypeError)."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from prewarm_devtools.kubeapi.godecode import GoDecodeError, decode_json, decode_unstructured, go_format
from prewarm_devtools.kubeapi.gotypes import SERVED_KINDS, GoType, kind_type, struct_fields
from prewarm_devtools.kubeapi.gotypes_table import FIELD_TYPES
from prewarm_devtools.kubeapi.govalues import RFC3339_MICRO, parse_base64, parse_quantity, parse_time
from prewarm_devtools.kubeapi.resources import RESOURCES


def _reachable(t: GoType, seen: set[str]) -> None:
    if t.kind == "struct" and t.model not in seen:
        seen.add(t.model)
        for field in struct_fields(t.model).values():
            _reachable(field, seen)
    elif t.elem is not None:
        _reachable(t.elem, seen)


def test_every_stored_built_in_type_has_its_go_type() -> None:
    for rtype in RESOURCES.values():
        assert kind_type(rtype.api_version, rtype.kind) is not None, rtype.kind


def test_no_field_of_a_served_kind_is_left_untyped() -> None:
    # A Python `object` the table does not name (IntOrString, RawExtension...) would take anything.
    models: set[str] = set()
    for api_version, kind in SERVED_KINDS:
        t = kind_type(api_version, kind)
        assert t is not None
        _reachable(t, models)
    untyped = [f"{m}.{name}" for m in models for name, t in struct_fields(m).items() if t.name == "interface {}"]
    assert untyped == []
    assert {"V1PodSpec", "V1Container", "V1PolicyRule", "V1ValidatingAdmissionPolicySpec"} <= models


def test_the_generated_table_names_only_fields_the_python_client_has() -> None:
    for model, fields in FIELD_TYPES.items():
        known = set(getattr(kubernetes.client, model).attribute_map.values())
        assert set(fields) <= known, model


@pytest.mark.parametrize(("model", "field", "go_type"), [
    ("V1ObjectMeta", "labels", "map[string]string"),
    ("V1ObjectMeta", "generation", "int64"),
    ("V1DaemonSetSpec", "revisionHistoryLimit", "int32"),
    ("V1PodSpec", "containers", "[]v1.Container"),
    ("V1PodSpec", "terminationGracePeriodSeconds", "int64"),
    ("V1Container", "imagePullPolicy", "v1.PullPolicy"),
    ("V1ResourceRequirements", "limits", "v1.ResourceList"),
    ("V1RollingUpdateDaemonSet", "maxUnavailable", "intstr.IntOrString"),
    ("V1Secret", "data", "map[string][]uint8"),
    ("CoreV1Event", "eventTime", "v1.MicroTime"),
    ("V1ClusterRoleBinding", "subjects", "[]v1.Subject"),
])
def test_fields_have_the_go_type_reflect_names(model: str, field: str, go_type: str) -> None:
    assert struct_fields(model)[field].name == go_type


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


GO_SOURCE = '''
import (
\tmetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
\t"k8s.io/apimachinery/pkg/api/resource"
)

type PullPolicy string

type ResourceList map[ResourceName]resource.Quantity

type ResourceName string

type Thing struct {
\tmetav1.TypeMeta `json:",inline"`
\t// +optional
\tmetav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`
\tPolicy PullPolicy `json:"policy,omitempty"`
\tGrace *int64 `json:"grace,omitempty"`
\tLimits ResourceList `json:"limits,omitempty"`
\tData map[string][]byte `json:"data,omitempty"`
\tSource `json:",inline"`
\tSkipped string `json:"-"`
}

type Source struct {
\tPath string `json:"path"`
}
'''


def test_the_generator_reads_go_structs_as_reflect_names_their_fields() -> None:
    from prewarm_devtools.kubeapi.gotypes_generate import GoPackage, GoSources, parse_package

    package = parse_package("k8s.io/api/things/v1", GO_SOURCE)
    meta = GoPackage("k8s.io/apimachinery/pkg/apis/meta/v1", structs={"TypeMeta": [], "ObjectMeta": []})
    sources = GoSources({package.path: package, meta.path: meta})
    fields = sources.fields(package.path, "Thing")
    assert {name: sources.render(owner, expr) for name, (owner, expr) in fields.items()} == {
        "metadata": "v1.ObjectMeta", "policy": "v1.PullPolicy", "grace": "int64", "limits": "v1.ResourceList",
        "data": "map[string][]uint8", "path": "string"}
    assert sources.underlying(package, "ResourceList") == "map[v1.ResourceName]resource.Quantity"
    assert sources.underlying(package, "*int64") is None
