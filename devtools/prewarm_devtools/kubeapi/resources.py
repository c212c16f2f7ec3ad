"""The core/v1 resource types served, with what the real registry does for each.

Per type: scope, discovery entry, supported field selectors (pkg/apis/core/v1/conversion.go),
strategic-merge list keys (the OpenAPI `x-kubernetes-patch-merge-key` of release 1.37),
defaulting, create/update preparation (status reset, immutable fields) and validation.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, bad_request
from prewarm_devtools.kubeapi.selectors import FieldGetter, SelectorParseError
from prewarm_devtools.kubeapi.validation import config_key_errors, dns1123_label_errors, metadata_errors

Obj = dict[str, Any]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_COMMON_MERGE_LISTS: dict[str, str | None] = {"metadata.finalizers": None, "metadata.ownerReferences": "uid"}


def _meta(obj: Obj, key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


def _path(*keys: str) -> FieldGetter:
    def get(obj: Obj) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return "" if value is None else str(value)

    return get


def _flag(*keys: str) -> FieldGetter:
    inner = _path(*keys)
    # Go formats booleans as true/false; an unset flag is false.
    return lambda obj: "true" if inner(obj) == "True" else "false"


def _pod_ips(obj: Obj) -> str:
    ips = (obj.get("status") or {}).get("podIPs") or []
    return ",".join(str(ip.get("ip", "")) for ip in ips if isinstance(ip, dict))


def _noop(obj: Obj, old: Obj | None = None) -> None:
    return None


def _no_errors(obj: Obj, old: Obj | None) -> list[FieldError]:
    return []


@dataclass(frozen=True)
class ResourceType:
    """One served resource of core/v1 and the behaviour of its registry strategy."""

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

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The resource as errors name it: `pods`, `roles.rbac.authorization.k8s.io`."""
        return f"{self.name}.{self.group}" if self.group else self.name

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

    def decode(self, obj: Obj) -> None:
        """What decoding the request body does: conversion quirks, then defaulting."""
        if self.kind == "Secret":
            _fold_string_data(obj)
        self.default(obj)

    def full_validation(self, obj: Obj, old: Obj | None) -> list[FieldError]:
        metadata = obj.get("metadata") or {}
        errors = metadata_errors(
            metadata,
            name_is_label=self.name_is_label,
            namespaced=self.namespaced,
            path_segment_name=self.name_is_path_segment,
        )
        return errors + self.validate(obj, old)


# -- Secrets ---------------------------------------------------------------------------------------

SECRET_TYPE_KEYS = {
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
}
_SECRET_MAX_BYTES = 1024 * 1024


def _fold_string_data(obj: Obj) -> None:
    # Conversion from v1 folds stringData into data; stringData is never stored or returned.
    string_data = obj.pop("stringData", None)
    if string_data:
        if not isinstance(string_data, dict):
            raise bad_request('Secret in version "v1" cannot be handled as a Secret: stringData must be a map')
        data = obj.get("data") or {}
        obj["data"] = data
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _decoded_secret_data(obj: Obj) -> dict[str, bytes]:
    data = obj.get("data")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise bad_request('Secret in version "v1" cannot be handled as a Secret: data must be a map of base64 strings')
    decoded = {}
    for key, value in data.items():
        if not isinstance(value, str):
            raise bad_request(
                f'Secret in version "v1" cannot be handled as a Secret: data[{key}] must be a base64 string'
            )
        try:
            # Go's decoder skips line breaks inside base64.
            decoded[key] = base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(
                f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data in data[{key}]'
            ) from None
    return decoded


def _default_secret(obj: Obj) -> None:
    if not obj.get("type"):
        obj["type"] = "Opaque"


def _validate_secret(obj: Obj, old: Obj | None) -> list[FieldError]:
    data = _decoded_secret_data(obj)
    errors: list[FieldError] = []
    for key in data:
        errors += [FieldError("Invalid", f"data[{key}]", key, m) for m in config_key_errors(key)]
    secret_type = obj.get("type") or "Opaque"
    for key in SECRET_TYPE_KEYS.get(secret_type, ()):
        if key not in data:
            errors.append(FieldError("Required", f"data[{key}]"))
    if secret_type in ("kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg"):
        key = SECRET_TYPE_KEYS[secret_type][0]
        if key in data:
            try:
                parsed = json.loads(data[key])
                if not isinstance(parsed, dict):
                    raise ValueError(
                        f"json: cannot unmarshal {type(parsed).__name__} into Go value of type "
                        "map[string]interface {}"
                    )
            except ValueError as e:
                errors.append(FieldError("Invalid", f"data[{key}]", "<secret contents redacted>", str(e)))
    if secret_type == "kubernetes.io/basic-auth" and not data.get("username") and not data.get("password"):
        errors += [FieldError("Required", "data[username]"), FieldError("Required", "data[password]")]
    if secret_type == "kubernetes.io/service-account-token":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if not annotations.get("kubernetes.io/service-account.name"):
            errors.append(FieldError("Required", "metadata.annotations[kubernetes.io/service-account.name]"))
    if sum(len(k) + len(v) for k, v in data.items()) > _SECRET_MAX_BYTES:
        errors.append(FieldError("TooLong", "data", detail=f"must have at most {_SECRET_MAX_BYTES} bytes"))
    if old is not None:
        old_type = old.get("type") or "Opaque"
        if secret_type != old_type:
            errors.append(FieldError("Invalid", "type", secret_type, "field is immutable"))
        if old.get("immutable"):
            if not obj.get("immutable"):
                errors.append(FieldError("Forbidden", "immutable", detail="field is immutable when `immutable` is set"))
            if (obj.get("data") or {}) != (old.get("data") or {}):
                errors.append(FieldError("Forbidden", "data", detail="field is immutable when `immutable` is set"))
    return errors


