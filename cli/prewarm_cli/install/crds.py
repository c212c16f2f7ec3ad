"""The CustomResourceDefinitions of `prewarm.dev/v1alpha1`: ImagePullJob, ImageListPullJob and AdvancedCronJob
(namespaced, OpenKruise's spec accepted verbatim), PrewarmRule and WarmSnapshot (cluster-scoped).

Built from one set of schema pieces, so the two job kinds cannot drift apart. The schemas say the model's
rules as the API server can check them without a webhook: types, enums and bounds, the model's string
rules as `pattern`s (`prewarm.domain.jobs`), the rules between fields as `x-kubernetes-validations` (CEL,
GA since Kubernetes 1.29), Kruise's defaults as `default`s and Kruise's list and map markers; so
`kubectl apply` refuses a bad job naming the field. tests/unit/install/test_job_rules.py runs one table
of cases through the model and these schemas. What needs other objects (a pullSecretsOnly secret) or
cannot be said here (docs/job-spec.md, "Validation") is refused by `sync_resources`, which applies every
resource through the same validation as `prewarm apply` and writes what it refuses into the resource's
status message.
"""

from __future__ import annotations

from typing import Any

from prewarm.domain.clusters import CLUSTER_NAME_MAX, CLUSTER_NAME_PATTERN
from prewarm.domain.cron import SCHEDULE_PATTERN, TIME_ZONE_PATTERN
from prewarm.domain.cronjobs import MAX_ACTIVE_DEADLINE_SECONDS, NAME_MAX_LENGTH
from prewarm.domain.jobs import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    IMAGE_ID_PATTERN,
    IMAGE_MAX_LENGTH,
    IMAGE_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_IMAGES,
    PARALLELISM_NOT_A_NUMBER,
    PARALLELISM_PERCENT,
    PARALLELISM_STRING_PATTERN,
    CompletionPolicy,
    ImagePullJobTemplate,
    PullPolicy,
)
from prewarm.domain.rules import ACCOUNT_ID_PATTERN, GLOB_PATTERN, KEEP_DIGESTS_MAX, REGION_PATTERN
from prewarm.domain.snapshots import (
    AL2023_CONTAINERD_MOUNT,
    AZ_PATTERN,
    BOTTLEROCKET_DATA_DEVICE,
    DEFAULT_KEEP,
    MAX_DATA_VOLUME_GIB,
    MAX_FSR_ZONES,
    MAX_KEEP,
    MAX_SNAPSHOT_IMAGES,
    MAX_TIME_BUDGET_SECONDS,
    MIN_TIME_BUDGET_SECONDS,
    SUBNET_ID_PATTERN,
    AmiFamily,
)

Obj = dict[str, Any]

GROUP = "prewarm.dev"
VERSION = "v1alpha1"
INT32_MAX = 2**31 - 1

def _rule(rule: str, message: str = "", *, field_path: str = "", message_expression: str = "") -> Obj:
    """An `x-kubernetes-validations` entry: a CEL rule the API server runs at every create and update."""
    entry: Obj = {"rule": rule}
    if message:
        entry["message"] = message
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _patterned(pattern: str, max_length: int | None = None) -> Obj:
    schema: Obj = {"type": "string", "pattern": pattern}
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


_STRING_MAP: Obj = {"type": "object", "additionalProperties": {"type": "string"}}
_STRINGS: Obj = {"type": "array", "items": {"type": "string"}}
_LABEL_VALUES: Obj = {"type": "object", "additionalProperties": _patterned(LABEL_VALUE_PATTERN, 63)}
_NAMES: Obj = {"type": "array", "items": _patterned(DNS1123_SUBDOMAIN_PATTERN, 253)}
# The duplicate check is quadratic: the API server's cost estimate (names of up to 253 characters) allows
# about 600 names under its 10 million limit. Select more nodes than this by label. The model has no bound.
NODE_NAMES_MAX = 500
_NOT_AN_IMAGE_ID = _rule(f"!self.matches('{IMAGE_ID_PATTERN}')",
                         "a 64-character hex string is an image ID, not a repository name; use name@sha256:<hex>")
