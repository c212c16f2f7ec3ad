"""An embedded Kubernetes API server (core/v1, apps, scheduling and RBAC) for integration tests,
benchmarks and local mode.

`with KubeApiServer() as api:` serves nodes, namespaces, pods, secrets, service accounts,
ConfigMaps and Events (core/v1), DaemonSets (apps/v1), PriorityClasses (scheduling.k8s.io/v1, with
the two system classes every cluster has), ValidatingAdmissionPolicies and their bindings
(admissionregistration.k8s.io/v1: stored and served, never evaluated), and ClusterRoles, Roles and
their bindings (rbac.authorization.k8s.io/v1), over real HTTP on 127.0.0.1, so the official `kubernetes` client
(typed `CoreV1Api`/`AppsV1Api`/`SchedulingV1Api`/`RbacAuthorizationV1Api` calls and raw
`ApiClient.call_api`) and kubectl talk to it as to EKS. Every request is authenticated (a static
token or an EKS `k8s-aws-v1.` token maps to an `Identity`, as EKS access entries map IAM
principals; see `KubeApiServer`) and authorized by RBAC (`system:masters` may do anything), with
the API server's 401 and 403 answers; `SelfSubjectAccessReview` and `SubjectAccessReview` are
answered, and `Impersonate-User`/`Impersonate-Group` honoured. Also: `Status` errors with the real
reasons, codes and wording, discovery (`/api`, `/api/v1`, `/apis`, each group, `/version`),
get/list/create/replace/patch/delete/deletecollection/watch, `status` subresources,
`metadata.generation` (DaemonSets: bumped by spec changes only, with the
`deprecated.daemonset.template.generation` annotation), label and field selectors with the real
grammar, `limit`/`continue` paging over consistent snapshots, a global resourceVersion, optimistic
concurrency, generateName, finalizers, namespace cascade deletion, `dryRun` (query or
DeleteOptions), the NamespaceLifecycle refusal to delete `default`, `kube-system` and
`kube-public`, the Priority admission plugin's single `globalDefault` PriorityClass, and each
type's defaulting and validation. `fail_requests` makes it answer chosen requests with a given
Status (429, 5xx...) to test retries.

What it does NOT implement (code relying on these must be tested against a real cluster):

- API groups other than core/v1, apps/v1 (DaemonSets only: no Deployments, ReplicaSets,
  StatefulSets, ControllerRevisions), scheduling.k8s.io/v1, admissionregistration.k8s.io/v1
  (ValidatingAdmissionPolicy and its binding only), rbac.authorization.k8s.io/v1 and
  authorization.k8s.io/v1 (access reviews only: no `LocalSubjectAccessReview`, no
  `SelfSubjectRulesReview`); no events.k8s.io (core/v1 Events only), and core/v1 resources other
  than the seven above; no CRDs, no aggregated discovery (clients fall back to legacy discovery).
- Authentication and authorization: EKS token signatures are not checked (no STS is asked: the
  access key names the principal); no client certificates, no service account token issuing
  (`TokenRequest`: `service_account(ns, name, node=...)` is the identity of a token bound to a
  node, with the user extra `authentication.kubernetes.io/node-name`), no `userextras`
  impersonation. RBAC: no aggregated ClusterRoles
  (`aggregationRule` is stored, not followed), no escalation or `bind` checks on role writes, and
  only the bootstrap policy's cluster-admin, system:discovery, system:basic-user and
  system:public-info-viewer. Requests without a token get 401 by default; `anonymous="forbidden"`
  makes them `system:anonymous` (as on EKS: RBAC lets it read `/version` and health only),
  `anonymous="allowed"` serves them as the cluster admin.
- TLS (plain HTTP on 127.0.0.1), HTTP/2, protobuf and CBOR bodies, `Table` output
  (`as=Table`), `pretty` for watch streams, gzip responses, `/openapi/v2` and `/openapi/v3`.
  So kubectl (which sends no token over HTTP: serve with `anonymous="allowed"`) can get, watch,
  label, annotate, cordon, patch, delete and `apply --validate=false`, but its typed
  `kubectl create <kind>` commands (protobuf bodies) get 415 and its validation finds no OpenAPI.
- Server-side apply (`application/apply-patch+yaml` is 415), `managedFields`, `fieldManager`
  and `fieldValidation` (unknown fields are kept, not pruned or warned about).
- Strategic merge patch: `retainKeys` strategies are not enforced beyond `$retainKeys`;
  `$setElementOrder` orders listed items first and keeps the rest after them.
- Validation beyond metadata (names, labels, annotations), secrets (types and their keys, data
  keys, size, `type` and `immutable`), ConfigMaps (keys, no key in both `data` and `binaryData`,
  size, `immutable`), events (the namespace rules of core/v1, and what an `eventTime` event
  requires), pods and pod templates (containers, names, images; pods' spec immutability),
  DaemonSets (selector against template labels, selector immutability, restartPolicy, update
  strategy) and PriorityClasses (value range and `system-` names, immutable value and
  preemptionPolicy): other fields are stored as sent. Pod templates get the PodSpec and container
  defaults of pods, not probe, port or volume defaults.
- Admission beyond the ServiceAccount check and defaults of pods and the single default
  PriorityClass: ValidatingAdmissionPolicies are stored (with their defaults and required fields
  checked) but their CEL is neither type-checked nor evaluated, so nothing they forbid is refused;
  no projected token volume, no pod priority from its class, no
  LimitRange/ResourceQuota/PodSecurity, no webhooks; `metadata.generation` only for DaemonSets.
- Controllers: no scheduler, kubelet, DaemonSet controller (no pods, no status, no
  ControllerRevisions), garbage collector (ownerReferences do nothing), token controller or
  root-CA publisher (no `kube-root-ca.crt` ConfigMap per namespace); events do not expire. A
  namespace's deletion removes its content at once (content with finalizers keeps it
  Terminating); pod deletion is immediate (no grace period); `propagationPolicy`,
  `gracePeriodSeconds` and `orphanDependents` are accepted and ignored.
- Subresources other than `status` (no `binding`, `eviction`, `log`, `exec`, `proxy`,
  `ephemeralcontainers`, `resize`, namespace `finalize`).
- `resourceVersionMatch=Exact` for lists only at the current resourceVersion or one whose
  snapshot a paged list still holds. Continue tokens expire after `continue_ttl` seconds, when
  more than 16 paged lists are pending, or on `expire_continue_tokens()`; watches can resume
  from the last `max_events` writes only (older: 410 Expired). `limit` is honoured even with
  `resourceVersion=0` (a real watch cache may ignore it and return everything).
- Watch bookmarks every `bookmark_interval` seconds (60 by default) when requested; no
  bookmark just before a watch times out.
"""

from prewarm_devtools.kubeapi.auth import DEFAULT_CLUSTER_CREATOR, AccessEntry, Identity, service_account
from prewarm_devtools.kubeapi.errors import StatusError
from prewarm_devtools.kubeapi.registry import SeedError
from prewarm_devtools.kubeapi.selectors import SelectorParseError
from prewarm_devtools.kubeapi.server import KubeApiServer

__all__ = [
    "DEFAULT_CLUSTER_CREATOR",
    "AccessEntry",
    "Identity",
    "KubeApiServer",
    "SeedError",
    "SelectorParseError",
    "StatusError",
    "service_account",
]
