"""ValidatingAdmissionPolicies, enforced: every write a client makes passes the policies bound to it.

The API server runs each stored `ValidatingAdmissionPolicyBinding`'s policy on the writes its
`matchConstraints` (and the binding's `matchResources`) select: `matchConditions` first, then
`variables`, then each validation, with `object`, `oldObject`, `request` (operation, `userInfo`
with the caller's groups and extra, name, namespace, resource) and `params` (the binding's
`paramRef`, read from the store). A failed validation denies the write when the binding's
`validationActions` has `Deny` (403 for `reason: Forbidden`, 422 otherwise, with the API server's
message) and adds a Warning header with `Warn`. An expression that does not evaluate is an error
that `failurePolicy: Fail` turns into a denial.

CEL is `cel.py`'s (cel-python): a policy that uses Kubernetes' own CEL libraries fails to compile and,
with `failurePolicy: Fail`, denies. Writes the API server makes itself (seeding, garbage collection)
carry no caller and are not admitted, as on a real cluster. Kubernetes 1.30 semantics
(admissionregistration.k8s.io/v1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.cel import CelCompileError, CelFailure, CelPrograms
from prewarm_devtools.kubeapi.errors import StatusError
from prewarm_devtools.kubeapi.resources.admissionregistration import (
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from prewarm_devtools.kubeapi.resources.apps import selector_requirements
from prewarm_devtools.kubeapi.resources.core import NAMESPACES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.selectors import LabelSelector
from prewarm_devtools.kubeapi.store import Store

Obj = dict[str, Any]


@dataclass(frozen=True)
class Write:
    """One write as admission sees it (`obj` None: a delete; `old` None: a create)."""

    operation: str  # CREATE, UPDATE, DELETE
    rtype: ResourceType
    namespace: str | None
    name: str
    obj: Obj | None
    old: Obj | None
    user: Identity
    subresource: str = ""
    dry_run: bool = False


class PolicyFailure(Exception):
    """An expression did not compile or evaluate."""


def structured_selector(selector: Obj | None) -> LabelSelector:
    """A `matchLabels`/`matchExpressions` selector as the parsed kind (None and {} match everything;
    validation refused any other that does not convert)."""
    return LabelSelector(tuple(selector_requirements(selector or {}) or ()))


def _listed(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or [])
    return "*" in values or wanted in values


def _rule_matches(rule: Obj, write: Write) -> bool:
    resource = f"{write.rtype.name}/{write.subresource}" if write.subresource else write.rtype.name
    resources = list(rule.get("resources") or [])
    resource_ok = (resource in resources or "*/*" in resources
                   or ("*" in resources and not write.subresource)
                   or (write.subresource != "" and f"*/{write.subresource}" in resources)
                   or (f"{write.rtype.name}/*" in resources and write.subresource != ""))
    if not resource_ok:
        return False
    if rule.get("resourceNames") and write.name not in rule["resourceNames"]:
        return False
    scope = rule.get("scope", "*")
    if (scope == "Cluster" and write.rtype.namespaced) or (scope == "Namespaced" and not write.rtype.namespaced):
        return False
    return (_listed(rule.get("apiGroups"), write.rtype.group) and _listed(rule.get("apiVersions"), write.rtype.version)
            and _listed(rule.get("operations"), write.operation))


class AdmissionPolicies:
    """The policies and bindings in `store`, applied to a `Write` (`admit`)."""

    def __init__(self, store: Store, find_type: Callable[[str, str], ResourceType | None]) -> None:
        self.store = store
        self.find_type = find_type  # (apiVersion, kind) -> the served type, for paramKind
        self._programs = CelPrograms()

    # -- matching --------------------------------------------------------------------------------

    def _objects(self, rtype: ResourceType) -> list[Obj]:
        return [entry.obj for entry in self.store.snapshot(rtype.storage).entries]

    def _selected(self, constraints: Obj | None, write: Write, *, binding: bool = False) -> bool:
        """A policy's `matchConstraints` select only what their rules name; a binding's `matchResources`
        without rules narrow the policy's by their selectors alone."""
        if not constraints:
            return binding
        rules = constraints.get("resourceRules") or []
        if (rules or not binding) and not any(_rule_matches(rule, write) for rule in rules):
            return False
        if any(_rule_matches(rule, write) for rule in constraints.get("excludeResourceRules") or []):
            return False
        target = write.obj if write.obj is not None else write.old or {}
        labels = (target.get("metadata") or {}).get("labels") or {}
        object_selector = structured_selector(constraints.get("objectSelector"))
        if not object_selector.matches(labels):
            old_labels = ((write.old or {}).get("metadata") or {}).get("labels") or {}
            if write.old is None or not object_selector.matches(old_labels):
                return False
        namespace_selector = structured_selector(constraints.get("namespaceSelector"))
        if write.rtype.namespaced and not namespace_selector.empty:
            namespace = self.store.get(NAMESPACES.storage, write.namespace or "")
            ns_labels = ((namespace.obj if namespace else {}).get("metadata") or {}).get("labels") or {}
            if not namespace_selector.matches(ns_labels):
                return False
        return True

    # -- CEL -------------------------------------------------------------------------------------

    def _evaluate(self, expression: str, activation: Obj) -> Any:
        try:
            return self._programs.evaluate(expression, activation)
        except CelCompileError as e:
            raise PolicyFailure(str(e)) from None
        except CelFailure as e:
            raise PolicyFailure(f"expression '{expression}' resulted in error: {e}") from None

    @staticmethod
    def _request(write: Write) -> Obj:
        user: Obj = {"username": write.user.user, "groups": list(write.user.groups), "extra": write.user.extra_map}
        if write.user.uid:
            user["uid"] = write.user.uid
        rtype = write.rtype
        return {
            "operation": write.operation, "name": write.name, "namespace": write.namespace or "",
            "userInfo": user, "dryRun": write.dry_run, "subResource": write.subresource,
            "kind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
            "resource": {"group": rtype.group, "version": rtype.version, "resource": rtype.name},
        }

    # -- params ----------------------------------------------------------------------------------

    def _params(self, policy: Obj, binding: Obj, write: Write) -> list[Obj | None] | str:
        """The params to evaluate with ([None] without paramKind), or the denial message."""
        kind = policy["spec"].get("paramKind")
        if not kind:
            return [None]
        rtype = self.find_type(kind.get("apiVersion", ""), kind.get("kind", ""))
        ref = binding["spec"].get("paramRef")
        if rtype is None or not ref:
            return f"failed to configure binding: no params found for {kind.get('kind')}"
        namespace = ref.get("namespace") or (write.namespace if rtype.namespaced else None)
        if ref.get("name"):
            key = f"{namespace}/{ref['name']}" if rtype.namespaced else ref["name"]
            found = self.store.get(rtype.storage, key)
            params = [found.obj] if found is not None else []
        else:
            selector = structured_selector(ref.get("selector"))
            params = [o for o in self._objects(rtype)
                      if (not rtype.namespaced or o["metadata"].get("namespace") == namespace)
                      and selector.matches(o["metadata"].get("labels"))]
        if params:
            return list(params)
        if ref.get("parameterNotFoundAction", "Deny") == "Allow":
            return []
        return "no params found for policy binding with `Deny` parameterNotFoundAction"

    # -- admission -------------------------------------------------------------------------------

    def admit(self, write: Write) -> list[str]:
        """Runs every bound policy that selects `write`; raises the denial, returns the warnings."""
        policies = {p["metadata"]["name"]: p for p in self._objects(VALIDATING_ADMISSION_POLICIES)}
        warnings: list[str] = []
        for binding in self._objects(VALIDATING_ADMISSION_POLICY_BINDINGS):
            policy = policies.get(binding["spec"].get("policyName", ""))
            if policy is None or not self._selected(policy["spec"].get("matchConstraints"), write):
                continue
            if not self._selected(binding["spec"].get("matchResources"), write, binding=True):
                continue
            actions = set(binding["spec"].get("validationActions") or [])
            who = (f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                   f"'{binding['metadata']['name']}'")
            for reason, message in self._run(policy, binding, write):
                if "Warn" in actions:
                    warnings.append(f"Validation failed for {who}: {message}")
                if "Deny" in actions:
                    raise _denial(write, reason, f"{who} denied request: {message}")
        return warnings

    def _run(self, policy: Obj, binding: Obj, write: Write) -> list[tuple[str, str]]:
        """The failed validations of one policy and binding: (reason, message) each."""
        spec = policy["spec"]
        fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
        params = self._params(policy, binding, write)
        if isinstance(params, str):
            return [("Invalid", params)] if fail_closed else []
        failed: list[tuple[str, str]] = []
        for param in params:
            activation: Obj = {"object": write.obj, "oldObject": write.old, "request": self._request(write),
                               "params": param, "variables": {}}
            try:
                if not all(self._evaluate(c["expression"], activation) for c in spec.get("matchConditions") or []):
                    continue
                variables: Obj = {}
                for variable in spec.get("variables") or []:
                    variables[variable["name"]] = self._evaluate(variable["expression"], {**activation,
                                                                                          "variables": variables})
                activation["variables"] = variables
                for validation in spec.get("validations") or []:
                    if self._evaluate(validation["expression"], activation):
                        continue
                    if validation.get("messageExpression"):
                        message = str(self._evaluate(validation["messageExpression"], activation))
                    else:
                        message = validation.get("message") or f"failed expression: {validation['expression']}"
                    failed.append((validation.get("reason", "Invalid"), message))
            except PolicyFailure as e:
                if fail_closed:
                    failed.append(("Invalid", str(e)))
        return failed


def _denial(write: Write, reason: str, text: str) -> StatusError:
    rtype = write.rtype
    if reason == "Forbidden":
        return errors.forbidden_resource(rtype.name, write.name, rtype.group, text)
    code = {"Unauthorized": 401, "RequestEntityTooLarge": 413}.get(reason, 422)
    subject = f"{rtype.name}.{rtype.group}" if rtype.group else rtype.name
    return StatusError(code, reason or "Invalid", f'{subject} "{write.name}" is invalid: {text}',
                       {"name": write.name, "kind": rtype.name, **({"group": rtype.group} if rtype.group else {}),
                        "causes": [{"message": text}]})
