"""Pods (core/v1), and the pod spec's defaulting, validation and merge keys, which DaemonSet templates
(apps.py) share."""

from __future__ import annotations

import json

from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import (
    COMMON_MERGE_LISTS,
    Obj,
    ResourceType,
    field_at,
    flag_at,
    object_at,
)
from prewarm_devtools.kubeapi.validation import dns1123_label_errors


def _default_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_pod(obj: Obj) -> None:
    spec = object_at(obj, "spec", "Pod")
    default_pod_spec(spec)
    # SetDefaults_Pod, not SetDefaults_PodSpec: pod templates do not get it.
    spec.setdefault("enableServiceLinks", True)


def default_pod_spec(spec: Obj) -> None:
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


def pod_spec_errors(spec: Obj, path: str) -> list[FieldError]:
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
    errors = pod_spec_errors(spec, "spec")
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


def _pod_ips(obj: Obj) -> str:
    ips = (obj.get("status") or {}).get("podIPs") or []
    return ",".join(str(ip.get("ip", "")) for ip in ips if isinstance(ip, dict))


POD_MERGE_LISTS: dict[str, str | None] = {
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
    **{
        f"spec.{containers}{path}": key
        for containers in ("containers", "initContainers", "ephemeralContainers")
        for path, key in (
            ("", "name"),
            ("[].env", "name"),
            ("[].ports", "containerPort"),
            ("[].volumeDevices", "devicePath"),
            ("[].volumeMounts", "mountPath"),
        )
    },
    **{
        f"status.{statuses}{path}": key
        for statuses in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
        for path, key in (("[].allocatedResourcesStatus", "name"), ("[].volumeMounts", "mountPath"))
    },
}

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
        "metadata.name": field_at("metadata", "name"),
        "metadata.namespace": field_at("metadata", "namespace"),
        "spec.nodeName": field_at("spec", "nodeName"),
        "spec.restartPolicy": field_at("spec", "restartPolicy"),
        "spec.schedulerName": field_at("spec", "schedulerName"),
        "spec.serviceAccountName": field_at("spec", "serviceAccountName"),
        "spec.hostNetwork": flag_at("spec", "hostNetwork"),
        "status.phase": field_at("status", "phase"),
        "status.podIP": field_at("status", "podIP"),
        "status.podIPs": _pod_ips,
        "status.nominatedNodeName": field_at("status", "nominatedNodeName"),
    },
    field_aliases={"spec.host": "spec.nodeName"},
    merge_lists={**COMMON_MERGE_LISTS, **POD_MERGE_LISTS},
    default=_default_pod,
    prepare_for_create=_prepare_pod_create,
    validate=_validate_pod,
)
