"""Why a CustomResourceDefinition is refused, as the CRD validation (apiextensions validation.go) words it:
its name `<plural>.<group>`, a group with a dot, scope, exactly one storage version, names, printer
columns, subresources, the structural schema rules (crdschema.py), and the fields an update may not
change."""

from __future__ import annotations

import re
from typing import Any

from prewarm_devtools.kubeapi.crd import (
    has_status_subresource,
    is_established,
    names_of,
    schema_of,
    spec_of,
    versions_of,
)
from prewarm_devtools.kubeapi.crdschema import schema_errors
from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax
from prewarm_devtools.kubeapi.goformat import go_json
from prewarm_devtools.kubeapi.resources.types import supported
from prewarm_devtools.kubeapi.validation import dns1123_subdomain_errors

Obj = dict[str, Any]


_APPROVAL = "api-approved.kubernetes.io"


_DNS1035_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"


_DNS1035 = re.compile(_DNS1035_FMT)


_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    f"character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation "
    f"is '{_DNS1035_FMT}')"
)


_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")


_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")


def _dns1035_errors(value: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _DNS1035.fullmatch(value):
        errors.append(_DNS1035_MSG)
    return errors


def _go_versions(versions: list[Obj], moved: set[str]) -> GoSyntax:
    """spec.versions as field errors print the internal type (Go field names), per-version parts moved up."""
    rendered = []
    for v in versions:
        parts = {
            "Name": v.get("name", ""),
            "Served": bool(v.get("served")),
            "Storage": bool(v.get("storage")),
            "Deprecated": bool(v.get("deprecated")),
            "DeprecationWarning": v.get("deprecationWarning"),
            "Schema": None if "schema" in moved else v.get("schema"),
            "Subresources": None if "subresources" in moved else v.get("subresources"),
            "AdditionalPrinterColumns": None
            if "additionalPrinterColumns" in moved
            else v.get("additionalPrinterColumns"),
            "SelectableFields": v.get("selectableFields"),
        }
        rendered.append("{" + ",".join(f'"{k}":{go_json(x)}' for k, x in parts.items()) + "}")
    return GoSyntax("[" + ",".join(rendered) + "]" if versions else "null")


def _identical(versions: list[Obj], key: str) -> bool:
    """Whether every version has the same `key`: v1-to-internal conversion moves it to the spec then."""
    return bool(versions) and all(v.get(key) == versions[0].get(key) for v in versions)


def validate_crd(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec, names, versions = spec_of(obj), names_of(obj), versions_of(obj)
    group = str(spec.get("group") or "")
    errors: list[FieldError] = []
    name = str(obj["metadata"].get("name") or "")
    if old is None and name and name != f"{names.get('plural') or ''}.{group}":
        errors.append(FieldError("Invalid", "metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if not group:
        errors.append(FieldError("Required", "spec.group"))
    elif dns1123_subdomain_errors(group):
        errors.append(FieldError("Invalid", "spec.group", group, ",".join(dns1123_subdomain_errors(group))))
    elif "." not in group:
        errors.append(FieldError("Invalid", "spec.group", group, "should be a domain with at least one dot"))
    errors += _enum("spec.scope", spec.get("scope"), ("Cluster", "Namespaced"))
    moved = {key for key in ("schema", "subresources", "additionalPrinterColumns") if _identical(versions, key)}
    any_status = any(has_status_subresource(v) for v in versions)
    if "schema" not in moved or not versions[0].get("schema"):
        for i, version in enumerate(versions):
            if schema_of(version) is None:
                errors.append(FieldError("Required", f"spec.versions[{i}].schema.openAPIV3Schema"))
    storage, seen, unique = 0, set(), True
    for i, version in enumerate(versions):
        where = f"spec.versions[{i}]"
        storage += 1 if version.get("storage") else 0
        version_name = str(version.get("name") or "")
        unique = unique and version_name not in seen
        seen.add(version_name)
        if _dns1035_errors(version_name):
            errors.append(FieldError("Invalid", f"{where}.name", version_name, ",".join(_dns1035_errors(version_name))))
        if version.get("deprecationWarning") is not None and not version.get("deprecated"):
            errors.append(
                FieldError(
                    "Invalid",
                    f"{where}.deprecationWarning",
                    version["deprecationWarning"],
                    "can only be set for deprecated versions",
                )
            )
        if "schema" not in moved and schema_of(version) is not None:
            errors += schema_errors(schema_of(version) or {}, f"{where}.schema.openAPIV3Schema",
                                    has_status_subresource(version))
        if "subresources" not in moved:
            errors += _subresource_errors(version.get("subresources"), f"{where}.subresources")
        if "additionalPrinterColumns" not in moved:
            for j, column in enumerate(version.get("additionalPrinterColumns") or []):
                errors += _column_errors(column, f"{where}.additionalPrinterColumns[{j}]")
    if not unique:
        errors.append(
            FieldError("Invalid", "spec.versions", _go_versions(versions, moved), "must contain unique version names")
        )
    if storage != 1:
        errors.append(
            FieldError(
                "Invalid",
                "spec.versions",
                _go_versions(versions, moved),
                "must have exactly one version marked as storage version",
            )
        )
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            errors.append(FieldError("Required", f"spec.names.{key}"))
    errors += names_errors(names, "spec.names")
    if "schema" in moved and versions and schema_of(versions[0]) is not None:
        errors += schema_errors(schema_of(versions[0]) or {}, "spec.validation.openAPIV3Schema", any_status)
    if "subresources" in moved:
        errors += _subresource_errors(versions[0].get("subresources"), "spec.subresources")
    if "additionalPrinterColumns" in moved:
        for j, column in enumerate(versions[0].get("additionalPrinterColumns") or []):
            errors += _column_errors(column, f"spec.additionalPrinterColumns[{j}]")
    errors += _enum("spec.conversion.strategy", (spec.get("conversion") or {}).get("strategy"), ("None", "Webhook"))
    status = obj.get("status") or {}
    errors += names_errors(status.get("acceptedNames") or {}, "status.acceptedNames")
    stored = status.get("storedVersions")
    if not stored:
        errors.append(
            FieldError(
                "Invalid", "status.storedVersions", GoSyntax(go_json(stored)), "must have at least one stored version"
            )
        )
    for i, gone in enumerate(v for v in stored or [] if v not in seen):
        errors.append(
            FieldError(
                "Invalid",
                f"status.storedVersions[{i}]",
                gone,
                (
                    f"missing from spec.versions; {gone} was previously a storage version, and must remain in "
                    f"spec.versions until a storage migration ensures no data remains persisted in {gone} and "
                    f"removes {gone} from status.storedVersions"
                ),
            )
        )
    if old is not None:
        errors += _immutable_errors(obj, old)
    if spec.get("preserveUnknownFields"):
        errors.append(
            FieldError(
                "Invalid",
                "spec.preserveUnknownFields",
                True,
                "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in "
                "spec.versions[*].schema instead",
            )
        )
    protected = group in ("k8s.io", "kubernetes.io") or group.endswith((".k8s.io", ".kubernetes.io"))
    if old is None and protected and _APPROVAL not in (obj["metadata"].get("annotations") or {}):
        errors.append(
            FieldError(
                "Required",
                f"metadata.annotations[{_APPROVAL}]",
                detail=f'protected groups must have approval annotation "{_APPROVAL}", see '
                "https://github.com/kubernetes/enhancements/pull/1111",
            )
        )
    return errors


def _immutable_errors(obj: Obj, old: Obj) -> list[FieldError]:
    """What an update may not change: group and plural always, scope and kind once established."""
    checks = [
        ("spec.group", spec_of(obj).get("group"), spec_of(old).get("group")),
        ("spec.names.plural", names_of(obj).get("plural"), names_of(old).get("plural")),
    ]
    if is_established(old):
        checks[:0] = [
            ("spec.scope", spec_of(obj).get("scope"), spec_of(old).get("scope")),
            ("spec.names.kind", names_of(obj).get("kind"), names_of(old).get("kind")),
        ]
    return [FieldError("Invalid", where, new, "field is immutable") for where, new, was in checks if new != was]


def _enum(where: str, value: Any, allowed: tuple[str, ...]) -> list[FieldError]:
    if not value:
        return [FieldError("Required", where)]
    return [] if value in allowed else [supported(where, value, allowed)]


def names_errors(names: Obj, path: str) -> list[FieldError]:
    """ValidateCustomResourceDefinitionNames."""
    errors: list[FieldError] = []
    for key in ("plural", "singular"):
        value = str(names.get(key) or "")
        if value and _dns1035_errors(value):
            errors.append(FieldError("Invalid", f"{path}.{key}", value, ",".join(_dns1035_errors(value))))
    for key in ("kind", "listKind"):
        value = str(names.get(key) or "")
        if value and _dns1035_errors(value.lower()):
            errors.append(
                FieldError(
                    "Invalid",
                    f"{path}.{key}",
                    value,
                    "may have mixed case, but should otherwise match: " + ",".join(_dns1035_errors(value.lower())),
                )
            )
    for key in ("shortNames", "categories"):
        for i, value in enumerate(names.get(key) or []):
            if _dns1035_errors(str(value)):
                errors.append(FieldError("Invalid", f"{path}.{key}[{i}]", value, ",".join(_dns1035_errors(str(value)))))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        errors.append(
            FieldError("Invalid", f"{path}.listKind", names["listKind"], "kind and listKind may not be the same")
        )
    return errors


def _json_path_errors(path: Any, where: str) -> list[FieldError]:
    text = str(path or "")
    if not text:
        return [FieldError("Invalid", where, text, "must not be empty")]
    if not text.startswith("."):
        return [FieldError("Invalid", where, text, "must be a simple json path starting with .")]
    return []


def _subresource_errors(subresources: Any, path: str) -> list[FieldError]:
    scale = (subresources or {}).get("scale") if isinstance(subresources, dict) else None
    if not isinstance(scale, dict):
        return []
    errors: list[FieldError] = []
    for key, prefix in (("specReplicasPath", ".spec."), ("statusReplicasPath", ".status.")):
        value = scale.get(key)
        if not value:
            errors.append(FieldError("Required", f"{path}.scale.{key}"))
            continue
        problems = _json_path_errors(value, f"{path}.scale.{key}")
        if not problems and not str(value).startswith(prefix):
            problems = [
                FieldError("Invalid", f"{path}.scale.{key}", value, f"should be a json path under {prefix[:-1]}")
            ]
        errors += problems
    return errors


def _column_errors(column: Any, path: str) -> list[FieldError]:
    """ValidateCustomResourceColumnDefinition."""
    column = column if isinstance(column, dict) else {}
    errors: list[FieldError] = []
    if not column.get("name"):
        errors.append(FieldError("Required", f"{path}.name"))
    kinds = ",".join(_COLUMN_TYPES)
    if not column.get("type"):
        errors.append(FieldError("Required", f"{path}.type", detail=f"must be one of {kinds}"))
    elif column["type"] not in _COLUMN_TYPES:
        errors.append(FieldError("Invalid", f"{path}.type", column["type"], f"must be one of {kinds}"))
    if column.get("format") and column["format"] not in _COLUMN_FORMATS:
        errors.append(
            FieldError("Invalid", f"{path}.format", column["format"], f"must be one of {','.join(_COLUMN_FORMATS)}")
        )
    if not column.get("jsonPath"):
        errors.append(FieldError("Required", f"{path}.JSONPath"))
    else:
        errors += _json_path_errors(column["jsonPath"], f"{path}.JSONPath")
    return errors
