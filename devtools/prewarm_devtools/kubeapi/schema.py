"""The OpenAPI v3 schemas of CustomResourceDefinitions, applied to custom resources as apiextensions-apiserver
applies them (crdschema.py says why a CRD's schema itself is refused).

- `validate`: a custom resource against its version's schema, as kube-openapi's validator words it
  (`spec.x in body must be of type integer: "string"`) and `kubeOpenAPIResultToFieldErrors` turns
  that into field errors.
- `prune`, `apply_defaults`, `drop_nulls`: what decoding a custom resource does before validation:
  unknown fields go (their paths are returned, for warnings or strict decoding), defaults fill in,
  nulls the schema does not allow go.

Evaluated: type (with nullable and x-kubernetes-int-or-string), format (int32, int64; date-time,
date, byte, uuid, ipv4, ipv6, cidr checked; other supported formats accepted), properties, required,
additionalProperties, items, enum, minimum/maximum (exclusive), multipleOf, minLength/maxLength,
pattern (Python's `re` standing in for RE2), minItems/maxItems, uniqueItems,
minProperties/maxProperties, default, x-kubernetes-preserve-unknown-fields and
x-kubernetes-embedded-resource (for pruning). `validationrules.py` evaluates x-kubernetes-validations
(CEL) and the set and map list types. Not evaluated: allOf, anyOf, oneOf, not, and whether defaults
are themselves valid.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.goformat import go_float, go_json, go_value

Obj = dict[str, Any]

#: What a resource's root keeps whatever its schema says.
META_FIELDS = ("apiVersion", "kind", "metadata")
TYPES = ("array", "boolean", "integer", "number", "object", "string")
# The string formats kube-openapi knows (dashes dropped, as it compares them); others are ignored.
_STRING_FORMATS = frozenset(
    [
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
        "k8s-short-name",
        "k8s-long-name",
    ]
)
_UUID = re.compile("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_DATE_TIME = re.compile(r"(?i)^(\d{4}-\d{2}-\d{2})t(\d{2}):(\d{2}):(\d{2})(\.\d+)?(z|[+-]\d{2}:\d{2})$")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


# -- Reading schemas --------------------------------------------------------------------------------


def _types(schema: Obj) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        return ["integer", "string"]
    kind = schema.get("type")
    return [kind] if kind else []


def _format(schema: Obj) -> str:
    """The format the validator applies: what StripUnsupportedFormatsPostProcess leaves."""
    fmt = str(schema.get("format") or "")
    types = _types(schema)
    kind = types[0] if len(types) == 1 else ""
    if kind in ("", "string"):
        return fmt if fmt.replace("-", "") in _STRING_FORMATS else ""
    if kind == "integer":
        return fmt if fmt in ("int32", "int64") else ""
    if kind == "number":
        return fmt if fmt in ("float", "double") else ""
    return ""


def additional_properties(schema: Obj) -> tuple[bool, Obj | None]:
    """Whether additionalProperties is set (true, false or a schema), and its schema."""
    if "additionalProperties" not in schema:
        return False, None
    value = schema["additionalProperties"]
    return True, value if isinstance(value, dict) else None


def items_schema(schema: Obj | None) -> Obj | None:
    """The schema of an array's items, when it gives one."""
    items = (schema or {}).get("items")
    return items if isinstance(items, dict) else None


def field_schema(schema: Obj | None, key: str) -> Obj | None:
    """The schema of an object's field `key`: its property's, else additionalProperties' (when a schema)."""
    properties = (schema or {}).get("properties") or {}
    found = properties[key] if key in properties else (schema or {}).get("additionalProperties")
    return found if isinstance(found, dict) else None


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- Decoding: pruning, defaults, nulls -------------------------------------------------------------


def prune(obj: Obj, schema: Obj | None) -> list[str]:
    """Drop what `schema` does not declare (apiVersion, kind and metadata stay); the dropped paths, sorted."""
    root = {**(schema or {}), "x-kubernetes-embedded-resource": True}
    unknown: list[str] = []
    _prune(obj, root, "", unknown)
    return sorted(unknown)


def _prune(value: Any, schema: Obj | None, path: str, unknown: list[str]) -> None:
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        _prune_known(value, schema, path, unknown)
        return
    if isinstance(value, dict):
        if schema is None:
            unknown.extend(_child(path, k) for k in value)
            value.clear()
            return
        properties = schema.get("properties") or {}
        has_additional, additional = additional_properties(schema)
        for key in list(value):
            if schema.get("x-kubernetes-embedded-resource") and key in META_FIELDS:
                continue
            if key in properties:
                _prune(value[key], properties[key], _child(path, key), unknown)
            elif has_additional:
                _prune(value[key], additional, _child(path, key), unknown)
            else:
                if key not in META_FIELDS or path:
                    unknown.append(_child(path, key))
                del value[key]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _prune(item, items_schema(schema), f"{path}[{i}]", unknown)


