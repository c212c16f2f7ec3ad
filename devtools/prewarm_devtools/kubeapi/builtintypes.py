"""The Go types of the built-in kinds, read from kubernetes-validate's strict JSON schemas of the Kubernetes
version the embedded API reports (each kind's schema loaded once, its structs built once, on first use).

A `GoType` is named as reflect names it (`reflect.Type.String()`), which is what decoding errors print:
the schemas give the nesting, the widths (`format: int32`), `[]byte` (`format: byte`) and the types with
their own UnmarshalJSON (by `$ref`: Time, MicroTime, Quantity, IntOrString); what they do not carry is
the names of named Go types (`v1.PullPolicy`), listed in gonames.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from kubernetes_validate.utils import schema_contents

from prewarm_devtools.kubeapi.gonames import NAMED_FIELDS

#: kube-apiserver's version here (server.py reports v1.33.5), and kubernetes-validate's schemas of it.
KUBERNETES_VERSION = "1.33"
_SCHEMAS = f"kubernetes-json-schema/v{KUBERNETES_VERSION}.0-local-strict"
_REF = "#/$defs/"

# Definitions whose Go type has its own UnmarshalJSON (or takes any JSON), by reflect's name.
_SPECIAL_KINDS = {
    "v1.Time": "time",  # an RFC 3339 string or null
    "v1.MicroTime": "microtime",  # RFC 3339 with exactly six fractional digits, or null
    "resource.Quantity": "quantity",  # a string or a number, parsed as a quantity
    "intstr.IntOrString": "intorstring",  # a string, or a number that fits an int32
    "runtime.RawExtension": "any",
    "v1.FieldsV1": "any",
}
_NUMBERS = {"int32": ("int", 32), "int64": ("int", 64), "float": ("float", 32), "double": ("float", 64)}


@dataclass(frozen=True)
class GoType:
    """A Go type as decoding sees it: `kind` is string, bool, int, uint, float, bytes, struct, slice, map,
    any, or one of the special kinds (time, microtime, quantity, intorstring)."""

    name: str  # reflect.Type.String(): "string", "v1.PullPolicy", "[]v1.Container", "map[string]string"
    kind: str
    bits: int = 0  # int, uint, float
    elem: GoType | None = None  # slice, map
    model: str = ""  # struct: its definition in the schemas, `io.k8s.api.core.v1.Container`


@cache
def definitions() -> dict[str, Any]:
    """The schemas' definitions, by name (`io.k8s.api.core.v1.Container`)."""
    defs: dict[str, Any] = schema_contents(f"{_SCHEMAS}/_definitions.json", KUBERNETES_VERSION)["$defs"]
    return defs


def _go_name(definition: str) -> str:
    """`io.k8s.api.core.v1.Container` -> `v1.Container` (the package's last element and the type)."""
    return ".".join(definition.rsplit(".", 2)[-2:])


def struct_name(model: str) -> str:
    """The Go struct's own name (reflect's `Name()`), which decoding errors name."""
    return model.rsplit(".", 1)[-1]


def _schema_type(schema: dict[str, Any], named: str | None) -> GoType:
    ref = schema.get("$ref")
    if ref is not None:
        model = ref.split(_REF, 1)[1]
        name = _go_name(model)
        if name in _SPECIAL_KINDS:
            return GoType(name, _SPECIAL_KINDS[name])
        return GoType(name, "struct", model=model)
    types = schema.get("type", [])
    kind = next((t for t in ([types] if isinstance(types, str) else types) if t != "null"), "")
    if kind == "array":
        elem = _schema_type(schema.get("items", {}), named[2:] if named and named.startswith("[]") else None)
        return GoType(named or f"[]{elem.name}", "slice", elem=elem)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        elem = _schema_type(schema["additionalProperties"], None)
        return GoType(named or f"map[string]{elem.name}", "map", elem=elem)
    if kind == "string":
        if schema.get("format") == "byte":
            return GoType(named or "[]uint8", "bytes")
        return GoType(named or "string", "string")
    if kind in ("integer", "number"):
        number, bits = _NUMBERS.get(schema.get("format", ""), ("int", 64) if kind == "integer" else ("float", 64))
        return GoType(named or f"{number}{bits}", number, bits)
    if kind == "boolean":
        return GoType(named or "bool", "bool")
    return GoType(named or "interface {}", "any")


@cache
def struct_fields(model: str) -> dict[str, GoType]:
    """The JSON fields of a struct (by its definition) and their Go types."""
    named = NAMED_FIELDS.get(struct_name(model), {})
    properties = definitions()[model].get("properties", {})
    return {field: _schema_type(schema, named.get(field)) for field, schema in properties.items()}


@cache
def _kinds() -> dict[tuple[str, str], str]:
    found = {}
    for model, definition in definitions().items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            group_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            found[(group_version, gvk["kind"])] = model
    return found


def kind_type(api_version: str, kind: str) -> GoType | None:
    """The Go type of a built-in kind; None for the kinds of CRDs and for CRDs themselves, which
    customresources.py decodes by their own schemas."""
    model = _kinds().get((api_version, kind))
    if model is None or kind == "CustomResourceDefinition":
        return None
    return GoType(_go_name(model), "struct", model=model)
