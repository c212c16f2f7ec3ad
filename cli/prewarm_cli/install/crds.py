"""The CustomResourceDefinitions of `prewarm.dev/v1alpha1`: ImagePullJob and ImageListPullJob (namespaced,
OpenKruise's spec accepted verbatim) and PrewarmRule (cluster-scoped).

Built from one set of schema pieces, so the two job kinds cannot drift apart. The schemas check the
shape (types, enums, bounds) the API server can check; `sync_resources` applies every resource through
the same validation as `prewarm apply` and writes what it refuses into the resource's status message.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

GROUP = "prewarm.dev"
VERSION = "v1alpha1"
INT32_MAX = 2**31 - 1

_STRING_MAP: Obj = {"type": "object", "additionalProperties": {"type": "string"}}
_STRINGS: Obj = {"type": "array", "items": {"type": "string"}}
_LABEL_SELECTOR: Obj = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"],
            "properties": {"key": {"type": "string"},
                           "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": _STRINGS}}},
    },
    "x-kubernetes-map-type": "atomic",
}
_TEMPLATE: Obj = {
    "pullSecrets": {**_STRINGS, "description": "Secrets of the job's namespace to pull with."},
    "pullSecretsOnly": {"type": "boolean", "description": "Pull with pullSecrets only, never with credentials "
                                                          "shared by every job (they must exist at apply)."},
    "selector": {"type": "object", "description": "Nodes by name or by label (names excludes the rest).",
                 "properties": {"names": _STRINGS, **_LABEL_SELECTOR["properties"]}},
    "podSelector": {**_LABEL_SELECTOR, "description": "The nodes running pods that match, in the job's namespace."},
    "parallelism": {"x-kubernetes-int-or-string": True, "description": "Nodes pulling at once (default 1)."},
    "pullPolicy": {"type": "object", "properties": {
        "backoffLimit": {"type": "integer", "format": "int32", "minimum": 0, "maximum": INT32_MAX},
        "timeoutSeconds": {"type": "integer", "format": "int32", "minimum": 1, "maximum": INT32_MAX}}},
    "completionPolicy": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["Always", "Never"]},
        "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1},
        "ttlSecondsAfterFinished": {"type": "integer", "format": "int32", "minimum": 0, "maximum": INT32_MAX}}},
    "sandboxConfig": {"type": "object", "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP}},
    "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent"]},
}
# Prewarm's additions to Kruise's status: node counts and bytes of the current round.
_PREWARM_STATUS: Obj = {
    "observedGeneration": {"type": "integer", "format": "int64"},
    "nodes": {"type": "object", "properties": {k: {"type": "integer"} for k in ("waiting", "pulling", "succeeded",
                                                                              "failed")}},
    "bytes": {"type": "object", "properties": {"done": {"type": "integer"}, "total": {"type": "integer"}}},
}
_TIME: Obj = {"type": "string", "format": "date-time"}
_JOB_STATUS: Obj = {"type": "object", "properties": {
    "desired": {"type": "integer"}, "active": {"type": "integer"}, "succeeded": {"type": "integer"},
    "failed": {"type": "integer"}, "failedNodes": _STRINGS, "startTime": _TIME, "completionTime": _TIME,
    "message": {"type": "string"}, **_PREWARM_STATUS}}
_LIST_JOB_STATUS: Obj = {"type": "object", "properties": {
    "desired": {"type": "integer"}, "active": {"type": "integer"}, "completed": {"type": "integer"},
    "succeeded": {"type": "integer"}, "startTime": _TIME, "completionTime": _TIME, "message": {"type": "string"},
    "failedImageStatuses": {"type": "array", "items": {"type": "object", "properties": {
        "imagePullJob": {"type": "string"}, "name": {"type": "string"}, "message": {"type": "string"}}}},
    "observedGeneration": _PREWARM_STATUS["observedGeneration"]}}
_RULE_STATUS: Obj = {"type": "object", "properties": {
    "message": {"type": "string"}, "observedGeneration": _PREWARM_STATUS["observedGeneration"]}}


def _column(name: str, path: str, kind: str = "integer", priority: int = 0) -> Obj:
    column: Obj = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


# Kruise's columns, so `kubectl get imagepulljobs` reads as it does with OpenKruise.
_JOB_COLUMNS = [_column("TOTAL", ".status.desired"), _column("ACTIVE", ".status.active"),
                _column("SUCCEED", ".status.succeeded"), _column("FAILED", ".status.failed"),
                _column("AGE", ".metadata.creationTimestamp", "date"),
                _column("MESSAGE", ".status.message", "string")]
_LIST_JOB_COLUMNS = [_column("TOTAL", ".status.desired"), _column("SUCCEEDED", ".status.succeeded"),
                     _column("COMPLETED", ".status.completed"),
                     _column("AGE", ".metadata.creationTimestamp", "date")]
_RULE_COLUMNS = [_column("REPOSITORIES", ".spec.repositories", "string"),
                 _column("NAMESPACE", ".spec.template.metadata.namespace", "string"),
                 _column("AGE", ".metadata.creationTimestamp", "date"),
                 _column("MESSAGE", ".status.message", "string", priority=1)]


def _crd(kind: str, plural: str, scope: str, spec: Obj, status: Obj, columns: list[Obj],
         short_names: list[str]) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "prewarm"}},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      "shortNames": short_names, "categories": ["prewarm"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                    "spec": spec, "status": status}, "required": ["spec"]}},
            }],
        },
    }


def custom_resource_definitions() -> list[Obj]:
    job_spec = {"type": "object", "required": ["image"],
                "properties": {"image": {"type": "string", "minLength": 1}, **_TEMPLATE}}
    list_spec = {"type": "object", "required": ["images"],
                 "properties": {"images": {**_STRINGS, "minItems": 1}, **_TEMPLATE}}
    rule_spec = {"type": "object", "required": ["repositories"], "properties": {
        "repositories": {**_STRINGS, "minItems": 1}, "tags": {**_STRINGS, "minItems": 1},
        "includeUntagged": {"type": "boolean"}, "registries": _STRINGS, "accountIds": _STRINGS,
        "regions": _STRINGS,
        "template": {"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {
                "namespace": {"type": "string"}, "labels": _STRING_MAP, "annotations": _STRING_MAP}},
            "spec": {"type": "object", "properties": _TEMPLATE}}}}}
    return [
        _crd("ImagePullJob", "imagepulljobs", "Namespaced", job_spec, _JOB_STATUS, _JOB_COLUMNS, ["ipj"]),
        _crd("ImageListPullJob", "imagelistpulljobs", "Namespaced", list_spec, _LIST_JOB_STATUS, _LIST_JOB_COLUMNS,
             ["ilpj"]),
        _crd("PrewarmRule", "prewarmrules", "Cluster", rule_spec, _RULE_STATUS, _RULE_COLUMNS, ["pwr"]),
    ]
