"""PriorityClasses (scheduling.k8s.io/v1), with the two system classes every cluster has."""

from __future__ import annotations

from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    Obj,
    ResourceType,
    meta,
    supported,
    undecodable,
)

SCHEDULING_GROUP = "scheduling.k8s.io"
HIGHEST_USER_PRIORITY = 1_000_000_000
_INT32_RANGE = range(-(2**31), 2**31)
_PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")


def _system_priority_class(name: str, value: int, description: str) -> Obj:
    return {
        "kind": "PriorityClass",
        "apiVersion": f"{SCHEDULING_GROUP}/v1",
        "metadata": {"name": name},
        "value": value,
        "description": description,
    }


#: The classes every cluster is bootstrapped with (pkg/apis/scheduling/v1/helpers.go); they cannot be deleted.
SYSTEM_PRIORITY_CLASSES: tuple[Obj, ...] = (
    _system_priority_class(
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    _system_priority_class(
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
)


def _go_json_kind(value: Any) -> str:
    """How Go's JSON decoder names a value that does not fit the field (UnmarshalTypeError.Value)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else "null"


def _check_field_type(obj: Obj, key: str, fits: bool, go_type: str) -> None:
    if not fits:
        found = _go_json_kind(obj[key])
        raise undecodable(
            "PriorityClass",
            f"json: cannot unmarshal {found} into Go struct field PriorityClass.{key} of type {go_type}",
        )


def _default_priority_class(obj: Obj) -> None:
    # `value` is a plain int32 (no pointer, no omitempty): absent or null decodes as 0 and is always written.
    if obj.get("value") is None:
        obj["value"] = 0
    value = obj["value"]
    _check_field_type(obj, "value", type(value) is int and value in _INT32_RANGE, "int32")
    for key, go_type in (("globalDefault", "bool"), ("description", "string"), ("preemptionPolicy", "string")):
        if obj.get(key) is not None:
            _check_field_type(obj, key, isinstance(obj[key], bool if go_type == "bool" else str), go_type)
    # omitempty: false and "" are not written back.
    for key in ("globalDefault", "description"):
        if not obj.get(key):
            obj.pop(key, None)
    if obj.get("preemptionPolicy") is None:
        obj["preemptionPolicy"] = "PreemptLowerPriority"


def _system_class_problem(name: str, value: int, global_default: bool) -> str:
    """IsKnownSystemPriorityClass: why a `system-` class is not one of the system's, or ""."""
    for known in SYSTEM_PRIORITY_CLASSES:
        if known["metadata"]["name"] == name:
            if known["value"] != value:
                return f"value of {name} PriorityClass must be {known['value']}"
            return f"globalDefault of {name} PriorityClass must be false" if global_default else ""
    return f"{name} is not a known system priority class"


def _validate_priority_class(obj: Obj, old: Obj | None) -> list[FieldError]:
    errors: list[FieldError] = []
    policy = obj.get("preemptionPolicy")
    if old is not None:
        # ValidatePriorityClassUpdate: value and preemptionPolicy are fixed, nothing else is re-checked.
        if obj.get("value") != old.get("value"):
            errors.append(FieldError("Forbidden", "value", detail="may not be changed in an update."))
        if policy != old.get("preemptionPolicy"):
            errors.append(FieldError("Invalid", "preemptionPolicy", policy, "field is immutable"))
        return errors
    name, value = meta(obj, "name"), int(obj.get("value") or 0)
    if name.startswith("system-"):
        problem = _system_class_problem(name, value, bool(obj.get("globalDefault")))
        if problem:
            detail = f"priority class names with 'system-' prefix are reserved for system use only. error: {problem}"
            errors.append(FieldError("Forbidden", "metadata.name", detail=detail))
    elif value > HIGHEST_USER_PRIORITY:
        detail = f"maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}"
        errors.append(FieldError("Forbidden", "value", detail=detail))
    if not policy:
        errors.append(FieldError("Required", "preemptionPolicy"))
    elif policy not in _PREEMPTION_POLICIES:
        errors.append(supported("preemptionPolicy", policy, _PREEMPTION_POLICIES))
    return errors


PRIORITY_CLASSES = ResourceType(
    name="priorityclasses",
    singular="priorityclass",
    kind="PriorityClass",
    namespaced=False,
    group=SCHEDULING_GROUP,
    short_names=("pc",),
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
    default=_default_priority_class,
    validate=_validate_priority_class,
)
