"""The core group (core/v1) but pods (pods.py): nodes, namespaces, secrets, service accounts,
ConfigMaps and Events."""

from __future__ import annotations

import base64
import binascii
import json

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    NAME_FIELDS,
    Obj,
    ResourceType,
    field_at,
    flag_at,
    meta,
    object_at,
    undecodable,
)
from prewarm_devtools.kubeapi.validation import config_key_errors, qualified_name_errors

# -- Nodes and namespaces --------------------------------------------------------------------------


def _default_node(obj: Obj) -> None:
    status = obj.get("status")
    if isinstance(status, dict) and status.get("capacity") and "allocatable" not in status:
        status["allocatable"] = dict(status["capacity"])


def _default_namespace(obj: Obj) -> None:
    # The NamespaceDefaultLabelName feature: the name is always a label.
    name = meta(obj, "name")
    if name:
        obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = name


def _prepare_namespace_create(obj: Obj) -> None:
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}


def _prepare_namespace_update(obj: Obj, old: Obj) -> None:
    obj["spec"] = old.get("spec") or {}


NODES = ResourceType(
    name="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    short_names=("no",),
    has_status=True,
    fields={"metadata.name": field_at("metadata", "name"), "spec.unschedulable": flag_at("spec", "unschedulable")},
    merge_lists={
        **COMMON_MERGE_LISTS,
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
    fields={"metadata.name": field_at("metadata", "name"), "status.phase": field_at("status", "phase")},
    merge_lists={**COMMON_MERGE_LISTS, "status.conditions": "type"},
    default=_default_namespace,
    prepare_for_create=_prepare_namespace_create,
    prepare_for_update=_prepare_namespace_update,
)

# -- Secrets, service accounts and ConfigMaps ------------------------------------------------------

SECRET_TYPE_KEYS = {
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
}
_SECRET_MAX_BYTES = 1024 * 1024


def _decoded_base64(obj: Obj, kind: str, key: str) -> dict[str, bytes]:
    """The map of base64 strings at `key` (Secret `data`, ConfigMap `binaryData`), decoded."""
    data = obj.get(key)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise undecodable(kind, f"{key} must be a map of base64 strings")
    decoded = {}
    for name, value in data.items():
        if not isinstance(value, str):
            raise undecodable(kind, f"{key}[{name}] must be a base64 string")
        try:
            # Go's decoder skips line breaks inside base64.
            decoded[name] = base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            raise undecodable(kind, f"illegal base64 data in {key}[{name}]") from None
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


def _default_config_map(obj: Obj) -> None:
    data = obj.get("data")
    if data is None:
        return
    if not isinstance(data, dict):
        raise undecodable("ConfigMap", "data must be a map of strings")
    for key, value in data.items():
        if not isinstance(value, str):
            raise undecodable("ConfigMap", f"data[{key}] must be a string")


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


SECRETS = ResourceType(
    name="secrets",
    singular="secret",
    kind="Secret",
    namespaced=True,
    fields={
        "type": field_at("type"),
        "metadata.namespace": field_at("metadata", "namespace"),
        "metadata.name": field_at("metadata", "name"),
    },
    merge_lists=COMMON_MERGE_LISTS,
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
    fields=NAME_FIELDS,
    default_field_conversion=True,
    # imagePullSecrets is atomic (no patch strategy): a strategic merge patch replaces the list.
    merge_lists={**COMMON_MERGE_LISTS, "secrets": "name"},
)

CONFIG_MAPS = ResourceType(
    name="configmaps",
    singular="configmap",
    kind="ConfigMap",
    namespaced=True,
    short_names=("cm",),
    fields=NAME_FIELDS,
    default_field_conversion=True,
    merge_lists=COMMON_MERGE_LISTS,
    default=_default_config_map,
    validate=_validate_config_map,
)

# -- Events ----------------------------------------------------------------------------------------


def _default_event(obj: Obj) -> None:
    # What decoding into the Go struct and encoding it again gives: these fields have no omitempty.
    for key in ("involvedObject", "source"):
        object_at(obj, key, "Event")
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
    namespace = meta(obj, "namespace")
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
    return field_at("source", "component")(obj) or field_at("reportingComponent")(obj)


EVENTS = ResourceType(
    name="events",
    singular="event",
    kind="Event",
    namespaced=True,
    short_names=("ev",),
    # core/v1 events skip ValidateObjectMeta's name rule: any path segment will do.
    name_is_path_segment=True,
    fields={
        **NAME_FIELDS,
        **{
            f"involvedObject.{key}": field_at("involvedObject", key)
            for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": field_at("reason"),
        "reportingComponent": field_at("reportingComponent"),
        "source": _event_source,
        "type": field_at("type"),
    },
    merge_lists=COMMON_MERGE_LISTS,
    default=_default_event,
    validate=_validate_event,
)
