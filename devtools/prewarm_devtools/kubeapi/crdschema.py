"""Why a CRD's `openAPIV3Schema` is refused, as apiextensions-apiserver refuses it: the structural schema
rules (pkg/apiserver/schema/validation.go), the metadata a schema may say, and the keywords the CRD
validation forbids (`schema_errors`). schema.py applies a schema to custom resources."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax
from prewarm_devtools.kubeapi.goformat import go_json
from prewarm_devtools.kubeapi.schema import META_FIELDS, TYPES, additional_properties, items_schema

Obj = dict[str, Any]


_NESTED_FORBIDDEN = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)


_UNSUPPORTED = (
    ("id", "id is not supported"),
    ("additionalItems", "additionalItems is not supported"),
    ("patternProperties", "patternProperties is not supported"),
    ("definitions", "definitions is not supported"),
    ("dependencies", "dependencies is not supported"),
    ("$ref", "$ref is not supported"),
)


_INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]


# What the root may hold when the status subresource is on (so that properties.status keeps its meaning).
_ROOT_WITH_STATUS = frozenset(
    [
        "description",
        "type",
        "format",
        "title",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "required",
        "items",
        "properties",
        "externalDocs",
        "example",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    ]
)


_ROOT_WITH_STATUS_NAMES = (
    "[Description Type Format Title Maximum ExclusiveMaximum Minimum ExclusiveMinimum MaxLength MinLength Pattern "
    "MaxItems MinItems UniqueItems MultipleOf Required Items Properties ExternalDocs Example XPreserveUnknownFields "
    "XValidations]"
)


def schema_errors(schema: Obj, path: str, status_enabled: bool) -> list[FieldError]:
    """Why a version's `openAPIV3Schema` (at `path`) is refused: validateCustomResourceDefinitionValidation."""
    errors: list[FieldError] = []
    if status_enabled:
        if schema.get("type") not in (None, "", "object"):
            errors.append(
                FieldError(
                    "Invalid",
                    f"{path}.type",
                    schema["type"],
                    'only "object" is allowed as the type at the root of the schema if the status '
                    "subresource is enabled",
                )
            )
        elif any(
            key not in _ROOT_WITH_STATUS for key, value in schema.items() if value not in (None, False, "", [], {})
        ):
            errors.append(
                FieldError(
                    "Invalid",
                    path,
                    GoSyntax(go_json(schema)),
                    f"only {_ROOT_WITH_STATUS_NAMES} fields are allowed at the root of the schema "
                    "if the status subresource is enabled",
                )
            )
    if schema.get("nullable"):
        errors.append(FieldError("Forbidden", f"{path}.nullable", detail="nullable cannot be true at the root"))
    structural = list(_structural(schema, "root", path))
    errors += sorted(structural, key=str)
    return errors + list(_keywords(schema, path, root=True))


def _structural(schema: Obj, level: str, path: str) -> Iterator[FieldError]:
    """validateStructuralInvariants: what a structural schema needs at every node."""
    kind = schema.get("type") or ""
    if kind == "array" and items_schema(schema) is None:
        yield FieldError("Required", f"{path}.items", detail="must be specified")
    items = items_schema(schema)
    if items is not None:
        yield from _structural(items, "item", f"{path}.items")
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict):
            yield from _structural(prop, "field", f"{path}.properties[{key}]")
    has_additional, additional = additional_properties(schema)
    if has_additional:
        if level == "root":
            yield FieldError("Forbidden", f"{path}.additionalProperties", detail="must not be used at the root")
        if additional is not None:
            yield from _structural(additional, "field", f"{path}.additionalProperties")
    int_or_string = bool(schema.get("x-kubernetes-int-or-string"))
    if int_or_string and schema.get("x-kubernetes-preserve-unknown-fields"):
        yield FieldError(
            "Invalid",
            f"{path}.x-kubernetes-preserve-unknown-fields",
            True,
            "must be false if x-kubernetes-int-or-string is true",
        )
    if int_or_string and schema.get("x-kubernetes-embedded-resource"):
        yield FieldError(
            "Invalid",
            f"{path}.x-kubernetes-embedded-resource",
            True,
            "must be false if x-kubernetes-int-or-string is true",
        )
    yield from _value_validation(schema, path)
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    if embedded and kind != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        yield (
            FieldError("Required", f"{path}.type", detail=detail)
            if not kind
            else FieldError("Invalid", f"{path}.type", kind, detail)
        )
    elif not kind and not int_or_string and not schema.get("x-kubernetes-preserve-unknown-fields"):
        where = {"root": "at the root", "item": "for specified array items", "field": "for specified object fields"}
        yield FieldError("Required", f"{path}.type", detail=f"must not be empty {where[level]}")
    if embedded and has_additional:
        yield FieldError(
            "Forbidden",
            f"{path}.additionalProperties",
            detail="must not be used if x-kubernetes-embedded-resource is set",
        )
    if level == "root" and kind and kind != "object":
        yield FieldError("Invalid", f"{path}.type", kind, "must be object at the root")
    properties = schema.get("properties") or {}
    check_metadata = level == "root" or embedded
    for key in ("kind", "apiVersion"):
        prop = properties.get(key)
        if check_metadata and isinstance(prop, dict) and prop.get("type") != "string":
            yield FieldError("Invalid", f"{path}.properties[{key}].type", prop.get("type") or "", "must be string")
    metadata = properties.get("metadata")
    if isinstance(metadata, dict):
        yield from _metadata_invariants(metadata, check_metadata, level == "root", f"{path}.properties[metadata]")
    if embedded and not schema.get("x-kubernetes-preserve-unknown-fields") and not properties:
        yield FieldError(
            "Required",
            f"{path}.properties",
            detail="must not be empty if x-kubernetes-embedded-resource "
            "is true without x-kubernetes-preserve-unknown-fields",
        )