_IMAGE: Obj = {**_patterned(IMAGE_PATTERN, IMAGE_MAX_LENGTH), "minLength": 1,
               "x-kubernetes-validations": [_NOT_AN_IMAGE_ID]}
# Kruise's markers: both selectors are atomic maps, their names, matchExpressions and values atomic lists.
# Duplicate names are refused by the sync (the model), as Kruise's webhook refuses them.
_VALUES_FIT_OPERATOR = [
    _rule("!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
          field_path=".values", message_expression="'must be non-empty when operator is ' + self.operator"),
    _rule("self.operator in ['In', 'NotIn'] || !has(self.values) || size(self.values) == 0",
          field_path=".values", message_expression="'must be empty when operator is ' + self.operator"),
]
_LABEL_SELECTOR: Obj = {
    "type": "object",
    "properties": {
        "matchLabels": _LABEL_VALUES,
        "matchExpressions": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {
            "type": "object", "required": ["key", "operator"],
            "properties": {"key": _patterned(LABEL_KEY_PATTERN, 253 + 1 + 63),
                           "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "x-kubernetes-list-type": "atomic",
                                      "items": _patterned(LABEL_VALUE_PATTERN, 63)}},
            "x-kubernetes-validations": _VALUES_FIT_OPERATOR}},
    },
    "x-kubernetes-map-type": "atomic",
}
_CLUSTER_SELECTOR: Obj = {
    "type": "object", "description": "Registered clusters by name or by label (names excludes the rest); "
                                     "absent, every cluster the stack serves.",
    "properties": {"names": {"type": "array", "x-kubernetes-list-type": "set",
                             "items": _patterned(CLUSTER_NAME_PATTERN, CLUSTER_NAME_MAX)},
                   **_LABEL_SELECTOR["properties"]},
    "x-kubernetes-map-type": "atomic",
    "x-kubernetes-validations": [_rule("!has(self.names) || !(has(self.matchLabels) || has(self.matchExpressions))",
                                       "names cannot be combined with matchLabels or matchExpressions; use one")],
}
_NODE_SELECTOR: Obj = {
    "type": "object", "description": "Nodes by name or by label (names excludes the rest).",
    # atomic, as Kruise marks it: server-side apply replaces the names an applier gives, never merges them.
    "properties": {"names": {**_NAMES, "x-kubernetes-list-type": "atomic", "maxItems": NODE_NAMES_MAX,
                             "x-kubernetes-validations": [_rule("self.all(n, self.exists_one(m, m == n))",
                                                                "must not name a node twice")]},
                   **_LABEL_SELECTOR["properties"]},
    "x-kubernetes-map-type": "atomic",
    "x-kubernetes-validations": [_rule("!has(self.names) || !(has(self.matchLabels) || has(self.matchExpressions))",
                                       "names cannot be combined with matchLabels or matchExpressions; use one")],
}
# The model's messages, with the value spliced in by CEL.
_PERCENT = PARALLELISM_PERCENT.format(value="\"' + self + '\"")
_NOT_A_NUMBER = PARALLELISM_NOT_A_NUMBER.format(value="\"' + self + '\"")
_PARALLELISM: Obj = {
    "x-kubernetes-int-or-string": True,
    "description": "Nodes pulling at once (default 1): a number, or a numeric string.",
    "x-kubernetes-validations": [
        _rule("type(self) == int || !self.endsWith('%')", message_expression=f"'{_PERCENT}'"),
        _rule(f"type(self) == int || self.endsWith('%') || (self.matches('{PARALLELISM_STRING_PATTERN}') && "
              f"int(self) >= {-INT32_MAX - 1} && int(self) <= {INT32_MAX})", message_expression=f"'{_NOT_A_NUMBER}'"),
        _rule(f"type(self) == int ? self >= 0 : (!self.matches('{PARALLELISM_STRING_PATTERN}') || int(self) >= 0)",
              message_expression="'must be greater than or equal to 0 (got ' + string(self) + ')'"),
        _rule(f"type(self) == string || self <= {INT32_MAX}",
              message_expression=f"'must be less than or equal to {INT32_MAX} (got ' + string(self) + ')'"),
    ],
}
_TIMEOUT = "(has(self.pullPolicy) && has(self.pullPolicy.timeoutSeconds) ? self.pullPolicy.timeoutSeconds : 600)"
_NEVER = "(has(self.type) && self.type == 'Never')"
# The rules between fields of a job's spec (or a rule's template spec), as ImagePullJobTemplate checks them.
_TEMPLATE_RULES = [
    _rule("!has(self.pullSecretsOnly) || !self.pullSecretsOnly || "
          "(has(self.pullSecrets) && size(self.pullSecrets) > 0)",
          "true needs at least one secret in pullSecrets to pull with", field_path=".pullSecretsOnly"),
    _rule("!(has(self.podSelector) && has(self.selector))", "cannot be combined with selector; use one of them",
          field_path=".podSelector"),
    _rule("!has(self.completionPolicy) || !has(self.completionPolicy.activeDeadlineSeconds) || "
          f"(has(self.completionPolicy.type) && self.completionPolicy.type == 'Never') || "
          f"self.completionPolicy.activeDeadlineSeconds >= {_TIMEOUT}",
          field_path=".completionPolicy.activeDeadlineSeconds",
          message_expression=f"'must be >= pullPolicy.timeoutSeconds (' + string({_TIMEOUT}) + ')'"),
]
_COMPLETION_RULES = [
    _rule(f"!{_NEVER} || !has(self.{field})", "may only be set when completionPolicy.type is Always",
          field_path=f".{field}")
    for field in ("activeDeadlineSeconds", "ttlSecondsAfterFinished")
]