# -- Pods ------------------------------------------------------------------------------------------


def _default_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_pod(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise bad_request('Pod in version "v1" cannot be handled as a Pod: spec must be an object')
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("resources", {})
            if isinstance(container.get("image"), str) and container["image"]:
                container.setdefault("imagePullPolicy", _default_pull_policy(container["image"]))


def _qos_class(spec: Obj) -> str:
    containers = [c for c in (spec.get("containers") or []) + (spec.get("initContainers") or []) if isinstance(c, dict)]
    resources = [c.get("resources") or {} for c in containers]
    if not any((r.get("requests") or r.get("limits")) for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        if not all(k in limits for k in ("cpu", "memory")):
            return "Burstable"
        if any(requests.get(k, limits[k]) != limits[k] for k in ("cpu", "memory")):
            return "Burstable"
    return "Guaranteed"


def _prepare_pod_create(obj: Obj) -> None:
    spec = obj["spec"]
    # The ServiceAccount admission plugin sets the default account and the priority admission 0.
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("priority", 0)
    obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


_POD_MUTABLE_SPEC = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _spec_without_mutable(spec: Obj) -> Obj:
    spec = json.loads(json.dumps(spec))
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        spec.pop(key, None)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                container.pop("image", None)
    return spec


def _validate_pod(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    containers = spec.get("containers")
    if not containers:
        errors.append(FieldError("Required", "spec.containers"))
    for key in ("containers", "initContainers"):
        seen: set[str] = set()
        for i, container in enumerate(spec.get(key) or []):
            where = f"spec.{key}[{i}]"
            if not isinstance(container, dict):
                errors.append(FieldError("Invalid", where, container, "must be an object"))
                continue
            name = container.get("name")
            if not name:
                errors.append(FieldError("Required", f"{where}.name"))
            else:
                errors += [FieldError("Invalid", f"{where}.name", name, m) for m in dns1123_label_errors(name)]
                if name in seen:
                    errors.append(FieldError("Duplicate", f"{where}.name", name))
                seen.add(name)
            if not container.get("image"):
                errors.append(FieldError("Required", f"{where}.image"))
    if old is not None:
        if _spec_without_mutable(spec) != _spec_without_mutable(old.get("spec") or {}):
            errors.append(FieldError("Forbidden", "spec", detail=_POD_MUTABLE_SPEC))
        old_tolerations = (old.get("spec") or {}).get("tolerations") or []
        new_tolerations = spec.get("tolerations") or []
        if any(t not in new_tolerations for t in old_tolerations):
            errors.append(
                FieldError(
                    "Forbidden",
                    "spec.tolerations",
                    detail="existing toleration can not be modified except its tolerationSeconds",
                )
            )
    return errors


# -- Namespaces and nodes --------------------------------------------------------------------------


def _default_namespace(obj: Obj) -> None:
    # The NamespaceDefaultLabelName feature: the name is always a label.
    name = _meta(obj, "name")
    if name:
        obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = name


def _prepare_namespace_create(obj: Obj) -> None:
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}


def _prepare_namespace_update(obj: Obj, old: Obj) -> None:
    obj["spec"] = old.get("spec") or {}


def _default_node(obj: Obj) -> None:
    status = obj.get("status")
    if isinstance(status, dict) and status.get("capacity") and "allocatable" not in status:
        status["allocatable"] = dict(status["capacity"])


_POD_MERGE_LISTS: dict[str, str | None] = {
    "spec.hostAliases": "ip",
    "spec.imagePullSecrets": "name",
    "spec.evictionResponders": "name",
    "spec.resourceClaims": "name",
    "spec.schedulingGates": "name",
    "spec.topologySpreadConstraints": "topologyKey",
    "spec.volumes": "name",
    "spec.volumes[].ephemeral.volumeClaimTemplate.metadata.finalizers": None,
    "spec.volumes[].ephemeral.volumeClaimTemplate.metadata.ownerReferences": "uid",
    "status.conditions": "type",
    "status.hostIPs": "ip",
    "status.podIPs": "ip",
    "status.resourceClaimStatuses": "name",
    "status.nodeAllocatableResourceClaimStatuses": "resourceClaimName",
    "status.nodeAllocatableResourceClaimStatuses[].mapping": "name",
    "status.nodeAllocatableResourceClaimStatuses[].overhead": "name",
    "status.volumeHealth[].healthConditions": "status",
}
for _containers in ("containers", "initContainers", "ephemeralContainers"):
    _POD_MERGE_LISTS[f"spec.{_containers}"] = "name"
    _POD_MERGE_LISTS[f"spec.{_containers}[].env"] = "name"
    _POD_MERGE_LISTS[f"spec.{_containers}[].ports"] = "containerPort"
    _POD_MERGE_LISTS[f"spec.{_containers}[].volumeDevices"] = "devicePath"
    _POD_MERGE_LISTS[f"spec.{_containers}[].volumeMounts"] = "mountPath"
for _statuses in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
    _POD_MERGE_LISTS[f"status.{_statuses}[].allocatedResourcesStatus"] = "name"
    _POD_MERGE_LISTS[f"status.{_statuses}[].volumeMounts"] = "mountPath"


NODES = ResourceType(
    name="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    short_names=("no",),
    has_status=True,
    fields={"metadata.name": _path("metadata", "name"), "spec.unschedulable": _flag("spec", "unschedulable")},
    merge_lists={
        **_COMMON_MERGE_LISTS,
        "spec.podCIDRs": None,
        "status.addresses": "type",
        "status.conditions": "type",
    },
    default=_default_node,
)

NAMESPACES = ResourceType(
    name="namespaces",
    singular="namespace",
    kind="Namespace",
    namespaced=False,
    short_names=("ns",),
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    has_status=True,
    name_is_label=True,
    fields={"metadata.name": _path("metadata", "name"), "status.phase": _path("status", "phase")},
    merge_lists={**_COMMON_MERGE_LISTS, "status.conditions": "type"},
    default=_default_namespace,
    prepare_for_create=_prepare_namespace_create,
    prepare_for_update=_prepare_namespace_update,
)

PODS = ResourceType(
    name="pods",
    singular="pod",
    kind="Pod",
    namespaced=True,
    short_names=("po",),
    categories=("all",),
    has_status=True,
    returns_deleted_object=True,
    fields={
        "metadata.name": _path("metadata", "name"),
        "metadata.namespace": _path("metadata", "namespace"),
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _flag("spec", "hostNetwork"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.podIPs": _pod_ips,
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    field_aliases={"spec.host": "spec.nodeName"},
    merge_lists={**_COMMON_MERGE_LISTS, **_POD_MERGE_LISTS},
    default=_default_pod,
    prepare_for_create=_prepare_pod_create,
    validate=_validate_pod,
)

SECRETS = ResourceType(
    name="secrets",
    singular="secret",
    kind="Secret",
    namespaced=True,
    fields={
        "type": _path("type"),
        "metadata.namespace": _path("metadata", "namespace"),
        "metadata.name": _path("metadata", "name"),
    },
    merge_lists=_COMMON_MERGE_LISTS,
    default=_default_secret,
    validate=_validate_secret,
)

SERVICE_ACCOUNTS = ResourceType(
    name="serviceaccounts",
    singular="serviceaccount",
    kind="ServiceAccount",
    namespaced=True,
    short_names=("sa",),
    returns_deleted_object=True,
    fields={"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")},
    default_field_conversion=True,
    # imagePullSecrets is atomic (no patch strategy): a strategic merge patch replaces the list.
    merge_lists={**_COMMON_MERGE_LISTS, "secrets": "name"},
)

# -- RBAC (rbac.authorization.k8s.io/v1) -----------------------------------------------------------

RBAC_GROUP = "rbac.authorization.k8s.io"
AUTHORIZATION_GROUP = "authorization.k8s.io"


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


def _supported(where: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    return FieldError("NotSupported", where, value, "supported values: " + ", ".join(f'"{a}"' for a in allowed))


def _binding_errors(obj: Obj, old: Obj | None, role_kinds: tuple[str, ...], namespaced: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    role_ref = obj.get("roleRef")
    if not isinstance(role_ref, dict):
        role_ref = {}
    if role_ref.get("apiGroup") != RBAC_GROUP:
        errors.append(_supported("roleRef.apiGroup", role_ref.get("apiGroup") or "", (RBAC_GROUP,)))
    if role_ref.get("kind") not in role_kinds:
        errors.append(_supported("roleRef.kind", role_ref.get("kind") or "", role_kinds))
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
                errors.append(_supported(f"{where}.apiGroup", group, ("",)))
            if not namespaced and not subject.get("namespace"):
                errors.append(FieldError("Required", f"{where}.namespace"))
        elif kind in ("User", "Group"):
            if group != RBAC_GROUP:
                errors.append(_supported(f"{where}.apiGroup", group, (RBAC_GROUP,)))
        else:
            errors.append(_supported(f"{where}.kind", kind or "", ("ServiceAccount", "User", "Group")))
    if old is not None and old.get("roleRef") != obj.get("roleRef"):
        errors.append(FieldError("Invalid", "roleRef", obj.get("roleRef"), "cannot change roleRef"))
    return errors


def _validate_role_binding(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _binding_errors(obj, old, ("Role", "ClusterRole"), namespaced=True)


def _validate_cluster_role_binding(obj: Obj, old: Obj | None) -> list[FieldError]:
    return _binding_errors(obj, old, ("ClusterRole",), namespaced=False)


def _rbac_type(
    name: str,
    kind: str,
    namespaced: bool,
    validate: Callable[[Obj, Obj | None], list[FieldError]],
    default: Callable[[Obj], None] = _noop,
) -> ResourceType:
    return ResourceType(
        name=name,
        singular=name[:-1],
        kind=kind,
        namespaced=namespaced,
        group=RBAC_GROUP,
        name_is_path_segment=True,
        fields={"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")},
        default_field_conversion=True,
        merge_lists=_COMMON_MERGE_LISTS,
        default=default,
        validate=validate,
    )


ROLES = _rbac_type("roles", "Role", True, _validate_role)
CLUSTER_ROLES = _rbac_type("clusterroles", "ClusterRole", False, _validate_cluster_role)
ROLE_BINDINGS = _rbac_type("rolebindings", "RoleBinding", True, _validate_role_binding, _default_binding)
CLUSTER_ROLE_BINDINGS = _rbac_type(
    "clusterrolebindings", "ClusterRoleBinding", False, _validate_cluster_role_binding, _default_binding
)

# Reviews are answered, never stored: create is their only verb.
SELF_SUBJECT_ACCESS_REVIEWS = ResourceType(
    name="selfsubjectaccessreviews",
    singular="selfsubjectaccessreview",
    kind="SelfSubjectAccessReview",
    namespaced=False,
    group=AUTHORIZATION_GROUP,
    verbs=("create",),
)

SUBJECT_ACCESS_REVIEWS = ResourceType(
    name="subjectaccessreviews",
    singular="subjectaccessreview",
    kind="SubjectAccessReview",
    namespaced=False,
    group=AUTHORIZATION_GROUP,
    verbs=("create",),
)


#: The stored resources, by plural name (unique across the served groups).
RESOURCES: dict[str, ResourceType] = {
    r.name: r
    for r in (
        NAMESPACES,
        NODES,
        PODS,
        SECRETS,
        SERVICE_ACCOUNTS,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        ROLES,
        ROLE_BINDINGS,
    )
}
BY_KIND: dict[str, ResourceType] = {r.kind: r for r in RESOURCES.values()}
REVIEWS: dict[str, ResourceType] = {r.name: r for r in (SELF_SUBJECT_ACCESS_REVIEWS, SUBJECT_ACCESS_REVIEWS)}
#: What each served group version serves, by plural name.
GROUP_VERSIONS: dict[str, dict[str, ResourceType]] = {
    "v1": {name: r for name, r in RESOURCES.items() if not r.group},
    f"{RBAC_GROUP}/v1": {name: r for name, r in RESOURCES.items() if r.group == RBAC_GROUP},
    f"{AUTHORIZATION_GROUP}/v1": REVIEWS,
}


def discovery(group_version: str = "v1") -> dict[str, Any]:
    """The `APIResourceList` of `/api/v1` or `/apis/<group>/<version>`."""
    entries: list[dict[str, Any]] = []
    for r in sorted(GROUP_VERSIONS[group_version].values(), key=lambda r: r.name):
        entry: dict[str, Any] = {
            "name": r.name,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        entries.append(entry)
        if r.has_status:
            entries.append(
                {
                    "name": f"{r.name}/status",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    if "/" not in group_version:
        return {"kind": "APIResourceList", "groupVersion": group_version, "resources": entries}
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


def api_groups() -> list[dict[str, Any]]:
    """The `APIGroup`s of `/apis`: every served group but the core one."""
    groups = []
    for group_version in GROUP_VERSIONS:
        if "/" in group_version:
            name, version = group_version.split("/")
            preferred = {"groupVersion": group_version, "version": version}
            groups.append({"name": name, "versions": [preferred], "preferredVersion": preferred})
    return groups
