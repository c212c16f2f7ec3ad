"""Decoding a built-in kind into its Go type, as the real API server does, with Go's error text. The types
come from kubernetes-validate's strict schemas (builtintypes.py); what those schemas let through and the
server refuses is kept here: the first wrong type in document order worded as Go words it, ints that do
not fit their width, and the values with their own parsers (govalues.py: times, quantities, base64).

Two decoders, for the two ways a body reaches a Go struct:
- `decode_json`: a JSON body (create, update, the result of a merge or JSON patch) through
  sigs.k8s.io/json (the apimachinery serializer's case-sensitive fork of encoding/json). The first
  value of a wrong type (in document order) is the error, worded by encoding/json's
  UnmarshalTypeError: `json: cannot unmarshal bool into Go struct field ObjectMeta.metadata.labels of
  type string` (the innermost struct, then the path of JSON field names from the root, indices left
  out). Types with their own UnmarshalJSON (metav1.Time and MicroTime, resource.Quantity,
  intstr.IntOrString) stop decoding with their own error; `[]byte` takes base64 (or an array of
  bytes). Unknown fields are strict errors, `unknown field "spec.template.spec.containers[0].foo"`.
- `decode_unstructured`: the result of a strategic merge patch, through the DefaultUnstructuredConverter
  (k8s.io/apimachinery/pkg/runtime/converter.go), whose errors are its own (`unrecognized type:
  string`, `cannot restore slice from map`) and whose unknown fields come sorted.

Both return the strict errors and the unknown fields, which the caller drops (Go's structs have nowhere
to keep them); a type error raises `GoDecodeError`. Times are encoded again as the server encodes them
(UTC); other values are checked, not re-encoded: a quantity keeps its spelling (the real server stores its
canonical form) and numbers keep Python's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prewarm_devtools.kubeapi.builtintypes import GoType, struct_fields, struct_name
from prewarm_devtools.kubeapi.goformat import go_float
from prewarm_devtools.kubeapi.govalues import (
    RFC3339,
    RFC3339_MICRO,
    canonical_time,
    parse_base64,
    parse_quantity,
    parse_time,
)

_MAX_STRICT_ERRORS = 100  # sigs.k8s.io/json keeps no more


class GoDecodeError(Exception):
    """The body does not decode into the Go type; the message is Go's."""


@dataclass(frozen=True)
class _Context:
    """encoding/json's errorContext: the innermost struct and the JSON field names from the root."""

    struct: str = ""
    fields: tuple[str, ...] = ()

    def enter(self, struct: str, name: str) -> _Context:
        return _Context(struct, (*self.fields, name))


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _literal(value: Any) -> str:
    return json.dumps(value)


def type_error(value: str, go_type: str, context: _Context) -> str:
    """encoding/json's UnmarshalTypeError text."""
    if context.struct or context.fields:
        where = f"Go struct field {context.struct}.{'.'.join(context.fields)}"
        return f"json: cannot unmarshal {value} into {where} of type {go_type}"
    return f"json: cannot unmarshal {value} into Go value of type {go_type}"


def _int_fits(value: Any, t: GoType) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    low, high = (0, 2**t.bits) if t.kind == "uint" else (-(2 ** (t.bits - 1)), 2 ** (t.bits - 1))
    return bool(low <= value < high)


@dataclass
class Decoded:
    """What decoding found: the strict errors (unknown fields), and those fields, dropped on `drop_unknown()`."""

    strict: list[str]
    unknown: list[tuple[dict[str, Any], str]]

    def drop_unknown(self) -> None:
        for parent, key in self.unknown:
            parent.pop(key, None)


class _JsonDecoding:
    def __init__(self) -> None:
        self.saved: str | None = None  # the first type error, reported once decoding ends
        self.strict: list[str] = []
        self.unknown_fields: list[tuple[dict[str, Any], str]] = []

    def save(self, message: str) -> None:
        if self.saved is None:
            self.saved = message

    def unknown(self, path: str) -> None:
        error = f'unknown field "{path}"'
        if len(self.strict) < _MAX_STRICT_ERRORS and error not in self.strict:
            self.strict.append(error)

    def value(self, t: GoType, value: Any, context: _Context, path: str) -> None:
        if value is None:
            return  # null leaves a value zero or nil, whatever its type
        kind = t.kind
        if kind == "any":
            return
        if kind in ("time", "microtime"):
            # Their UnmarshalJSON reads a string with encoding/json, then time.Parse; errors stop decoding.
            if not isinstance(value, str):
                raise GoDecodeError(type_error(_json_kind(value), "string", context))
            problem = parse_time(value, RFC3339 if kind == "time" else RFC3339_MICRO)
            if problem:
                raise GoDecodeError(problem)
        elif kind == "quantity":
            problem = parse_quantity((value if isinstance(value, str) else _literal(value)).strip())
            if problem:
                raise GoDecodeError(problem)
        elif kind == "intorstring":
            if isinstance(value, str):
                return
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not _int_fits(value, GoType("int32", "int", 32)):
                    raise GoDecodeError(type_error(f"number {_literal(value)}", "int32", context))
                return
            raise GoDecodeError(type_error(_json_kind(value), "int32", context))
        elif kind == "string":
            if not isinstance(value, str):
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind == "bool":
            if not isinstance(value, bool):
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind in ("int", "uint"):
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not _int_fits(value, t):
                    self.save(type_error(f"number {_literal(value)}", t.name, context))
            else:
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind == "bytes":
            if isinstance(value, str):
                problem = parse_base64(value)
                if problem:
                    self.save(problem)
            elif isinstance(value, list):
                for index, item in enumerate(value):
                    self.value(GoType("uint8", "uint", 8), item, context, f"{path}[{index}]")
            else:
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind == "struct":
            if isinstance(value, dict):
                self.struct(t, value, context, path)
            else:
                self.save(type_error(_json_kind(value), t.name, context))
        elif kind == "slice" and isinstance(value, list):
            assert t.elem is not None
            for index, item in enumerate(value):
                self.value(t.elem, item, context, f"{path}[{index}]")
        elif kind == "map" and isinstance(value, dict):
            assert t.elem is not None
            for key, item in value.items():
                self.value(t.elem, item, context, f"{path}.{key}" if path else key)
        else:
            self.save(type_error(_json_kind(value), t.name, context))

    def struct(self, t: GoType, value: dict[str, Any], context: _Context, path: str) -> None:
        fields = struct_fields(t.model)
        name = struct_name(t.model)
        for key in list(value):
            field_path = f"{path}.{key}" if path else key
            if key not in fields:
                self.unknown(field_path)
                self.unknown_fields.append((value, key))
                continue
            self.value(fields[key], value[key], context.enter(name, key), field_path)
            _canonical(fields[key], value, key)


