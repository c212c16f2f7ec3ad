"""The Go types of the built-in kinds, which the real API server decodes request bodies into.

The fields of each kind and their nesting come from the official Python client's models
(`kubernetes.client.V1DaemonSet.openapi_types` and `attribute_map`), generated from the same OpenAPI
as the server's types. What they leave out (int32 or int64, named string types such as
`v1.PullPolicy`, quantities, IntOrString, MicroTime, `[]byte`) comes from gotypes_table.py, generated
from the Go sources by gotypes_generate.py. A `GoType` is named as reflect names it
(`reflect.Type.String()`), which is what decoding errors print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from prewarm_devtools.kubeapi.gotypes_table import FIELD_TYPES, NAMED_TYPES

#: `V1DaemonSet`, `RbacV1Subject`, `CoreV1Event`, `V1beta1X`: a group prefix when names collide, the
#: version, and the Go struct's name.
MODEL_NAME = re.compile(r"^([A-Z][A-Za-z]*?)?V(\d+(?:(?:alpha|beta)\d+)?)([A-Z]\w*)$")

_CORE, _APPS, _RBAC = "k8s.io/api/core/v1", "k8s.io/api/apps/v1", "k8s.io/api/rbac/v1"
_RBAC_VERSION, _ADMISSION = "rbac.authorization.k8s.io/v1", "k8s.io/api/admissionregistration/v1"
#: The served built-in kinds (apiVersion, kind) -> their model in the Python client, and the Go package
#: of their type (for the generator).
SERVED_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("V1ConfigMap", _CORE),
    ("v1", "Event"): ("CoreV1Event", _CORE),
    ("v1", "Namespace"): ("V1Namespace", _CORE),
    ("v1", "Node"): ("V1Node", _CORE),
    ("v1", "Pod"): ("V1Pod", _CORE),
    ("v1", "Secret"): ("V1Secret", _CORE),
    ("v1", "ServiceAccount"): ("V1ServiceAccount", _CORE),
    ("apps/v1", "DaemonSet"): ("V1DaemonSet", _APPS),
    (_RBAC_VERSION, "ClusterRole"): ("V1ClusterRole", _RBAC),
    (_RBAC_VERSION, "ClusterRoleBinding"): ("V1ClusterRoleBinding", _RBAC),
    (_RBAC_VERSION, "Role"): ("V1Role", _RBAC),
    (_RBAC_VERSION, "RoleBinding"): ("V1RoleBinding", _RBAC),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("V1PriorityClass", "k8s.io/api/scheduling/v1"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): ("V1ValidatingAdmissionPolicy", _ADMISSION),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        ("V1ValidatingAdmissionPolicyBinding", _ADMISSION),
}

# Go types whose UnmarshalJSON takes more (or other) than their Python type says, by reflect's name.
_SPECIAL_KINDS = {
    "v1.Time": "time",  # an RFC 3339 string or null
    "v1.MicroTime": "microtime",  # RFC 3339 with exactly six fractional digits, or null
    "resource.Quantity": "quantity",  # a string or a number, parsed as a quantity
    "intstr.IntOrString": "intorstring",  # a string, or a number that fits an int32
    "runtime.RawExtension": "any",
    "v1.FieldsV1": "any",
    "v1.Duration": "any",
    "interface {}": "any",
}
_SCALARS = {
    "string": ("string", 0), "bool": ("bool", 0), "float32": ("float", 32), "float64": ("float", 64),
    **{f"int{b}": ("int", b) for b in (8, 16, 32, 64)}, "int": ("int", 64),
    **{f"uint{b}": ("uint", b) for b in (8, 16, 32, 64)}, "uint": ("uint", 64),
}
_NAMED = {**NAMED_TYPES, "types.UID": "string"}


@dataclass(frozen=True)
class GoType:
    """A Go type as decoding sees it: `kind` is string, bool, int, uint, float, bytes, struct, slice, map,
    any, or one of the special kinds (time, microtime, quantity, intorstring)."""

    name: str  # reflect.Type.String(): "string", "v1.PullPolicy", "[]v1.Container", "map[string]string"
    kind: str
    bits: int = 0  # int, uint, float
    elem: GoType | None = None  # slice, map
    model: str = ""  # struct: the Python client's model


def python_type_parts(python_type: str) -> tuple[Any, ...]:
    """`List[V1Container]` -> ("list", ("model", "V1Container")); `Dict[str, str]` -> ("dict", ("scalar", "str"))."""
    if python_type.startswith("List["):
        return ("list", python_type_parts(python_type[5:-1]))
    if python_type.startswith("Dict[str, "):
        return ("dict", python_type_parts(python_type[10:-1]))
    if python_type in ("str", "int", "bool", "float", "datetime", "date", "bytes", "object"):
        return ("scalar", python_type)
    return ("model", python_type)


def _model_go_name(model: str) -> str:
    found = MODEL_NAME.match(model)
    if not found:
        raise ValueError(f"not a model of the Kubernetes Python client: {model}")
    return f"v{found.group(2)}.{found.group(3)}"


def default_go_type(python_type: str) -> str:
    """The Go type a Python type implies when the table says nothing more."""
    return _default(python_type_parts(python_type))


def _default(parts: tuple[Any, ...]) -> str:
    if parts[0] == "list":
        return "[]" + _default(parts[1])
    if parts[0] == "dict":
        return "map[string]" + _default(parts[1])
    if parts[0] == "model":
        return _model_go_name(parts[1])
    return {"str": "string", "int": "int32", "bool": "bool", "float": "float64", "datetime": "v1.Time",
            "date": "v1.Time", "bytes": "[]uint8", "object": "interface {}"}[parts[1]]


def _map_value(name: str) -> str:
    depth = 0
    for i, c in enumerate(name[4:], start=4):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth < 0:
            return name[i + 1:]
    raise ValueError(name)


def _build(parts: tuple[Any, ...], name: str) -> GoType:
    underlying = name
    while underlying in _NAMED:
        underlying = _NAMED[underlying]
    if name in _SPECIAL_KINDS:
        return GoType(name, _SPECIAL_KINDS[name])
    if underlying == "[]uint8":
        return GoType(name, "bytes")
    inner = parts[1] if parts[0] in ("list", "dict") else ("scalar", "object")
    if underlying.startswith("[]"):
        return GoType(name, "slice", elem=_build(inner, underlying[2:]))
    if underlying.startswith("map["):
        return GoType(name, "map", elem=_build(inner, _map_value(underlying)))
    if underlying in _SCALARS:
        kind, bits = _SCALARS[underlying]
        return GoType(name, kind, bits)
    if parts[0] == "model":
        return GoType(name, "struct", model=parts[1])
    return GoType(name, "any")


@cache
def struct_fields(model: str) -> dict[str, GoType]:
    """The JSON fields of a model's Go struct and their Go types."""
    import kubernetes.client  # the client's models import lazily: only the kinds written get loaded

    cls = getattr(kubernetes.client, model)
    overrides = FIELD_TYPES.get(model, {})
    fields = {}
    for attr, json_name in cls.attribute_map.items():
        python_type = cls.openapi_types[attr]
        go_name = overrides.get(json_name) or default_go_type(python_type)
        fields[json_name] = _build(python_type_parts(python_type), go_name)
    return fields


def struct_name(model: str) -> str:
    """The Go struct's own name (reflect's `Name()`), which decoding errors name."""
    return _model_go_name(model).split(".", 1)[1]


def kind_type(api_version: str, kind: str) -> GoType | None:
    """The Go type of a served built-in kind (None for the kinds of CRDs, and CRDs themselves)."""
    served = SERVED_KINDS.get((api_version, kind))
    return None if served is None else GoType(_model_go_name(served[0]), "struct", model=served[0])
