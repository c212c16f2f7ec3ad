"""`ResourceType`, which describes a served resource and what its registry strategy does (built-in
types here, the resources of CRDs in customresources.py), and what the groups' declarations share."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, StatusError, bad_request
from prewarm_devtools.kubeapi.selectors import FieldGetter, SelectorParseError
from prewarm_devtools.kubeapi.validation import metadata_errors

Obj = dict[str, Any]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
COMMON_MERGE_LISTS: dict[str, str | None] = {"metadata.finalizers": None, "metadata.ownerReferences": "uid"}


def meta(obj: Obj, key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


def field_at(*keys: str) -> FieldGetter:
    def get(obj: Obj) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return "" if value is None else str(value)

    return get


def flag_at(*keys: str) -> FieldGetter:
    inner = field_at(*keys)
    # Go formats booleans as true/false; an unset flag is false.
    return lambda obj: "true" if inner(obj) == "True" else "false"


NAME_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": field_at("metadata", "name"),
    "metadata.namespace": field_at("metadata", "namespace"),
}


def undecodable(kind: str, why: str) -> StatusError:
    return bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: {why}')


def object_at(parent: Obj, key: str, kind: str) -> Obj:
    """`parent[key]`, made `{}` when absent or null (Go's zero struct), or 400 when not an object."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    elif not isinstance(value, dict):
        raise undecodable(kind, f"{key} must be an object")
    return value


def supported(where: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    return FieldError("NotSupported", where, value, "supported values: " + ", ".join(f'"{a}"' for a in allowed))


def _fold_string_data(obj: Obj) -> None:
    # Conversion from v1 folds stringData into data; stringData is never stored or returned.
    string_data = obj.pop("stringData", None)
    if string_data:
        if not isinstance(string_data, dict):
            raise undecodable("Secret", "stringData must be a map")
        data = obj.get("data") or {}
        obj["data"] = data
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _noop(obj: Obj, old: Obj | None = None) -> None:
    return None


def _no_errors(obj: Obj, old: Obj | None) -> list[FieldError]:
    return []


def _no_unknown_fields(obj: Obj) -> list[str]:
    return []


@dataclass(frozen=True)
class CustomResource:
    """What the CustomResourceDefinition says of one served version of its resource."""

    definition: str  # the CRD's name, `<plural>.<group>`
    storage_version: str
    schema: Obj | None  # the version's openAPIV3Schema
    columns: tuple[Obj, ...]  # additionalPrinterColumns, or the default AGE
    defaults: bool = False  # whether the schema has `default`s, filled in on every read too


@dataclass(frozen=True)
class ResourceType:
    """One served resource (of a built-in group, or of a CustomResourceDefinition) and the
    behaviour of its registry strategy."""

    name: str
    singular: str
    kind: str
    namespaced: bool
    group: str = ""
    version: str = "v1"
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _ALL_VERBS
    has_status: bool = False
    returns_deleted_object: bool = False
    name_is_label: bool = False
    name_is_path_segment: bool = False
    fields: Mapping[str, FieldGetter] = field(default_factory=dict)
    field_aliases: Mapping[str, str] = field(default_factory=dict)
    default_field_conversion: bool = False
    merge_lists: Mapping[str, str | None] = field(default_factory=dict)
    default: Callable[[Obj], None] = _noop
    prepare_for_create: Callable[[Obj], None] = _noop
    prepare_for_update: Callable[[Obj, Obj], None] = _noop
    validate: Callable[[Obj, Obj | None], list[FieldError]] = _no_errors
    # What a write of the status subresource is checked against; None: the whole object, as on create.
    validate_status: Callable[[Obj, Obj], list[FieldError]] | None = None
    # Drops the fields the type does not know and returns their paths (pruning of custom resources).
    coerce: Callable[[Obj], list[str]] = _no_unknown_fields
    # Whether PUT may leave out metadata.resourceVersion (AllowUnconditionalUpdate).
    unconditional_update: bool = True
    # The store's collection when it is not `name` (custom resources: `<plural>.<group>`).
    store_name: str = ""
    custom: CustomResource | None = None
    list_kind_name: str = ""

    @property
    def list_kind(self) -> str:
        return self.list_kind_name or self.kind + "List"

    @property
    def storage(self) -> str:
        """The store's collection of these objects (shared by every served version of a custom resource)."""
        return self.store_name or self.name

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def field_values(self, obj: Obj) -> dict[str, str]:
        """The values of the selectable fields of `obj`."""
        return {name: get(obj) for name, get in self.fields.items()}

    def convert_field(self, label: str) -> str:
        """The canonical field label, or SelectorParseError worded as the API server words it."""
        label = self.field_aliases.get(label, label)
        if label in self.fields:
            return label
        if self.default_field_conversion:
            raise SelectorParseError(
                f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'
            )
        raise SelectorParseError(f"field label not supported: {label}")

    def decode(self, obj: Obj) -> list[str]:
        """What decoding the request body does: conversion quirks, pruning, then defaulting; the
        paths of the unknown fields it dropped."""
        if self.kind == "Secret":
            _fold_string_data(obj)
        unknown = self.coerce(obj)
        self.default(obj)
        return unknown

    def full_validation(self, obj: Obj, old: Obj | None) -> list[FieldError]:
        metadata = obj.get("metadata") or {}
        errors = metadata_errors(
            metadata,
            name_is_label=self.name_is_label,
            namespaced=self.namespaced,
            path_segment_name=self.name_is_path_segment,
        )
        return errors + self.validate(obj, old)