def _template(kind: str) -> Obj:
    """The fields of a job's spec but its image(s); `kind` ("" for a rule's template) decides the defaults
    stored: Kruise's mutating webhook's, per kind (apis/apps/defaults/v1alpha1.go: SetDefaultsImagePullJob,
    SetDefaultsImageListPullJob), which the model fills in too."""
    defaulted = bool(kind)

    def default(value: Any) -> Obj:
        return {"default": value} if defaulted else {}

    template: Obj = {
        "pullSecrets": {**_NAMES, "description": "Secrets of the job's namespace to pull with."},
        "pullSecretsOnly": {"type": "boolean", "description": "Pull with pullSecrets only, never with credentials "
                                                              "shared by every job (they must exist at apply)."},
        "selector": _NODE_SELECTOR,
        "podSelector": {**_LABEL_SELECTOR, "description": "The nodes running pods that match, in the job's "
                                                          "namespace."},
        "parallelism": _PARALLELISM,
        "pullPolicy": {"type": "object", **default({}), "properties": {
            "backoffLimit": {"type": "integer", "format": "int32", "minimum": 0, "maximum": INT32_MAX,
                             **default(PullPolicy().backoff_limit)},
            "timeoutSeconds": {"type": "integer", "format": "int32", "minimum": 1, "maximum": INT32_MAX,
                               **default(PullPolicy().timeout_seconds)}}},
        "completionPolicy": {"type": "object", **default({}), "properties": {
            "type": {"type": "string", "enum": ["Always", "Never"], **default(CompletionPolicy().type)},
            "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1},
            "ttlSecondsAfterFinished": {"type": "integer", "format": "int32", "minimum": 0, "maximum": INT32_MAX}},
            "x-kubernetes-validations": _COMPLETION_RULES},
        "sandboxConfig": {"type": "object", "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP}},
        "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent"]},
    }
    if kind == "ImagePullJob":
        template["imagePullPolicy"]["default"] = ImagePullJobTemplate().image_pull_policy
    return template


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


_SNAPSHOT_STATUS: Obj = {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
    "message": {"type": "string"}, "snapshotID": {"type": "string"}, "stale": {"type": "boolean"},
    "observedGeneration": _PREWARM_STATUS["observedGeneration"]}}
_OBJECT_REFERENCE: Obj = {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
    key: {"type": "string"} for key in ("apiVersion", "kind", "name", "namespace", "uid", "resourceVersion",
                                        "fieldPath")}}
