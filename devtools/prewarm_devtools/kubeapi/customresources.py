"""CustomResourceDefinitions (apiextensions.k8s.io/v1) and the resources they define.

`CUSTOM_RESOURCE_DEFINITIONS` is the CRD type: v1 defaulting, generation and storedVersions, the CRD
validation of crdvalidation.py, and `definition_status` / `terminating`: what the naming, establishing
and cleanup controllers write, at once. crd.py reads a CRD.

`custom_resource_types(crd)` are the `ResourceType`s of an established CRD's served versions: one
store collection for all of them, pruning, defaulting, validation against the version's
openAPIV3Schema (with its list types and CEL rules, `validationrules.py`, on the main resource and on
the status subresource), generation (1 on create, +1 when anything but metadata, and status when it is
a subresource, changes), the status subresource and the printer columns.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prewarm_devtools.kubeapi.crd import (
    CLEANUP_FINALIZER,
    GROUP,
    has_status_subresource,
    is_established,
    names_of,
    schema_of,
    spec_of,
    storage_version,
    versions_of,
)
from prewarm_devtools.kubeapi.crdvalidation import validate_crd
from prewarm_devtools.kubeapi.errors import FieldError, StatusError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    CustomResource,
    ResourceType,
    undecodable,
)
from prewarm_devtools.kubeapi.schema import apply_defaults, drop_nulls, has_defaults, prune, validate
from prewarm_devtools.kubeapi.validation import metadata_errors
from prewarm_devtools.kubeapi.validationrules import (
    NOT_CHECKED,
    blocks_rules,
    has_rules,
    list_type_errors,
    rule_errors,
)

Obj = dict[str, Any]

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
    validate=validate_crd,
)


# -- What the naming, establishing and cleanup controllers write ------------------------------------


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
    requested, accepted = names_of(crd), dict(status.get("acceptedNames") or {})
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
    spec = spec_of(crd)
    group, namespaced = str(spec.get("group")), spec.get("scope") == "Namespaced"
    plural = str(accepted.get("plural") or "")
    fields = dict(NAME_FIELDS) if namespaced else {"metadata.name": NAME_FIELDS["metadata.name"]}
    types = []
    for version in versions_of(crd):
        if not version.get("served"):
            continue
        schema, has_status = schema_of(version), has_status_subresource(version)
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