def _canonical(t: GoType, parent: dict[str, Any], key: str) -> None:
    """A decoded time as the server encodes it again: metav1.Time in UTC to the second, MicroTime in UTC to
    the microsecond (so an update that only spells a time otherwise changes nothing)."""
    if t.kind in ("time", "microtime") and isinstance(parent[key], str):
        parent[key] = canonical_time(parent[key], micro=t.kind == "microtime")


def decode_json(t: GoType, value: dict[str, Any]) -> Decoded:
    """Decode a JSON body into `t` (a struct): its strict errors (the unknown fields), or GoDecodeError with
    the first type error."""
    decoding = _JsonDecoding()
    decoding.struct(t, value, _Context(), "")
    if decoding.saved is not None:
        raise GoDecodeError(decoding.saved)
    return Decoded(decoding.strict, decoding.unknown_fields)


# -- the unstructured converter (strategic merge patch) -------------------------------------------------


def _go_kind(value: Any) -> str:
    """reflect's Kind of a value as the converter holds it (ints are int64: PreserveInts)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return "slice" if isinstance(value, list) else "map"


_KIND_NAMES = {"int": "int", "uint": "uint", "float": "float"}


def _reflect_kind(t: GoType) -> str:
    return f"{_KIND_NAMES[t.kind]}{t.bits}" if t.kind in _KIND_NAMES else t.kind


class _Unstructured:
    def __init__(self) -> None:
        self.strict: list[str] = []
        self.unknown_fields: list[tuple[dict[str, Any], str]] = []

    def value(self, t: GoType, value: Any, path: str) -> None:
        if value is None or t.kind == "any":
            return
        kind = t.kind
        if kind in ("time", "microtime", "quantity", "intorstring"):
            # Types with UnmarshalJSON get the value re-encoded as JSON: their own errors, no context.
            try:
                _JsonDecoding().value(t, value, _Context(), path)
            except GoDecodeError as e:
                raise GoDecodeError(str(e)) from None
        elif kind in ("string", "bool", "int", "uint", "float"):
            self.scalar(t, value)
        elif kind == "bytes" and isinstance(value, str):
            problem = parse_base64(value)
            if problem:
                raise GoDecodeError(f"error decoding from json: {problem}")
        elif kind in ("bytes", "slice"):
            if not isinstance(value, list):
                raise GoDecodeError(f"cannot restore slice from {_go_kind(value)}")
            elem = t.elem or GoType("uint8", "uint", 8)
            for index, item in enumerate(value):
                self.value(elem, item, f"{path}[{index}]")
        elif kind == "map":
            if not isinstance(value, dict):
                raise GoDecodeError(f"cannot restore map from {_go_kind(value)}")
            assert t.elem is not None
            for item in value.values():
                self.value(t.elem, item, path)
        else:
            if not isinstance(value, dict):
                raise GoDecodeError(f"cannot restore struct from: {_go_kind(value)}")
            fields = struct_fields(t.model)
            # Go walks the struct's fields in declaration order; the schemas list them sorted.
            for key, field_type in fields.items():
                if key in value:
                    self.value(field_type, value[key], f"{path}.{key}" if path else key)
                    _canonical(field_type, value, key)
            for key in [k for k in value if k not in fields]:
                self.strict.append(f'unknown field "{path}.{key}"' if path else f'unknown field "{key}"')
                self.unknown_fields.append((value, key))

    @staticmethod
    def scalar(t: GoType, value: Any) -> None:
        """fromUnstructured's simple types: assignable or convertible within JSON's four groups."""
        source = _go_kind(value)
        kind = t.kind
        if (source, kind) in (("string", "string"), ("bool", "bool"), ("float64", "float")):
            return
        if source == "int64" and kind in ("int", "uint", "float"):
            return  # converted; a wider int is cut to the field's width, as Go's conversion does
        if source == "float64" and kind in ("int", "uint"):
            if value == int(value):
                return
            raise GoDecodeError(f"cannot convert float64 to {t.name}")
        if source == "int64" and kind == "string":
            raise GoDecodeError(f"cannot convert int64 to {t.name}")
        raise GoDecodeError(f"unrecognized type: {_reflect_kind(t)}")


def decode_unstructured(t: GoType, value: dict[str, Any]) -> Decoded:
    """Convert a patched object (a strategic merge patch's result) into `t`: its strict errors, sorted (the
    unknown fields), or GoDecodeError with the converter's error."""
    converting = _Unstructured()
    converting.value(t, value, "")
    return Decoded(sorted(converting.strict), converting.unknown_fields)


def go_format(value: Any) -> str:
    """Go's `%+v` of a decoded JSON value (map[string]interface{} and friends)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_format(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    if isinstance(value, float):
        return go_float(value)
    return str(value)
