"""CustomResourceDefinitions (apiextensions.k8s.io/v1) and the resources they define.

`CUSTOM_RESOURCE_DEFINITIONS` is the CRD type: v1 defaulting, the CRD validation that matters here
(name `<plural>.<group>`, a group with a dot, scope, exactly one storage version, names, printer
columns, the structural schema rules of `schema.py`), generation and storedVersions, and
`definition_status`: what the naming and establishing controllers write, at once.

`custom_resource_types(crd)` are the `ResourceType`s of an established CRD's served versions: one
store collection for all of them, pruning, defaulting, validation against the version's
openAPIV3Schema (with its list types and CEL rules, `validationrules.py`), generation (1 on create,
+1 when anything but metadata, and status when it is a subresource, changes), the status subresource
and the printer columns.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax, StatusError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    CustomResource,
    ResourceType,
    supported,
    undecodable,
)
from prewarm_devtools.kubeapi.schema import (
    apply_defaults,
    drop_nulls,
    go_json,
    has_defaults,
    prune,
    schema_errors,
    validate,
)
from prewarm_devtools.kubeapi.validation import dns1123_subdomain_errors, metadata_errors
from prewarm_devtools.kubeapi.validationrules import (
    NOT_CHECKED,
    blocks_rules,
    has_rules,
    list_type_errors,
    rule_errors,
)

Obj = dict[str, Any]

GROUP = "apiextensions.k8s.io"
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
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
_CREATION_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It "
    "is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
#: The column a CRD without additionalPrinterColumns is shown with.
AGE_COLUMN: Obj = {
    "name": "Age",
    "type": "date",
    "description": _CREATION_DESCRIPTION,
    "jsonPath": ".metadata.creationTimestamp",
}
# The fields of ObjectMeta: anything else under a custom resource's metadata is dropped as unknown.
_OBJECT_META = frozenset(
    [
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    ]
)
_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _undecodable(why: str) -> StatusError:
    return undecodable("CustomResourceDefinition", why)


def _dns1035_errors(value: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _DNS1035.fullmatch(value):
        errors.append(_DNS1035_MSG)
    return errors


# -- Reading a CRD ----------------------------------------------------------------------------------


def _spec(crd: Obj) -> Obj:
    spec = crd.get("spec")
    return spec if isinstance(spec, dict) else {}


def _names(crd: Obj) -> Obj:
    names = _spec(crd).get("names")
    return names if isinstance(names, dict) else {}


def _versions(crd: Obj) -> list[Obj]:
    return [v for v in _spec(crd).get("versions") or [] if isinstance(v, dict)]


def _schema_of(version: Obj) -> Obj | None:
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    return schema if isinstance(schema, dict) else None


def _has_status(version: Obj) -> bool:
    return isinstance((version.get("subresources") or {}).get("status"), dict)


def storage_version(crd: Obj) -> str:
    return next((str(v.get("name")) for v in _versions(crd) if v.get("storage")), "")


def condition(crd: Obj, kind: str) -> Obj | None:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == kind), None)


def is_established(crd: Obj) -> bool:
    found = condition(crd, "Established")
    return found is not None and found.get("status") == "True"


def is_terminating(crd: Obj) -> bool:
    return bool((crd.get("metadata") or {}).get("deletionTimestamp"))


# -- The CRD type -----------------------------------------------------------------------------------


def _default_crd(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec is None:
        spec = obj["spec"] = {}
    if not isinstance(spec, dict):
        raise _undecodable("spec must be an object")
    for key, kind in (("names", dict), ("versions", list)):
        if spec.get(key) is not None and not isinstance(spec[key], kind):
            raise _undecodable(f"spec.{key} must be {'an object' if kind is dict else 'a list'}")
    names = spec.setdefault("names", {})
    if not names.get("singular") and names.get("kind"):
        names["singular"] = str(names["kind"]).lower()
    if not names.get("listKind") and names.get("kind"):
        names["listKind"] = f"{names['kind']}List"
    spec.setdefault("conversion", {"strategy": "None"})


def _stored_versions(obj: Obj, status: Obj) -> None:
    stored = status.setdefault("storedVersions", [])
    storage = storage_version(obj)
    if storage and storage not in stored:
        stored.append(storage)


def _prepare_crd_create(obj: Obj) -> None:
    obj["status"] = {}
    obj["metadata"]["generation"] = 1
    _stored_versions(obj, obj["status"])
    if not obj["status"]["storedVersions"]:
        obj["status"]["storedVersions"] = None


def _prepare_crd_update(obj: Obj, old: Obj) -> None:
    obj["status"] = dict(old.get("status") or {})
    generation = (old.get("metadata") or {}).get("generation") or 1
    obj["metadata"]["generation"] = generation + (1 if obj.get("spec") != old.get("spec") else 0)
    _stored_versions(obj, obj["status"])


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


def _validate_crd(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec, names, versions = _spec(obj), _names(obj), _versions(obj)
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
    any_status = any(_has_status(v) for v in versions)
    if "schema" not in moved or not versions[0].get("schema"):
        for i, version in enumerate(versions):
            if _schema_of(version) is None:
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
        if "schema" not in moved and _schema_of(version) is not None:
            errors += schema_errors(_schema_of(version) or {}, f"{where}.schema.openAPIV3Schema", _has_status(version))
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
    if "schema" in moved and versions and _schema_of(versions[0]) is not None:
        errors += schema_errors(_schema_of(versions[0]) or {}, "spec.validation.openAPIV3Schema", any_status)
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
        ("spec.group", _spec(obj).get("group"), _spec(old).get("group")),
        ("spec.names.plural", _names(obj).get("plural"), _names(old).get("plural")),
    ]
    if is_established(old):
        checks[:0] = [
            ("spec.scope", _spec(obj).get("scope"), _spec(old).get("scope")),
            ("spec.names.kind", _names(obj).get("kind"), _names(old).get("kind")),
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


CUSTOM_RESOURCE_DEFINITIONS = ResourceType(
    name="customresourcedefinitions",
    singular="customresourcedefinition",
    kind="CustomResourceDefinition",
    namespaced=False,
    group=GROUP,
    short_names=("crd", "crds"),
    categories=("api-extensions",),
    has_status=True,
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
    unconditional_update=False,
    default=_default_crd,
    prepare_for_create=_prepare_crd_create,
    prepare_for_update=_prepare_crd_update,
    validate=_validate_crd,
)


# -- What the naming and establishing controllers write ---------------------------------------------


def _set_condition(status: Obj, new: Obj, now: str) -> None:
    conditions = status.setdefault("conditions", [])
    for i, existing in enumerate(conditions):
        if existing.get("type") == new["type"]:
            same = existing.get("status") == new["status"]
            conditions[i] = {**new, "lastTransitionTime": existing.get("lastTransitionTime") if same else now}
            return
    conditions.append({**new, "lastTransitionTime": now})


def definition_status(crd: Obj, group_crds: list[Obj], now: str) -> None:
    """Accept the names no other CRD of the group has accepted, and establish the CRD when they all are
    (NamingConditionController and EstablishingController, done at once)."""
    status = crd.setdefault("status", {})
    requested, accepted = _names(crd), dict(status.get("acceptedNames") or {})
    resources: set[str] = set()
    kinds: set[str] = set()
    for other in group_crds:
        names = (other.get("status") or {}).get("acceptedNames") or {}
        resources.update(str(n) for n in (names.get("plural"), names.get("singular"), *(names.get("shortNames") or [])))
        kinds.update(str(n) for n in (names.get("kind"), names.get("listKind")))
    names_condition = {
        "type": "NamesAccepted",
        "status": "True",
        "reason": "NoConflicts",
        "message": "no conflicts found",
    }

    def take(key: str, used: set[str], reason: str) -> None:
        wanted, have = requested.get(key) or "", accepted.get(key) or ""
        if wanted != have and wanted in used:
            names_condition.update(status="False", reason=reason, message=f'"{wanted}" is already in use')
        elif wanted:
            accepted[key] = wanted
        else:
            accepted.pop(key, None)

    take("plural", resources, "PluralConflict")
    take("singular", resources, "SingularConflict")
    wanted_short = list(requested.get("shortNames") or [])
    if wanted_short != list(accepted.get("shortNames") or []):
        have = set(accepted.get("shortNames") or [])
        taken = [f'"{s}" is already in use' for s in wanted_short if s not in have and s in resources]
        if taken:
            message = taken[0] if len(taken) == 1 else "[" + ", ".join(taken) + "]"
            names_condition.update(status="False", reason="ShortNamesConflict", message=message)
        elif wanted_short:
            accepted["shortNames"] = wanted_short
        else:
            accepted.pop("shortNames", None)
    take("kind", kinds, "KindConflict")
    take("listKind", kinds, "ListKindConflict")
    if requested.get("categories"):
        accepted["categories"] = list(requested["categories"])
    else:
        accepted.pop("categories", None)
    accepted.setdefault("plural", "")
    accepted.setdefault("kind", "")
    status["acceptedNames"] = {
        k: accepted[k] for k in ("plural", "singular", "shortNames", "kind", "listKind", "categories") if k in accepted
    }
    _set_condition(status, names_condition, now)
    if is_established(crd):
        return
    if names_condition["status"] == "True":
        established = {
            "type": "Established",
            "status": "True",
            "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
        }
    else:
        established = {
            "type": "Established",
            "status": "False",
            "reason": "NotAccepted",
            "message": "not all names are accepted",
        }
    _set_condition(status, established, now)


def terminating(crd: Obj, now: str) -> None:
    """What deleting a CRD writes before its objects go: the cleanup finalizer and a Terminating condition."""
    metadata = crd["metadata"]
    metadata.setdefault("deletionTimestamp", now)
    finalizers = metadata.setdefault("finalizers", [])
    if CLEANUP_FINALIZER not in finalizers:
        finalizers.append(CLEANUP_FINALIZER)
    _set_condition(
        crd.setdefault("status", {}),
        {
            "type": "Terminating",
            "status": "True",
            "reason": "InstanceDeletionPending",
            "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
        },
        now,
    )


# -- The resources a CRD defines --------------------------------------------------------------------


def _coerce(schema: Obj | None, obj: Obj) -> list[str]:
    """Decoding a custom resource: ObjectMeta's fields only, the schema's fields only, defaults, no stray nulls."""
    metadata = obj.get("metadata")
    unknown = []
    if isinstance(metadata, dict):
        for key in [k for k in metadata if k not in _OBJECT_META]:
            unknown.append(f"metadata.{key}")
            del metadata[key]
    unknown += prune(obj, schema)
    apply_defaults(obj, schema)
    drop_nulls(obj, schema)
    return unknown


def _prepare_create(has_status: bool, obj: Obj) -> None:
    if has_status:
        obj.pop("status", None)
    obj["metadata"]["generation"] = 1


def _prepare_update(obj: Obj, old: Obj) -> None:
    # The status subresource's copy of the old status is already in place (Registry._update).
    generation = (old.get("metadata") or {}).get("generation") or 1
    changed = {k: v for k, v in obj.items() if k != "metadata"} != {k: v for k, v in old.items() if k != "metadata"}
    obj["metadata"]["generation"] = generation + (1 if changed else 0)


def _with_rules(schema: Obj | None, with_rules: bool, errors: list[FieldError], obj: Obj,
                old: Obj | None) -> list[FieldError]:
    """After the schema's errors, the list types and the CEL rules of the whole object, as both the main and
    the status strategy check them (unless a blocking error keeps the rules from running)."""
    errors = errors + list_type_errors(obj, schema)
    if with_rules:
        errors += [NOT_CHECKED] if blocks_rules(errors) else rule_errors(obj, old, schema)
    return errors


def _validate(schema: Obj | None, with_rules: bool, obj: Obj, old: Obj | None) -> list[FieldError]:
    # ResourceType.full_validation has checked metadata: the schema, list types and CEL rules come next.
    return _with_rules(schema, with_rules, validate(obj, schema), obj, old)


def _validate_status(schema: Obj | None, namespaced: bool, with_rules: bool, obj: Obj, old: Obj) -> list[FieldError]:
    errors = metadata_errors(obj.get("metadata") or {}, name_is_label=False, namespaced=namespaced)
    status_schema = ((schema or {}).get("properties") or {}).get("status")
    if "status" in obj and status_schema:
        errors += validate(obj["status"], status_schema, base="status")
    return _with_rules(schema, with_rules, errors, obj, old)


def custom_resource_types(crd: Obj) -> list[ResourceType]:
    """The resource types of each served version of `crd`, by its accepted names."""
    accepted = (crd.get("status") or {}).get("acceptedNames") or {}
    spec = _spec(crd)
    group, namespaced = str(spec.get("group")), spec.get("scope") == "Namespaced"
    plural = str(accepted.get("plural") or "")
    fields = dict(NAME_FIELDS) if namespaced else {"metadata.name": NAME_FIELDS["metadata.name"]}
    types = []
    for version in _versions(crd):
        if not version.get("served"):
            continue
        schema, has_status = _schema_of(version), _has_status(version)
        columns = tuple(version.get("additionalPrinterColumns") or ()) or (AGE_COLUMN,)
        types.append(
            ResourceType(
                name=plural,
                singular=str(accepted.get("singular") or ""),
                kind=str(accepted.get("kind") or ""),
                list_kind_name=str(accepted.get("listKind") or ""),
                namespaced=namespaced,
                group=group,
                version=str(version.get("name")),
                short_names=tuple(accepted.get("shortNames") or ()),
                categories=tuple(accepted.get("categories") or ()),
                verbs=_ALL_VERBS,
                has_status=has_status,
                fields=fields,
                merge_lists={},
                unconditional_update=False,
                store_name=f"{plural}.{group}",
                custom=CustomResource(
                    str(crd["metadata"]["name"]), storage_version(crd), schema, columns, has_defaults(schema)
                ),
                coerce=partial(_coerce, schema),
                prepare_for_create=partial(_prepare_create, has_status),
                prepare_for_update=_prepare_update,
                validate=partial(_validate, schema, has_rules(schema)),
                validate_status=(partial(_validate_status, schema, namespaced, has_rules(schema))
                                 if has_status else None),
            )
        )
    return types