def _prune_known(value: Any, schema: Obj | None, path: str, unknown: list[str]) -> None:
    # x-kubernetes-preserve-unknown-fields: unknown keys stay, declared ones are still pruned inside.
    if schema is None:
        return
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        has_additional, additional = additional_properties(schema)
        for key, item in value.items():
            if schema.get("x-kubernetes-embedded-resource") and key in META_FIELDS:
                continue
            if key in properties:
                _prune(item, properties[key], _child(path, key), unknown)
            elif has_additional:
                _prune(item, additional, _child(path, key), unknown)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _prune_known(item, items_schema(schema), f"{path}[{i}]", unknown)


def apply_defaults(value: Any, schema: Obj | None) -> None:
    """Fill in the `default`s of absent fields (and of nulls the schema does not allow)."""
    if schema is None:
        return
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, prop in properties.items():
            if "default" in prop and (key not in value or _null_not_allowed(value[key], prop)):
                value[key] = json.loads(json.dumps(prop["default"]))
        has_additional, additional = additional_properties(schema)
        for key in value:
            if key in properties:
                apply_defaults(value[key], properties[key])
            elif has_additional:
                if additional is not None and "default" in additional and _null_not_allowed(value[key], additional):
                    value[key] = json.loads(json.dumps(additional["default"]))
                apply_defaults(value[key], additional)
    elif isinstance(value, list):
        items = items_schema(schema)
        for i in range(len(value)):
            if items is not None and "default" in items and _null_not_allowed(value[i], items):
                value[i] = json.loads(json.dumps(items["default"]))
            apply_defaults(value[i], items)


def anywhere(schema: Obj | None, test: Callable[[Obj], bool]) -> bool:
    """Whether `test` holds for `schema` or any schema nested in its properties, additionalProperties or
    items."""
    if not isinstance(schema, dict):
        return False
    if test(schema):
        return True
    nested = [*(schema.get("properties") or {}).values(), items_schema(schema), additional_properties(schema)[1]]
    return any(anywhere(n, test) for n in nested)


def has_defaults(schema: Obj | None) -> bool:
    """Whether any place of `schema` has a `default`."""
    return anywhere(schema, lambda s: "default" in s)


def _null_not_allowed(value: Any, schema: Obj | None) -> bool:
    return value is None and schema is not None and not schema.get("nullable")


def drop_nulls(value: Any, schema: Obj | None) -> None:
    """Remove object fields that are null where the schema allows no null and gives no default."""
    if isinstance(value, dict):
        properties = (schema or {}).get("properties") or {}
        for key in list(value):
            field_schema = properties.get(key) if key in properties else additional_properties(schema or {})[1]
            if _null_not_allowed(value[key], field_schema) and "default" not in (field_schema or {}):
                del value[key]
            else:
                drop_nulls(value[key], field_schema)
    elif isinstance(value, list):
        for item in value:
            drop_nulls(item, items_schema(schema))


# -- Validating custom resources --------------------------------------------------------------------


def validate(value: Any, schema: Obj | None, base: str = "") -> list[FieldError]:
    """The field errors of `value` against `schema`; `base` prefixes the field paths but not the
    messages, as the status subresource's validator does (`status.x: ...: x in body ...`)."""
    if not schema:
        return []
    return list(_Validation(base).check(value, schema, ""))