_CRON_STATUS: Obj = {"type": "object", "properties": {
    "type": {"type": "string"}, "active": {"type": "array", "items": _OBJECT_REFERENCE}, "lastScheduleTime": _TIME,
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
_CRON_COLUMNS = [_column("SCHEDULE", ".spec.schedule", "string"), _column("TYPE", ".status.type", "string"),
                 _column("LASTSCHEDULETIME", ".status.lastScheduleTime", "date"),
                 _column("AGE", ".metadata.creationTimestamp", "date")]
_RULE_COLUMNS = [_column("REPOSITORIES", ".spec.repositories", "string"),
                 _column("NAMESPACE", ".spec.template.metadata.namespace", "string"),
                 _column("AGE", ".metadata.creationTimestamp", "date"),
                 _column("MESSAGE", ".status.message", "string", priority=1)]


_SNAPSHOT_COLUMNS = [_column("SNAPSHOT", ".status.snapshotID", "string"), _column("STALE", ".status.stale", "boolean"),
                     _column("AGE", ".metadata.creationTimestamp", "date"),
                     _column("MESSAGE", ".status.message", "string", priority=1)]


def _warm_snapshot_spec() -> Obj:
    """What the model checks of a WarmSnapshot that a schema can say; the AMI family's devices are CEL."""
    names = {"type": "array", "items": _patterned(DNS1123_SUBDOMAIN_PATTERN, 253)}
    device = _rule("self.amiFamily != 'Bottlerocket' || !has(self.dataVolume) || !has(self.dataVolume.deviceName) "
                   f"|| self.dataVolume.deviceName == '{BOTTLEROCKET_DATA_DEVICE}'",
                   f"Bottlerocket keeps containerd on {BOTTLEROCKET_DATA_DEVICE}",
                   field_path=".dataVolume.deviceName")
    mount = _rule("self.amiFamily != 'AL2023' || (has(self.dataVolume) && has(self.dataVolume.mountPath) && "
                  f"self.dataVolume.mountPath == '{AL2023_CONTAINERD_MOUNT}')",
                  f"must be {AL2023_CONTAINERD_MOUNT} on AL2023",
                  field_path=".dataVolume.mountPath")
    return {"type": "object", "required": ["nodeClass", "amiFamily"], "properties": {
        "nodeClass": {"type": "object", "properties": {"ec2NodeClass": _patterned(DNS1123_SUBDOMAIN_PATTERN, 253),
                                                       "launchTemplate": {"type": "string", "maxLength": 128}},
                      "x-kubernetes-validations": [_rule("has(self.ec2NodeClass) != has(self.launchTemplate)",
                                                         "set exactly one of ec2NodeClass and launchTemplate")]},
        "amiFamily": {"type": "string", "enum": [f.value for f in AmiFamily]},
        "dataVolume": {"type": "object", "properties": {
            "deviceName": _patterned("^/dev/(xvd|sd)[a-z]$"), "mountPath": {"type": "string"},
            "sizeGiB": {"type": "integer", "minimum": 1, "maximum": MAX_DATA_VOLUME_GIB}}},
        "rules": names, "images": {"type": "array", "maxItems": MAX_SNAPSHOT_IMAGES, "items": _IMAGE},
        "fastSnapshotRestore": {"type": "object", "required": ["availabilityZones"], "properties": {
            "availabilityZones": {"type": "array", "minItems": 1, "maxItems": MAX_FSR_ZONES,
                                  "items": _patterned(f"^{AZ_PATTERN}$")}}},
        "keep": {"type": "integer", "minimum": 1, "maximum": MAX_KEEP, "default": DEFAULT_KEEP},
        "builder": {"type": "object", "properties": {
            "subnetIds": {"type": "array", "items": _patterned(f"^{SUBNET_ID_PATTERN}$")},
            "instanceType": {"type": "string"}, "imageId": {"type": "string"},
            "timeBudgetSeconds": {"type": "integer", "minimum": MIN_TIME_BUDGET_SECONDS,
                                  "maximum": MAX_TIME_BUDGET_SECONDS}}}},
        "x-kubernetes-validations": [device, mount]}


def _crd(kind: str, plural: str, scope: str, spec: Obj, status: Obj, columns: list[Obj],
         short_names: list[str], metadata: Obj | None = None) -> Obj:
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
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": metadata or {"type": "object"},
                    "spec": spec, "status": status}, "required": ["spec"]}},
            }],
        },
    }


