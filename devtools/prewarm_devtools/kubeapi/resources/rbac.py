"""Roles, ClusterRoles and their bindings (rbac.authorization.k8s.io/v1): stored and validated here;
rbac.py authorizes requests by them."""

from __future__ import annotations

from functools import partial
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import COMMON_MERGE_LISTS, NAME_FIELDS, Obj, ResourceType, supported

RBAC_GROUP = "rbac.authorization.k8s.io"


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _rule_errors(rules: Any, namespaced: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    if rules is not None and not isinstance(rules, list):
        return [FieldError("Invalid", "rules", rules, "must be a list of policy rules")]
    for i, rule in enumerate(rules or []):
        where = f"rules[{i}]"
        if not isinstance(rule, dict):
            errors.append(FieldError("Invalid", where, rule, "must be an object"))
            continue
        if not _strings(rule.get("verbs")):
            errors.append(FieldError("Required", f"{where}.verbs", detail="verbs must contain at least one value"))
        urls = _strings(rule.get("nonResourceURLs"))
        if urls:
            if namespaced:
                errors.append(
                    FieldError(
                        "Invalid",
                        f"{where}.nonResourceURLs",
                        urls,
                        "namespaced rules cannot apply to non-resource URLs",
                    )
                )
            if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                errors.append(
                    FieldError(
                        "Invalid",
                        f"{where}.nonResourceURLs",
                        urls,
                        "rules cannot apply to both regular resources and non-resource URLs",
                    )
                )
            continue
        if not _strings(rule.get("apiGroups")):
            errors.append(
                FieldError("Required", f"{where}.apiGroups", detail="resource rules must supply at least one api group")
            )
        if not _strings(rule.get("resources")):
            errors.append(
                FieldError("Required", f"{where}.resources", detail="resource rules must supply at least one resource")
            )
    return errors


def _validate_role(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _rule_errors(obj.get("rules"), namespaced=True)


def _validate_cluster_role(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _rule_errors(obj.get("rules"), namespaced=False)


def _default_binding(obj: Obj) -> None:
    # v1 defaulting: roleRef and User/Group subjects are in the RBAC group unless they say otherwise.
    role_ref = obj.get("roleRef")
    if isinstance(role_ref, dict) and not role_ref.get("apiGroup"):
        role_ref["apiGroup"] = RBAC_GROUP
    for subject in obj.get("subjects") or []:
        if isinstance(subject, dict) and not subject.get("apiGroup") and subject.get("kind") in ("User", "Group"):
            subject["apiGroup"] = RBAC_GROUP


def _binding_errors(obj: Obj, old: Obj | None, role_kinds: tuple[str, ...], namespaced: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    role_ref = obj.get("roleRef")
    if not isinstance(role_ref, dict):
        role_ref = {}
    if role_ref.get("apiGroup") != RBAC_GROUP:
        errors.append(supported("roleRef.apiGroup", role_ref.get("apiGroup") or "", (RBAC_GROUP,)))
    if role_ref.get("kind") not in role_kinds:
        errors.append(supported("roleRef.kind", role_ref.get("kind") or "", role_kinds))
    if not role_ref.get("name"):
        errors.append(FieldError("Required", "roleRef.name"))
    subjects = obj.get("subjects")
    for i, subject in enumerate(subjects if isinstance(subjects, list) else []):
        where = f"subjects[{i}]"
        if not isinstance(subject, dict):
            errors.append(FieldError("Invalid", where, subject, "must be an object"))
            continue
        if not subject.get("name"):
            errors.append(FieldError("Required", f"{where}.name"))
        kind, group = subject.get("kind"), subject.get("apiGroup") or ""
        if kind == "ServiceAccount":
            if group:
                errors.append(supported(f"{where}.apiGroup", group, ("",)))
            if not namespaced and not subject.get("namespace"):
                errors.append(FieldError("Required", f"{where}.namespace"))
        elif kind in ("User", "Group"):
            if group != RBAC_GROUP:
                errors.append(supported(f"{where}.apiGroup", group, (RBAC_GROUP,)))
        else:
            errors.append(supported(f"{where}.kind", kind or "", ("ServiceAccount", "User", "Group")))
    if old is not None and old.get("roleRef") != obj.get("roleRef"):
        errors.append(FieldError("Invalid", "roleRef", obj.get("roleRef"), "cannot change roleRef"))
    return errors


def _validate_role_binding(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _binding_errors(obj, old, ("Role", "ClusterRole"), namespaced=True)


def _validate_cluster_role_binding(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _binding_errors(obj, old, ("ClusterRole",), namespaced=False)


# What the four types share; ValidateRBACName wants a path segment, not a DNS name.
_rbac_type = partial(
    ResourceType,
    group=RBAC_GROUP,
    name_is_path_segment=True,
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
)

ROLES = _rbac_type(name="roles", singular="role", kind="Role", namespaced=True, validate=_validate_role)
CLUSTER_ROLES = _rbac_type(
    name="clusterroles",
    singular="clusterrole",
    kind="ClusterRole",
    namespaced=False,
    validate=_validate_cluster_role,
)
ROLE_BINDINGS = _rbac_type(
    name="rolebindings",
    singular="rolebinding",
    kind="RoleBinding",
    namespaced=True,
    default=_default_binding,
    validate=_validate_role_binding,
)
CLUSTER_ROLE_BINDINGS = _rbac_type(
    name="clusterrolebindings",
    singular="clusterrolebinding",
    kind="ClusterRoleBinding",
    namespaced=False,
    default=_default_binding,
    validate=_validate_cluster_role_binding,
)