class _Validation:
    def __init__(self, base: str) -> None:
        self.base = base

    def field(self, name: str) -> str:
        name = name.removeprefix(".")
        if not name:
            return self.base
        return f"{self.base}.{name}" if self.base else name

    def invalid(self, name: str, value: Any, message: str) -> FieldError:
        return FieldError("Invalid", self.field(name), go_value(value), message)

    def check(self, value: Any, schema: Obj, path: str) -> Iterator[FieldError]:
        yield from self._type(value, schema, path)
        if value is None:
            yield from self._enum(value, schema, path)
            return
        if isinstance(value, str):
            yield from self._string(value, schema, path)
            yield from self._format(value, schema, path)
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield from self._number(value, schema, path)
        if isinstance(value, list):
            yield from self._array(value, schema, path)
        yield from self._enum(value, schema, path)
        if isinstance(value, dict):
            yield from self._object(value, schema, path)

    def _type_error(self, path: str, type_name: str, found: str) -> FieldError:
        message = f"{path} in body must be of type {type_name}: {json.dumps(found)}"
        return FieldError("TypeInvalid", self.field(path), go_value(found), message)

    def _type(self, value: Any, schema: Obj, path: str) -> Iterator[FieldError]:
        types, fmt = _types(schema), _format(schema)
        if not types and not fmt:
            return
        if value is None:
            if types and not schema.get("nullable"):
                yield self._type_error(path, ",".join(types), "null")
            return
        found, found_format = _json_type(value)
        float_int = found == "number" and float(value).is_integer() and "integer" in types
        int_float = found == "integer" and "number" in types
        if (
            not isinstance(value, str | list)
            and fmt
            and not (found in types or found_format == fmt or float_int or int_float)
        ):
            yield self._type_error(path, fmt, found_format)
        elif fmt and isinstance(value, str | list) and not ("number" in types or "integer" in types):
            return
        elif not (found in types or float_int or int_float):
            yield self._type_error(path, ",".join(types), found)

    def _string(self, value: str, schema: Obj, path: str) -> Iterator[FieldError]:
        # kube-openapi stops at the first failing check of a string.
        longest, shortest, pattern = schema.get("maxLength"), schema.get("minLength"), schema.get("pattern")
        if longest is not None and len(value) > longest:
            unit = "byte" if longest == 1 else "bytes"
            yield FieldError("TooLong", self.field(path), detail=f"may not be more than {longest} {unit}")
        elif shortest is not None and len(value) < shortest:
            yield self.invalid(path, value, f"{path} in body should be at least {shortest} chars long")
        elif pattern:
            try:
                matched = re.search(pattern, value) is not None
            except re.error as e:
                yield self.invalid(path, value, f"{path} in body should match '{pattern}, but pattern is invalid: {e}'")
                return
            if not matched:
                yield self.invalid(path, value, f"{path} in body should match '{pattern}'")

    def _format(self, value: str, schema: Obj, path: str) -> Iterator[FieldError]:
        fmt = _format(schema)
        if fmt and not _format_ok(fmt.replace("-", ""), value):
            yield FieldError(
                "TypeInvalid",
                self.field(path),
                go_value(value),
                f"{path} in body must be of type {fmt}: {json.dumps(value, ensure_ascii=False)}",
            )

    def _number(self, value: int | float, schema: Obj, path: str) -> Iterator[FieldError]:
        types = _types(schema)
        number_type = types[0] if len(types) == 1 and types[0] in ("integer", "number") else ""
        fmt = _format(schema) if number_type == "integer" else ""
        problem = _out_of_range(value, number_type, fmt, "Checked", path)
        if problem:
            # A plain error, not a validation one: the API server reports it at the validator's root.
            yield FieldError("Invalid", self.base, go_value(""), problem)
        factor = schema.get("multipleOf")
        if factor is not None:
            yield from self._multiple_of(value, factor, path)
        for key, sign in (("minimum", -1), ("maximum", 1)):
            bound = schema.get(key)
            if bound is None:
                continue
            exclusive = bool(schema.get("exclusiveMaximum" if sign > 0 else "exclusiveMinimum"))
            boundary_problem = _out_of_range(bound, number_type, fmt, f"{key.capitalize()} boundary", path)
            if boundary_problem:
                yield FieldError("Invalid", self.base, go_value(""), boundary_problem)
            native = isinstance(value, int) and not boundary_problem
            limit: int | float = int(bound) if native else float(bound)
            beyond = (value - limit) * sign
            if beyond > 0 or (exclusive and beyond == 0):
                shown = str(limit) if isinstance(limit, int) else go_float(limit)
                relation = ("less than" if sign > 0 else "greater than") + ("" if exclusive else " or equal to")
                yield self.invalid(path, value, f"{path} in body should be {relation} {shown}")

    def _multiple_of(self, value: int | float, factor: int | float, path: str) -> Iterator[FieldError]:
        if isinstance(value, int):
            whole = int(factor)
            if whole <= 0:
                yield self.invalid(path, whole, f"factor MultipleOf declared for {path} must be positive: {whole}")
            elif int(value / whole) * whole != value:
                yield self.invalid(path, value, f"{path} in body should be a multiple of {whole}")
            return
        if factor <= 0:
            yield self.invalid(
                path,
                float(factor),
                f"factor MultipleOf declared for {path} must be positive: {go_float(float(factor))}",
            )
            return
        ratio = (1 / factor) * value if factor < 1 else value / factor
        if not _is_integral(ratio):
            yield self.invalid(path, value, f"{path} in body should be a multiple of {go_float(float(factor))}")

    def _array(self, value: list[Any], schema: Obj, path: str) -> Iterator[FieldError]:
        items = items_schema(schema)
        if items is not None:
            for i, item in enumerate(value):
                yield from self.check(item, items, f"{path}[{i}]")
        yield from self._count(len(value), schema.get("minItems"), schema.get("maxItems"), "items", path)
        if schema.get("uniqueItems") and any(value[i] in value[:i] for i in range(len(value))):
            yield self.invalid(path, "", f"{path} in body shouldn't contain duplicates")

    def _count(self, size: int, fewest: int | None, most: int | None, what: str, path: str) -> Iterator[FieldError]:
        """minItems/maxItems or minProperties/maxProperties; too many is TooMany (counted in items) either way."""
        if fewest is not None and size < fewest:
            yield self.invalid(path, size, f"{path} in body should have at least {fewest} {what}")
        if most is not None and size > most:
            unit = "item" if most == 1 else "items"
            yield FieldError("TooMany", self.field(path), go_value(size), f"must have at most {most} {unit}")

    def _enum(self, value: Any, schema: Obj, path: str) -> Iterator[FieldError]:
        allowed = schema.get("enum")
        if not allowed or any(_enum_matches(value, candidate) for candidate in allowed):
            return
        shown = ", ".join(json.dumps(a if isinstance(a, str) else go_json(a), ensure_ascii=False) for a in allowed)
        yield FieldError("NotSupported", self.field(path), go_value(value), f"supported values: {shown}")

    def _object(self, value: Obj, schema: Obj, path: str) -> Iterator[FieldError]:
        yield from self._count(len(value), schema.get("minProperties"), schema.get("maxProperties"), "properties", path)
        properties = schema.get("properties") or {}
        has_additional, additional = additional_properties(schema)
        if has_additional and schema["additionalProperties"] is False:
            for key in value:
                if key not in properties:
                    yield self.invalid(path, key, f"{path}.{key} in body is a forbidden property")
        elif additional is not None:
            for key, item in value.items():
                if key not in properties:
                    yield from self.check(item, additional, f"{path}.{key}")
        for key, prop in properties.items():
            if key in value:
                yield from self.check(value[key], prop, _child(path, key))
        for key in schema.get("required") or []:
            if key not in value:
                yield FieldError("Required", self.field(f"{path}.{key}"))