# Kruise's defaulting of an image list template fills in pullPolicy and imagePullPolicy only when
# completionPolicy.type is absent, which a schema's defaults cannot say: those are the model's (the sync's).
_CRON_DEADLINE = ("self.completionPolicy.activeDeadlineSeconds >= (has(self.pullPolicy) && "
                  "has(self.pullPolicy.timeoutSeconds) ? self.pullPolicy.timeoutSeconds : "
                  "(has(self.completionPolicy.type) ? 0 : 600))")
_CRON_TEMPLATE_RULES = [
    *_TEMPLATE_RULES[:2],
    _rule("!has(self.completionPolicy) || !has(self.completionPolicy.type) || self.completionPolicy.type == 'Always'",
          field_path=".completionPolicy.type", message_expression="'completionPolicy should be Always, but current "
                                                                   "value is: ' + self.completionPolicy.type"),
    _rule("!has(self.completionPolicy) || !has(self.completionPolicy.activeDeadlineSeconds) || "
          f"self.completionPolicy.activeDeadlineSeconds <= {MAX_ACTIVE_DEADLINE_SECONDS}",
          field_path=".completionPolicy.activeDeadlineSeconds",
          message=f"activeDeadlineSeconds must be less than {MAX_ACTIVE_DEADLINE_SECONDS}"),
    _rule(f"!has(self.completionPolicy) || !has(self.completionPolicy.activeDeadlineSeconds) || {_CRON_DEADLINE}",
          field_path=".completionPolicy.activeDeadlineSeconds",
          message="completionPolicy.activeDeadlineSeconds must be greater than pullPolicy.timeoutSeconds (600 when "
                  "completionPolicy.type is not given)"),
    _rule("!has(self.completionPolicy) || !has(self.completionPolicy.ttlSecondsAfterFinished)",
          field_path=".completionPolicy.ttlSecondsAfterFinished",
          message="ttlSecondsAfterFinished is not supported in advancedCronJob: successfulJobsHistoryLimit and "
                  "failedJobsHistoryLimit keep finished runs"),
]
_ONE_TEMPLATE = ("(has(self.jobTemplate) ? 1 : 0) + (has(self.broadcastJobTemplate) ? 1 : 0) + "
                 "(has(self.imageListPullJobTemplate) ? 1 : 0)")


def _cron_spec(images: Obj) -> Obj:
    """An AdvancedCronJob's spec as Kruise's CRD and webhooks take it (pkg/webhook/advancedcronjob), with the
    defaults of its defaulting webhook for an image list template."""
    template_spec = {"type": "object", "required": ["images"],
                     "properties": {"images": images, **_template(""), "completionPolicy": {
                         **_template("")["completionPolicy"], "default": {}}},
                     "x-kubernetes-validations": _CRON_TEMPLATE_RULES}
    pods = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    template = {"type": "object", "properties": {
        "imageListPullJobTemplate": {"type": "object", "required": ["spec"], "properties": {
            "metadata": {"type": "object", "properties": {"labels": _LABEL_VALUES, "annotations": _STRING_MAP}},
            "spec": template_spec}},
        "jobTemplate": pods, "broadcastJobTemplate": pods},
        "x-kubernetes-validations": [
            _rule(f"{_ONE_TEMPLATE} > 0", "spec must have one template: Prewarm runs imageListPullJobTemplate"),
            _rule(f"{_ONE_TEMPLATE} <= 1", "spec can have only one template, either JobTemplate or "
                                          "BroadcastJobTemplate or ImageListPullJobTemplate should be provided"),
            _rule(f"{_ONE_TEMPLATE} != 1 || has(self.imageListPullJobTemplate)",
                  "Prewarm runs only spec.template.imageListPullJobTemplate; a jobTemplate or broadcastJobTemplate "
                  "(pods) is for OpenKruise's controller")]}
    count = {"type": "integer", "format": "int32", "minimum": 0, "maximum": INT32_MAX}
    return {"type": "object", "required": ["schedule", "template"], "properties": {
        "schedule": {**_patterned(SCHEDULE_PATTERN), "minLength": 1},
        "timeZone": {**_patterned(TIME_ZONE_PATTERN), "minLength": 1, "x-kubernetes-validations": [
            _rule("!self.matches('^[Ll][Oo][Cc][Aa][Ll]$')",
                  "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones")]},
        "startingDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 0},
        "concurrencyPolicy": {"type": "string", "enum": ["Allow", "Forbid", "Replace"], "default": "Replace"},
        "paused": {"type": "boolean", "default": False},
        "successfulJobsHistoryLimit": {**count, "default": 3},
        "failedJobsHistoryLimit": {**count, "default": 1},
        "template": template},
        "x-kubernetes-validations": [
            _rule("!has(self.timeZone) || !self.schedule.contains('TZ')",
                  "cannot use both timeZone field and TZ or CRON_TZ in schedule", field_path=".schedule"),
            _rule("!has(self.template.imageListPullJobTemplate) || self.concurrencyPolicy != 'Allow'",
                  "concurrencyPolicy should be Replace or Forbid, but current value is: Allow",
                  field_path=".concurrencyPolicy")]}


