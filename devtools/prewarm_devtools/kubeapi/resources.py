"""The built-in resource types served (core/v1, apps/v1, scheduling.k8s.io/v1, RBAC, access reviews),
with what the real registry does for each; `ResourceType` also describes the resources of CRDs
(customresources.py), and catalog.py adds the CRDs' own type.

Per type: scope, discovery entry, supported field selectors (pkg/apis/core/v1/conversion.go and
each registry's strategy), strategic-merge list keys (the OpenAPI `x-kubernetes-patch-merge-key`
of release 1.37), defaulting, create/update preparation (status reset, generation, immutable
fields) and validation.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, GoSyntax, StatusError, bad_request
from prewarm_devtools.kubeapi.selectors import FieldGetter, Requirement, SelectorParseError
from prewarm_devtools.kubeapi.validation import (
    config_key_errors,
    dns1123_label_errors,
    label_value_errors,
    metadata_errors,
    qualified_name_errors,
)

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


def _no_unknown_fields(obj: Obj) -> list[str]:
    return []


@dataclass(frozen=True)
class CustomResource:
    """What the CustomResourceDefinition says of one served version of its resource."""

    definition: str  # the CRD's name, `<plural>.<group>`
    storage_version: str
    schema: Obj | None  # the version's openAPIV3Schema
    columns: tuple[Obj, ...]  # additionalPrinterColumns, or the default AGE


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
            raise _undecodable("Secret", "stringData must be a map")
        data = obj.get("data") or {}
        obj["data"] = data
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _undecodable(kind: str, why: str) -> StatusError:
    return bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: {why}')


def _decoded_base64(obj: Obj, kind: str, key: str) -> dict[str, bytes]:
    """The map of base64 strings at `key` (Secret `data`, ConfigMap `binaryData`), decoded."""
    data = obj.get(key)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _undecodable(kind, f"{key} must be a map of base64 strings")
    decoded = {}
    for name, value in data.items():
        if not isinstance(value, str):
            raise _undecodable(kind, f"{key}[{name}] must be a base64 string")
        try:
            # Go's decoder skips line breaks inside base64.
            decoded[name] = base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            raise _undecodable(kind, f"illegal base64 data in {key}[{name}]") from None
    return decoded


def _immutable_errors(obj: Obj, old: Obj, keys: tuple[str, ...]) -> list[FieldError]:
    """Once `immutable: true` is stored, it stays and `keys` may not change (Secrets, ConfigMaps)."""
    if not old.get("immutable"):
        return []
    errors = []
    why = "field is immutable when `immutable` is set"
    if not obj.get("immutable"):
        errors.append(FieldError("Forbidden", "immutable", detail=why))
    for key in keys:
        if (obj.get(key) or {}) != (old.get(key) or {}):
            errors.append(FieldError("Forbidden", key, detail=why))
    return errors


def _default_secret(obj: Obj) -> None:
    if not obj.get("type"):
        obj["type"] = "Opaque"


def _validate_secret(obj: Obj, old: Obj | None) -> list[FieldError]:
    data = _decoded_base64(obj, "Secret", "data")
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
        errors += _immutable_errors(obj, old, ("data",))
    return errors


# -- Pods ------------------------------------------------------------------------------------------


def _default_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _object_at(parent: Obj, key: str, kind: str) -> Obj:
    """`parent[key]`, made `{}` when absent or null (Go's zero struct), or 400 when not an object."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    elif not isinstance(value, dict):
        raise _undecodable(kind, f"{key} must be an object")
    return value


def _default_pod(obj: Obj) -> None:
    spec = _object_at(obj, "spec", "Pod")
    _default_pod_spec(spec)
    # SetDefaults_Pod, not SetDefaults_PodSpec: pod templates do not get it.
    spec.setdefault("enableServiceLinks", True)


def _default_pod_spec(spec: Obj) -> None:
    """SetDefaults_PodSpec and its containers' defaults: for pods and for pod templates."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
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


def _pod_spec_errors(spec: Obj, path: str) -> list[FieldError]:
    """The containers' checks of ValidatePodSpec, for a pod (`spec`) or a template (`spec.template.spec`)."""
    errors: list[FieldError] = []
    if not spec.get("containers"):
        errors.append(FieldError("Required", f"{path}.containers"))
    for key in ("containers", "initContainers"):
        seen: set[str] = set()
        for i, container in enumerate(spec.get(key) or []):
            where = f"{path}.{key}[{i}]"
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
    return errors


def _validate_pod(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors = _pod_spec_errors(spec, "spec")
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

# -- ConfigMaps and Events (core/v1) --------------------------------------------------------------


def _default_config_map(obj: Obj) -> None:
    data = obj.get("data")
    if data is None:
        return
    if not isinstance(data, dict):
        raise _undecodable("ConfigMap", "data must be a map of strings")
    for key, value in data.items():
        if not isinstance(value, str):
            raise _undecodable("ConfigMap", f"data[{key}] must be a string")


def _validate_config_map(obj: Obj, old: Obj | None) -> list[FieldError]:
    errors = _immutable_errors(obj, old, ("data", "binaryData")) if old is not None else []
    data: dict[str, str] = obj.get("data") or {}
    binary = _decoded_base64(obj, "ConfigMap", "binaryData")
    for key in data:
        errors += [FieldError("Invalid", f"data[{key}]", key, m) for m in config_key_errors(key)]
        if key in binary:
            errors.append(FieldError("Invalid", f"data[{key}]", key, "duplicate of key present in binaryData"))
    for key in binary:
        errors += [FieldError("Invalid", f"binaryData[{key}]", key, m) for m in config_key_errors(key)]
    size = sum(len(v.encode()) for v in data.values()) + sum(len(v) for v in binary.values())
    if size > _SECRET_MAX_BYTES:
        # ConfigMaps share the Secret limit; the error is about the whole object, whose empty path Go prints `[]`.
        errors.append(FieldError("TooLong", "[]", detail=f"must have at most {_SECRET_MAX_BYTES} bytes"))
    return errors


def _default_event(obj: Obj) -> None:
    # What decoding into the Go struct and encoding it again gives: these fields have no omitempty.
    for key in ("involvedObject", "source"):
        _object_at(obj, key, "Event")
    for key in ("reportingComponent", "reportingInstance"):
        obj.setdefault(key, "")
    for key in ("eventTime", "firstTimestamp", "lastTimestamp"):
        obj.setdefault(key, None)


def _too_long_text(obj: Obj, key: str, limit: int) -> list[FieldError]:
    if len(str(obj.get(key) or "")) > limit:
        return [FieldError("Invalid", key, "", f"can have at most {limit} characters")]
    return []


def _validate_event(obj: Obj, old: Obj | None) -> list[FieldError]:
    """legacyValidateEvent, all that core/v1 checks (on create and update): events.k8s.io checks more."""
    namespace = _meta(obj, "namespace")
    involved_namespace = str((obj.get("involvedObject") or {}).get("namespace") or "")
    mismatch = FieldError("Invalid", "involvedObject.namespace", involved_namespace, "does not match event.namespace")
    errors: list[FieldError] = []
    if not obj.get("eventTime"):
        # An old-style event: a cluster-scoped object's (a Node's) events live in `default`.
        if namespace not in ((involved_namespace,) if involved_namespace else ("", "default")):
            errors.append(mismatch)
        return errors
    if not involved_namespace and namespace not in ("default", "kube-system"):
        errors.append(mismatch)
    component = str(obj.get("reportingComponent") or "")
    if not component:
        errors.append(FieldError("Required", "reportingComponent"))
    errors += [FieldError("Invalid", "reportingComponent", component, m) for m in qualified_name_errors(component)]
    for key, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
        if not obj.get(key):
            errors.append(FieldError("Required", key))
        errors += _too_long_text(obj, key, limit)
    return errors + _too_long_text(obj, "message", 1024)


def _event_source(obj: Obj) -> str:
    return _path("source", "component")(obj) or _path("reportingComponent")(obj)


_NAME_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}

CONFIG_MAPS = ResourceType(
    name="configmaps",
    singular="configmap",
    kind="ConfigMap",
    namespaced=True,
    short_names=("cm",),
    fields=_NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=_COMMON_MERGE_LISTS,
    default=_default_config_map,
    validate=_validate_config_map,
)

EVENTS = ResourceType(
    name="events",
    singular="event",
    kind="Event",
    namespaced=True,
    short_names=("ev",),
    # core/v1 events skip ValidateObjectMeta's name rule: any path segment will do.
    name_is_path_segment=True,
    fields={
        **_NAME_FIELDS,
        **{
            f"involvedObject.{key}": _path("involvedObject", key)
            for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _event_source,
        "type": _path("type"),
    },
    merge_lists=_COMMON_MERGE_LISTS,
    default=_default_event,
    validate=_validate_event,
)

# -- Go renderings of bad values, where field errors print them with %#v ---------------------------


def _go_quote(value: Any) -> str:
    return json.dumps(str(value), ensure_ascii=False)


def _go_strings(values: Any) -> str:
    if values is None:
        return "[]string(nil)"
    return "[]string{" + ", ".join(_go_quote(v) for v in values) + "}"


def _go_string_map(value: Any) -> GoSyntax:
    if value is None:
        return GoSyntax("map[string]string(nil)")
    items = sorted(value.items()) if isinstance(value, dict) else []
    return GoSyntax("map[string]string{" + ", ".join(f"{_go_quote(k)}:{_go_quote(v)}" for k, v in items) + "}")


def _go_label_selector(selector: Any) -> Any:
    if not isinstance(selector, dict):
        return "null"
    expressions = selector.get("matchExpressions")
    if expressions is None:
        rendered = "[]v1.LabelSelectorRequirement(nil)"
    else:
        rendered = (
            "[]v1.LabelSelectorRequirement{"
            + ", ".join(
                f"v1.LabelSelectorRequirement{{Key:{_go_quote(e.get('key', ''))}, "
                f"Operator:{_go_quote(e.get('operator', ''))}, Values:{_go_strings(e.get('values'))}}}"
                for e in expressions
                if isinstance(e, dict)
            )
            + "}"
        )
    return GoSyntax(
        f"v1.LabelSelector{{MatchLabels:{_go_string_map(selector.get('matchLabels'))}, MatchExpressions:{rendered}}}"
    )


def _go_int_or_string(value: Any) -> GoSyntax:
    if isinstance(value, str):
        return GoSyntax(f"intstr.IntOrString{{Type:1, IntVal:0, StrVal:{_go_quote(value)}}}")
    return GoSyntax(f'intstr.IntOrString{{Type:0, IntVal:{value}, StrVal:""}}')


# -- DaemonSets (apps/v1) --------------------------------------------------------------------------

APPS_GROUP = "apps"
_TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
# DaemonSetStatus fields without omitempty: a stored status always has them.
_DAEMON_SET_COUNTS = ("currentNumberScheduled", "numberMisscheduled", "desiredNumberScheduled", "numberReady")
_SELECTOR_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
_PERCENT_MSG = (
    "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', "
    "regex used for validation is '[0-9]+%')"
)


def _template_generation(obj: Obj) -> int:
    """The annotation that apps/v1 carries the internal spec.templateGeneration in (0 when absent)."""
    annotations = (obj.get("metadata") or {}).get("annotations")
    value = annotations.get(_TEMPLATE_GENERATION) if isinstance(annotations, dict) else None
    if value is None:
        return 0
    if not re.fullmatch("[+-]?[0-9]+", str(value)):
        raise _undecodable("DaemonSet", f"strconv.ParseInt: parsing {_go_quote(value)}: invalid syntax")
    return int(value)


def _set_template_generation(obj: Obj, generation: int) -> None:
    metadata = obj["metadata"]
    annotations = metadata.get("annotations")
    if annotations is None:
        annotations = metadata["annotations"] = {}
    if isinstance(annotations, dict):
        annotations[_TEMPLATE_GENERATION] = str(generation)


def _default_daemon_set(obj: Obj) -> None:
    spec = _object_at(obj, "spec", "DaemonSet")
    strategy = _object_at(spec, "updateStrategy", "DaemonSet")
    if not strategy.get("type"):
        strategy["type"] = "RollingUpdate"
    if strategy["type"] == "RollingUpdate":
        rolling = _object_at(strategy, "rollingUpdate", "DaemonSet")
        for key, default in (("maxUnavailable", 1), ("maxSurge", 0)):
            if rolling.get(key) is None:
                rolling[key] = default
    if spec.get("revisionHistoryLimit") is None:
        spec["revisionHistoryLimit"] = 10
    template = _object_at(spec, "template", "DaemonSet")
    _default_pod_spec(_object_at(template, "spec", "DaemonSet"))
    status = obj.get("status")
    if isinstance(status, dict):
        for key in _DAEMON_SET_COUNTS:
            status.setdefault(key, 0)
    _template_generation(obj)


def _prepare_daemon_set_create(obj: Obj) -> None:
    obj["status"] = dict.fromkeys(_DAEMON_SET_COUNTS, 0)
    obj["metadata"]["generation"] = 1
    _set_template_generation(obj, max(1, _template_generation(obj)))


def _prepare_daemon_set_update(obj: Obj, old: Obj) -> None:
    # The registry has already carried the old generation over; only spec changes move it.
    spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
    generation = int(old["metadata"].get("generation") or 0)
    template_generation = _template_generation(old)
    if spec.get("template") != old_spec.get("template"):
        generation, template_generation = generation + 1, template_generation + 1
    elif spec != old_spec:
        generation += 1
    if generation:
        obj["metadata"]["generation"] = generation
    _set_template_generation(obj, template_generation)


def selector_requirements(selector: Obj) -> list[Requirement] | None:
    """LabelSelectorAsSelector of a non-nil selector, or None where it fails (validation says why)."""
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        return None
    requirements = [Requirement(str(k), "=", (str(v),)) for k, v in match_labels.items()]
    for expression in selector.get("matchExpressions") or []:
        operator = _SELECTOR_OPERATORS.get(str(expression.get("operator"))) if isinstance(expression, dict) else None
        if operator is None:
            return None
        values = tuple(str(v) for v in expression.get("values") or [])
        requirements.append(Requirement(str(expression.get("key") or ""), operator, values))
    return requirements


def _label_selector_errors(selector: Any, path: str) -> list[FieldError]:
    """ValidateLabelSelector: label keys and values, and each expression's operator and values."""
    if not isinstance(selector, dict):
        return []
    errors: list[FieldError] = []
    match_labels = selector.get("matchLabels") or {}
    for key, value in match_labels.items() if isinstance(match_labels, dict) else ():
        errors += [FieldError("Invalid", f"{path}.matchLabels", key, m) for m in qualified_name_errors(str(key))]
        errors += [FieldError("Invalid", f"{path}.matchLabels", value, m) for m in label_value_errors(str(value))]
    for i, expression in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(expression, dict):
            errors.append(FieldError("Invalid", where, expression, "must be an object"))
            continue
        operator, values = expression.get("operator"), expression.get("values") or []
        if operator in ("In", "NotIn"):
            if not values:
                detail = "must be specified when `operator` is 'In' or 'NotIn'"
                errors.append(FieldError("Required", f"{where}.values", detail=detail))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                errors.append(FieldError("Forbidden", f"{where}.values", detail=detail))
        else:
            errors.append(FieldError("Invalid", f"{where}.operator", operator, "not a valid selector operator"))
        key = str(expression.get("key") or "")
        errors += [FieldError("Invalid", f"{where}.key", key, m) for m in qualified_name_errors(key)]
    return errors


def _nonnegative(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int) and value < 0:
        return [FieldError("Invalid", path, value, "must be greater than or equal to 0")]
    return []


def _percent(value: Any) -> int | None:
    return int(value[:-1]) if isinstance(value, str) and re.fullmatch("[0-9]+%", value) else None


def _int_or_percent(value: Any) -> int:
    """getIntOrPercentValue: a percent's number, an int, or 0 for anything else (Atoi failing)."""
    percent = _percent(value)
    if percent is not None:
        return percent
    if isinstance(value, str):
        return int(value) if re.fullmatch("[+-]?[0-9]+", value) else 0
    return value if isinstance(value, int) else 0


def _rolling_update_errors(rolling: Obj, path: str) -> list[FieldError]:
    """ValidateRollingUpdateDaemonSet: int or percent, at most 100%, exactly one of the two non-zero."""
    errors: list[FieldError] = []
    keys = ("maxUnavailable", "maxSurge")
    for key in keys:
        value = rolling.get(key)
        if isinstance(value, str) and _percent(value) is None:
            errors.append(FieldError("Invalid", f"{path}.{key}", _go_int_or_string(value), _PERCENT_MSG))
        errors += _nonnegative(value, f"{path}.{key}")
    for key in keys:
        if (_percent(rolling.get(key)) or 0) > 100:
            value = _go_int_or_string(rolling[key])
            errors.append(FieldError("Invalid", f"{path}.{key}", value, "must not be greater than 100%"))
    unavailable, surge = (_int_or_percent(rolling.get(key)) for key in keys)
    if unavailable and surge:
        value = _go_int_or_string(rolling.get("maxSurge"))
        errors.append(
            FieldError("Invalid", f"{path}.maxSurge", value, "may not be set when maxUnavailable is non-zero")
        )
    elif not unavailable and not surge:
        errors.append(FieldError("Required", f"{path}.maxUnavailable", detail="cannot be 0 when maxSurge is 0"))
    return errors


def _update_strategy_errors(strategy: Obj) -> list[FieldError]:
    kind = strategy.get("type")
    if kind == "OnDelete":
        return []
    if kind != "RollingUpdate":
        # Go prints the rollingUpdate pointer's address where there is one; "nil" is all that can be reproduced.
        rolling = "nil" if strategy.get("rollingUpdate") is None else "0xc000000000"
        value = GoSyntax(
            f"apps.DaemonSetUpdateStrategy{{Type:{_go_quote(kind or '')}, "
            f"RollingUpdate:(*apps.RollingUpdateDaemonSet)({rolling})}}"
        )
        return [_supported("spec.updateStrategy", value, ("RollingUpdate", "OnDelete"))]
    rolling_update = strategy.get("rollingUpdate")
    if not isinstance(rolling_update, dict):
        return [FieldError("Required", "spec.updateStrategy.rollingUpdate")]
    return _rolling_update_errors(rolling_update, "spec.updateStrategy.rollingUpdate")


def _validate_daemon_set(obj: Obj, old: Obj | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    template_spec = template.get("spec") or {}
    labels = (template.get("metadata") or {}).get("labels")
    selector = spec.get("selector")
    errors = _label_selector_errors(selector, "spec.selector")
    # A missing selector selects nothing, so it can only fail to match; a broken one is not matched at all.
    requirements = selector_requirements(selector) if isinstance(selector, dict) else []
    if selector is None or (requirements is not None and not all(r.matches(labels or {}) for r in requirements)):
        errors.append(
            FieldError(
                "Invalid",
                "spec.template.metadata.labels",
                _go_string_map(labels),
                "`selector` does not match template `labels`",
            )
        )
    if isinstance(selector, dict) and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        errors.append(
            FieldError(
                "Invalid", "spec.selector", _go_label_selector(selector), "empty selector is invalid for daemonset"
            )
        )
    errors += _pod_spec_errors(template_spec, "spec.template.spec")
    restart_policy = template_spec.get("restartPolicy")
    if restart_policy != "Always":
        errors.append(_supported("spec.template.spec.restartPolicy", restart_policy or "", ("Always",)))
    if template_spec.get("activeDeadlineSeconds") is not None:
        detail = "activeDeadlineSeconds in DaemonSet is not Supported"
        errors.append(FieldError("Forbidden", "spec.template.spec.activeDeadlineSeconds", detail=detail))
    errors += _nonnegative(spec.get("minReadySeconds"), "spec.minReadySeconds")
    errors += _update_strategy_errors(spec.get("updateStrategy") or {})
    errors += _nonnegative(spec.get("revisionHistoryLimit"), "spec.revisionHistoryLimit")
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        errors.append(FieldError("Invalid", "spec.selector", _go_label_selector(selector), "field is immutable"))
    return errors


DAEMON_SETS = ResourceType(
    name="daemonsets",
    singular="daemonset",
    kind="DaemonSet",
    namespaced=True,
    group=APPS_GROUP,
    short_names=("ds",),
    categories=("all",),
    has_status=True,
    fields=_NAME_FIELDS,
    default_field_conversion=True,
    merge_lists={
        **_COMMON_MERGE_LISTS,
        **{f"spec.template.{path}": key for path, key in _COMMON_MERGE_LISTS.items()},
        **{f"spec.template.{path}": key for path, key in _POD_MERGE_LISTS.items() if path.startswith("spec.")},
        "status.conditions": "type",
    },
    default=_default_daemon_set,
    prepare_for_create=_prepare_daemon_set_create,
    prepare_for_update=_prepare_daemon_set_update,
    validate=_validate_daemon_set,
)

# -- PriorityClasses (scheduling.k8s.io/v1) --------------------------------------------------------

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
        raise _undecodable(
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
    name, value = _meta(obj, "name"), int(obj.get("value") or 0)
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
        errors.append(_supported("preemptionPolicy", policy, _PREEMPTION_POLICIES))
    return errors


PRIORITY_CLASSES = ResourceType(
    name="priorityclasses",
    singular="priorityclass",
    kind="PriorityClass",
    namespaced=False,
    group=SCHEDULING_GROUP,
    short_names=("pc",),
    fields=_NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=_COMMON_MERGE_LISTS,
    default=_default_priority_class,
    validate=_validate_priority_class,
)

# -- Admission policies (admissionregistration.k8s.io/v1) ------------------------------------------

ADMISSION_GROUP = "admissionregistration.k8s.io"
_VALIDATION_ACTIONS = ("Deny", "Warn", "Audit")


def _default_admission_policy(obj: Obj) -> None:
    # SetDefaults_ValidatingAdmissionPolicySpec and its MatchResources' defaults.
    spec = _object_at(obj, "spec", "ValidatingAdmissionPolicy")
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
        errors.append(_supported("spec.failurePolicy", spec.get("failurePolicy") or "", ("Fail", "Ignore")))
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
            errors.append(_supported(f"spec.validationActions[{i}]", action, _VALIDATION_ACTIONS))
    return errors


VALIDATING_ADMISSION_POLICIES = ResourceType(
    name="validatingadmissionpolicies",
    singular="validatingadmissionpolicy",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
    group=ADMISSION_GROUP,
    categories=("api-extensions",),
    has_status=True,
    fields=_NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=_COMMON_MERGE_LISTS,
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
    fields=_NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=_COMMON_MERGE_LISTS,
    validate=_validate_admission_binding,
)

# -- RBAC (rbac.authorization.k8s.io/v1) -----------------------------------------------------------

RBAC_GROUP = "rbac.authorization.k8s.io"
AUTHORIZATION_GROUP = "authorization.k8s.io"
AUTHENTICATION_GROUP = "authentication.k8s.io"


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
def _review_type(name: str, kind: str, group: str) -> ResourceType:
    return ResourceType(
        name=name, singular=name[:-1], kind=kind, namespaced=False, group=group, verbs=("create",)
    )


SELF_SUBJECT_ACCESS_REVIEWS = _review_type("selfsubjectaccessreviews", "SelfSubjectAccessReview", AUTHORIZATION_GROUP)
SUBJECT_ACCESS_REVIEWS = _review_type("subjectaccessreviews", "SubjectAccessReview", AUTHORIZATION_GROUP)
# Who the caller is, as authentication saw it (`kubectl auth whoami`).
SELF_SUBJECT_REVIEWS = _review_type("selfsubjectreviews", "SelfSubjectReview", AUTHENTICATION_GROUP)


#: The stored resources, by plural name (unique across the served groups).
RESOURCES: dict[str, ResourceType] = {
    r.name: r
    for r in (
        CONFIG_MAPS,
        EVENTS,
        NAMESPACES,
        NODES,
        PODS,
        SECRETS,
        SERVICE_ACCOUNTS,
        DAEMON_SETS,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        ROLES,
        ROLE_BINDINGS,
        PRIORITY_CLASSES,
        VALIDATING_ADMISSION_POLICIES,
        VALIDATING_ADMISSION_POLICY_BINDINGS,
    )
}
BY_KIND: dict[str, ResourceType] = {r.kind: r for r in RESOURCES.values()}
REVIEWS: dict[str, ResourceType] = {r.name: r for r in (SELF_SUBJECT_ACCESS_REVIEWS, SUBJECT_ACCESS_REVIEWS)}


def _group(group: str) -> dict[str, ResourceType]:
    return {name: r for name, r in RESOURCES.items() if r.group == group}


#: What each served group version serves, by plural name; groups in the order `/apis` lists them.
GROUP_VERSIONS: dict[str, dict[str, ResourceType]] = {
    "v1": _group(""),
    f"{APPS_GROUP}/v1": _group(APPS_GROUP),
    f"{ADMISSION_GROUP}/v1": _group(ADMISSION_GROUP),
    f"{AUTHENTICATION_GROUP}/v1": {SELF_SUBJECT_REVIEWS.name: SELF_SUBJECT_REVIEWS},
    f"{AUTHORIZATION_GROUP}/v1": REVIEWS,
    f"{RBAC_GROUP}/v1": _group(RBAC_GROUP),
    f"{SCHEDULING_GROUP}/v1": _group(SCHEDULING_GROUP),
}
