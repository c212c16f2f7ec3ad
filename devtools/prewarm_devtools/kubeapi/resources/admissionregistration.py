"""ValidatingAdmissionPolicies and their bindings (admissionregistration.k8s.io/v1): stored and served
here; admission.py evaluates them."""

from __future__ import annotations

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    Obj,
    ResourceType,
    object_at,
    supported,
)

ADMISSION_GROUP = "admissionregistration.k8s.io"
_VALIDATION_ACTIONS = ("Deny", "Warn", "Audit")


def _default_admission_policy(obj: Obj) -> None:
    # SetDefaults_ValidatingAdmissionPolicySpec and its MatchResources' defaults.
    spec = object_at(obj, "spec", "ValidatingAdmissionPolicy")
    spec.setdefault("failurePolicy", "Fail")
    match = spec.get("matchConstraints")
    if isinstance(match, dict):
        match.setdefault("matchPolicy", "Equivalent")
        match.setdefault("namespaceSelector", {})
        match.setdefault("objectSelector", {})
        for rule in match.get("resourceRules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def _validate_admission_policy(obj: Obj, old: Obj | None) -> list[FieldError]:
    """The required parts of ValidateValidatingAdmissionPolicy; CEL is stored unchecked (no type checking)."""
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    if not (spec.get("matchConstraints") or {}).get("resourceRules"):
        errors.append(FieldError("Required", "spec.matchConstraints.resourceRules"))
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        errors.append(FieldError("Required", "spec.validations",
                                 detail="validations or auditAnnotations must contain at least one item"))
    for i, validation in enumerate(spec.get("validations") or []):
        if not isinstance(validation, dict) or not validation.get("expression"):
            errors.append(FieldError("Required", f"spec.validations[{i}].expression"))
    if spec.get("failurePolicy") not in ("Fail", "Ignore"):
        errors.append(supported("spec.failurePolicy", spec.get("failurePolicy") or "", ("Fail", "Ignore")))
    return errors


def _validate_admission_binding(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    if not spec.get("policyName"):
        errors.append(FieldError("Required", "spec.policyName"))
    actions = spec.get("validationActions") or []
    if not actions:
        errors.append(FieldError("Required", "spec.validationActions"))
    for i, action in enumerate(actions):
        if action not in _VALIDATION_ACTIONS:
            errors.append(supported(f"spec.validationActions[{i}]", action, _VALIDATION_ACTIONS))
    return errors


VALIDATING_ADMISSION_POLICIES = ResourceType(
    name="validatingadmissionpolicies",
    singular="validatingadmissionpolicy",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
    group=ADMISSION_GROUP,
    categories=("api-extensions",),
    has_status=True,
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
    default=_default_admission_policy,
    validate=_validate_admission_policy,
)

VALIDATING_ADMISSION_POLICY_BINDINGS = ResourceType(
    name="validatingadmissionpolicybindings",
    singular="validatingadmissionpolicybinding",
    kind="ValidatingAdmissionPolicyBinding",
    namespaced=False,
    group=ADMISSION_GROUP,
    categories=("api-extensions",),
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
    validate=_validate_admission_binding,
)