# Kruise's webhook: letters, digits and '-', at most 63 (and, as any object's, a DNS subdomain).
_CRON_METADATA: Obj = {"type": "object", "properties": {"name": _patterned(DNS1123_LABEL_PATTERN, NAME_MAX_LENGTH)}}


def custom_resource_definitions() -> list[Obj]:
    job_spec = {"type": "object", "required": ["image"], "properties": {"image": _IMAGE, **_template("ImagePullJob")},
                "x-kubernetes-validations": _TEMPLATE_RULES}
    images = {"type": "array", "minItems": 1, "maxItems": MAX_IMAGES,
              "items": _IMAGE,
              # Quadratic, so the API server needs maxItems and the items' maxLength to afford it.
              "x-kubernetes-validations": [_rule("self.all(i, self.exists_one(j, j == i))",
                                                 "must not list an image twice")]}
    list_spec = {"type": "object", "required": ["images"],
                 "properties": {"images": images, **_template("ImageListPullJob")},
                 "x-kubernetes-validations": _TEMPLATE_RULES}
    globs = {"type": "array", "items": _patterned(GLOB_PATTERN)}
    always = _rule("!has(self.completionPolicy) || !has(self.completionPolicy.type) || "
                   "self.completionPolicy.type == 'Always'", "must be Always: each push creates a job that must finish",
                   field_path=".completionPolicy.type")
    rule_spec = {"type": "object", "required": ["repositories"], "properties": {
        "repositories": {**globs, "minItems": 1}, "tags": {**globs, "minItems": 1},
        "includeUntagged": {"type": "boolean"}, "registries": globs,
        "keepDigests": {"type": "integer", "minimum": 0, "maximum": KEEP_DIGESTS_MAX},
        "accountIds": {"type": "array", "items": _patterned(ACCOUNT_ID_PATTERN)},
        "regions": {"type": "array", "items": _patterned(REGION_PATTERN)},
        "clusters": _CLUSTER_SELECTOR, "nodeLabel": _patterned(LABEL_KEY_PATTERN, 253 + 1 + 63),
        "template": {"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {
                "namespace": _patterned(DNS1123_LABEL_PATTERN, 63), "labels": _LABEL_VALUES,
                "annotations": _STRING_MAP}},
            "spec": {"type": "object", "properties": _template(""),
                     "x-kubernetes-validations": [*_TEMPLATE_RULES, always]}}}}}
    return [
        _crd("ImagePullJob", "imagepulljobs", "Namespaced", job_spec, _JOB_STATUS, _JOB_COLUMNS, ["ipj"]),
        _crd("ImageListPullJob", "imagelistpulljobs", "Namespaced", list_spec, _LIST_JOB_STATUS, _LIST_JOB_COLUMNS,
             ["ilpj"]),
        _crd("PrewarmRule", "prewarmrules", "Cluster", rule_spec, _RULE_STATUS, _RULE_COLUMNS, ["pwr"]),
        _crd("WarmSnapshot", "warmsnapshots", "Cluster", _warm_snapshot_spec(), _SNAPSHOT_STATUS, _SNAPSHOT_COLUMNS,
             ["pws"]),
        _crd("AdvancedCronJob", "advancedcronjobs", "Namespaced", _cron_spec(images), _CRON_STATUS, _CRON_COLUMNS,
             ["acj"], _CRON_METADATA),
    ]
