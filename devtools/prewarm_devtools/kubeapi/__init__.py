"""An embedded Kubernetes API server (core/v1) for integration tests, benchmarks and local mode.

`with KubeApiServer() as api:` serves nodes, namespaces, pods, secrets and service accounts over
real HTTP on 127.0.0.1, so the official `kubernetes` client (typed `CoreV1Api` calls and raw
`ApiClient.call_api`) talks to it as to EKS: bearer tokens (prefix `k8s-aws-v1.` as EKS tokens),
`Status` errors with the real reasons, codes and wording, discovery (`/api`, `/api/v1`, `/apis`,
`/version`), get/list/create/replace/patch/delete/deletecollection/watch, `status`
subresources, label and field selectors with the real grammar, `limit`/`continue` paging over
consistent snapshots, a global resourceVersion, optimistic concurrency, generateName, finalizers,
namespace cascade deletion, and each type's defaulting and validation. `fail_requests` makes it
answer chosen requests with a given Status (429, 5xx...) to test retries.

What it does NOT implement (code relying on these must be tested against a real cluster):

- API groups other than core/v1, and core/v1 resources other than the five above; no CRDs,
  no aggregated discovery (`/apis` is empty; clients fall back to legacy discovery).
- Authorization: any accepted token may do anything; no RBAC, no impersonation, no
  `SelfSubjectAccessReview`. Requests without a token get 401 by default; `anonymous="forbidden"`
  gives EKS's answer (403 except `/version` and health), `anonymous="allowed"` serves them.
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
  keys, size, `type` and `immutable`) and pods (containers, names, images, spec immutability):
  other fields of nodes and pods are stored as sent.
- Admission beyond the ServiceAccount check and defaults of pods: no projected token volume,
  no LimitRange/ResourceQuota/PodSecurity, no webhooks; no `metadata.generation`.
- Controllers: no scheduler, kubelet, garbage collector (ownerReferences do nothing) or token
  controller. A namespace's deletion removes its content at once (content with finalizers keeps
  it Terminating); pod deletion is immediate (no grace period); `propagationPolicy`,
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

from prewarm_devtools.kubeapi.errors import StatusError
from prewarm_devtools.kubeapi.registry import SeedError
from prewarm_devtools.kubeapi.selectors import SelectorParseError
from prewarm_devtools.kubeapi.server import DEFAULT_TOKEN_PREFIXES, KubeApiServer

__all__ = ["DEFAULT_TOKEN_PREFIXES", "KubeApiServer", "SeedError", "SelectorParseError", "StatusError"]