def _metadata_invariants(metadata: Obj, check: bool, root: bool, path: str) -> Iterator[FieldError]:
    if check and metadata.get("type") != "object":
        yield FieldError("Invalid", f"{path}.type", metadata.get("type") or "", "must be object")
    if root:
        rest = {
            k: v for k, v in metadata.items() if k not in ("type", "default") and v not in (None, False, "", [], {})
        }
        if set(rest.get("properties") or {}) <= {"name", "generateName"}:
            rest.pop("properties", None)
        if rest:
            yield FieldError(
                "Forbidden",
                path,
                detail="must not specify anything other than name and generateName, "
                "but metadata is implicitly specified",
            )


def _value_validation(schema: Obj, path: str) -> Iterator[FieldError]:
    any_of = schema.get("anyOf")
    if any_of != _INT_OR_STRING_ANY_OF:
        for i, nested in enumerate(any_of or []):
            yield from _nested(nested, f"{path}.anyOf[{i}]")
    for i, nested in enumerate(schema.get("allOf") or []):
        if i == 0 and isinstance(nested, dict) and nested.get("anyOf") == _INT_OR_STRING_ANY_OF:
            nested = {k: v for k, v in nested.items() if k != "anyOf"}
        yield from _nested(nested, f"{path}.allOf[{i}]")
    for i, nested in enumerate(schema.get("oneOf") or []):
        yield from _nested(nested, f"{path}.oneOf[{i}]")
    if isinstance(schema.get("not"), dict):
        yield from _nested(schema["not"], f"{path}.not")
    pattern = schema.get("pattern")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as e:
            yield FieldError(
                "Invalid", f"{path}.pattern", pattern, f"must be a valid regular expression, but isn't: {e}"
            )


def _nested(schema: Any, path: str) -> Iterator[FieldError]:
    """validateNestedValueValidation: inside anyOf/allOf/oneOf/not only value validations may stand."""
    if not isinstance(schema, dict):
        return
    yield from _value_validation(schema, path)
    if items_schema(schema) is not None:
        yield from _nested(schema["items"], f"{path}.items")
    for key, prop in (schema.get("properties") or {}).items():
        yield from _nested(prop, f"{path}.properties[{key}]")
    for key, detail in _NESTED_FORBIDDEN:
        if schema.get(key) not in (None, False, "", []):
            yield FieldError("Forbidden", f"{path}.{key}", detail=detail)
    if "metadata" in (schema.get("properties") or {}):
        yield FieldError(
            "Forbidden", f"{path}.properties[metadata]", detail="must not be specified in a nested context"
        )


def _keywords(schema: Obj, path: str, root: bool = False, meta: str = "") -> Iterator[FieldError]:
    """ValidateCustomResourceDefinitionOpenAPISchema: the keywords a CRD schema may not use; `meta` names
    the top-level apiVersion, kind or metadata the schema is inside of (no defaults there)."""
    kind = schema.get("type")
    if kind and kind not in TYPES:
        yield FieldError(
            "NotSupported", f"{path}.type", kind, "supported values: " + ", ".join(f'"{t}"' for t in TYPES)
        )
    if "default" in schema and meta:
        yield FieldError("Forbidden", f"{path}.default", detail=f"must not be set in top-level {meta}")
    for key, detail in _UNSUPPORTED:
        if schema.get(key) not in (None, "", {}, []):
            yield FieldError("Forbidden", f"{path}.{key}", detail=detail)
    if kind == "null":
        yield FieldError(
            "Forbidden", f"{path}.type", detail="type cannot be set to null, use nullable as an alternative"
        )
    if isinstance(schema.get("items"), list):
        yield FieldError("Forbidden", f"{path}.items", detail="items must be a schema object and not an array")
    if schema.get("uniqueItems"):
        yield FieldError(
            "Forbidden",
            f"{path}.uniqueItems",
            detail="uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        )
    has_additional, additional = additional_properties(schema)
    if has_additional:
        if schema.get("properties") and schema["additionalProperties"] is not True:
            yield FieldError(
                "Forbidden",
                f"{path}.additionalProperties",
                detail="additionalProperties and properties are mutual exclusive",
            )
        if additional is not None:
            yield from _keywords(additional, f"{path}.additionalProperties", meta=meta)
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict):
            in_meta = key if root and key in META_FIELDS else meta
            yield from _keywords(prop, f"{path}.properties[{key}]", meta=in_meta)
    if isinstance(schema.get("not"), dict):
        yield from _keywords(schema["not"], f"{path}.not", meta=meta)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for i, nested in enumerate(schema.get(keyword) or []):
            if isinstance(nested, dict):
                yield from _keywords(nested, f"{path}.{keyword}[{i}]", meta=meta)
    items = items_schema(schema)
    if items is not None:
        yield from _keywords(items, f"{path}.items", meta=meta)