def _json_type(value: Any) -> tuple[str, str]:
    """The JSON type and format kube-openapi infers from a decoded value (Go's int64 and float64)."""
    if isinstance(value, bool):
        return "boolean", ""
    if isinstance(value, int):
        return "integer", "int64"
    if isinstance(value, float):
        return "number", "float64"
    if isinstance(value, str):
        return "string", ""
    return ("array", "") if isinstance(value, list) else ("object", "")


def _out_of_range(value: int | float, number_type: str, fmt: str, what: str, path: str) -> str:
    """IsValueValidAgainstRange: whether an integer field's value (or bound) fits its format."""
    if number_type != "integer":
        return ""
    if isinstance(value, float):
        fits = value.is_integer()
        whole = int(value) if fits else 0
    else:
        fits, whole = True, value
    low, high = _INT_RANGES.get(fmt, _INT_RANGES["int64"])
    if fits and low <= whole <= high:
        return ""
    if fmt:
        return f"{what} value must be of type integer with format {fmt} in {path}"
    return f"{what} value must be of type integer (default format) in {path}"


def _is_integral(value: float) -> bool:
    if not math.isfinite(value):
        return False
    return abs(value - round(value)) <= 1e-9 * max(1.0, abs(value))


def _enum_matches(value: Any, candidate: Any) -> bool:
    # Go converts the value to the enum value's type before comparing: 1 matches 1.0.
    if value is None or isinstance(value, bool) or isinstance(candidate, bool):
        return type(value) is type(candidate) and value == candidate
    if isinstance(candidate, int | float) and isinstance(value, int | float):
        return (int(value) if isinstance(candidate, int) else float(value)) == candidate
    return type(value) is type(candidate) and value == candidate


def _format_ok(fmt: str, value: str) -> bool:
    checks: dict[str, Callable[[str], bool]] = {
        "datetime": _is_date_time,
        "date": _is_date,
        "byte": _is_base64,
        "uuid": lambda v: bool(_UUID.match(v)),
        "ipv4": lambda v: _parses(ipaddress.IPv4Address, v),
        "ipv6": lambda v: ":" in v and _parses(ipaddress.IPv6Address, v),
        "cidr": lambda v: "/" in v and _parses(lambda text: ipaddress.ip_network(text, strict=False), v),
    }
    check = checks.get(fmt)
    return check is None or check(value)


def _parses(parse: Callable[[str], object], value: str) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True


def _is_date(value: str) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return len(value) == 10


def _is_date_time(value: str) -> bool:
    match = _DATE_TIME.match(value)
    if not match or not _is_date(match.group(1)):
        return False
    return int(match.group(2)) <= 23 and int(match.group(3)) <= 59 and int(match.group(4)) <= 59


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True
