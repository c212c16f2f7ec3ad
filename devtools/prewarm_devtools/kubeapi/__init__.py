"""An embedded Kubernetes API server (core/v1, apps, scheduling, RBAC and CustomResourceDefinitions)
for integration tests, benchmarks and local mode.

`with KubeApiServer() as api:` serves nodes, namespaces, pods, secrets, service accounts,
ConfigMaps and Events (core/v1), DaemonSets (apps/v1), PriorityClasses (scheduling.k8s.io/v1, with
the two system classes every cluster has), ValidatingAdmissionPolicies and their bindings
(admissionregistration.k8s.io/v1: evaluated on every write, `admission.py`), ClusterRoles, Roles and
their bindings (rbac.authorization.k8s.io/v1), and CustomResourceDefinitions
(apiextensions.k8s.io/v1) with the resources they define, over real HTTP (HTTPS with
`tls=True`) on 127.0.0.1, so the official `kubernetes` client (typed `CoreV1Api`/`AppsV1Api`/
`SchedulingV1Api`/`RbacAuthorizationV1Api`/`ApiextensionsV1Api`/`CustomObjectsApi` calls and raw
`ApiClient.call_api`) and kubectl talk to it as to EKS. Every request is authenticated (a static
token or an EKS `k8s-aws-v1.` token maps to an `Identity`, as EKS access entries map IAM
principals; see `KubeApiServer`) and authorized by RBAC (`system:masters` may do anything), with
the API server's 401 and 403 answers; `SelfSubjectAccessReview`, `SubjectAccessReview` and
`SelfSubjectReview` (`kubectl auth whoami`) are answered, and `Impersonate-User`/`Impersonate-Group`
honoured. Also: `Status` errors with the real reasons, codes and wording, discovery (`/api`,
`/api/v1`, `/apis`, each group, `/version`), get/list/create/replace/patch/delete/deletecollection/
watch, `status` subresources, `metadata.generation` (DaemonSets: bumped by spec changes only, with the
`deprecated.daemonset.template.generation` annotation), label and field selectors with the real
grammar, `limit`/`continue` paging over consistent snapshots, a global resourceVersion, optimistic
concurrency, generateName, finalizers, namespace cascade deletion, the garbage collector's deletion of
an owner's dependents (`ownerReferences`; `propagationPolicy: Orphan` keeps them), `dryRun` (query or
DeleteOptions), the NamespaceLifecycle refusal to delete `default`, `kube-system` and
`kube-public`, the Priority admission plugin's single `globalDefault` PriorityClass, and each
type's defaulting and validation. Bodies of built-in kinds decode into their Go types as the real
server decodes them (`builtindecoding.py`; the types from kubernetes-validate's strict schemas of 1.33,
`builtintypes.py`): a value of the wrong type is refused with encoding/json's
error (400 `DaemonSet in version "v1" cannot be handled as a DaemonSet: json: cannot unmarshal bool into
Go struct field ObjectMeta.metadata.labels of type string`; on a patch 422 `patch: Invalid value`,
worded by the unstructured converter for strategic merge patches), quantities, IntOrString, Time,
MicroTime and base64 `[]byte` are parsed as their UnmarshalJSON parses them (times are stored as the
server encodes them again, in UTC, so an update that only spells a time differently is no write), fields
newer than 1.33 are unknown, and unknown fields are dropped with a `Warning` header
(`fieldValidation=Warn`, the default), silently (`Ignore`), or refused with `strict decoding error:
unknown field "spec.template.spec.containers[0].foo"` (`Strict`, kubectl's default); seeded objects must
decode too. A create carrying a resourceVersion is refused by the storage (500), after validation and
never on a dry run. `fail_requests` makes it answer chosen requests with a given Status (429, 5xx...)
to test retries.

CRDs: the CRD validation that matters (name `<plural>.<group>`, a group with a dot, scope, one
storage version, names and their defaults, printer columns, the structural schema rules), names
accepted and the CRD Established at once (already in the create answer, where a real server's
controllers write them a moment later; names another CRD of the group holds are not accepted), and
deletion with the cleanup finalizer (objects deleted, a CRD held by their finalizers until they
go). Once established, each served version is served at `/apis/<group>/<version>/...` with every
verb, selectors (`metadata.name`, `metadata.namespace`), paging and watches as for built-in types;
generation (1, then +1 for anything but metadata, and status when it is a subresource); the status
subresource; validation against the version's openAPIV3Schema (the common keywords: see
`schema.py`) worded as kube-openapi words it, then `x-kubernetes-list-type` set and map duplicates
and the `x-kubernetes-validations` CEL rules (`self`, `oldSelf` transition rules, `message`,
`messageExpression`, `fieldPath`, `reason`; Kubernetes 1.33's wording: `validationrules.py`);
pruning of unknown fields with `Warning` headers, or 400 with `fieldValidation=Strict` (kubectl's
default); defaults, stored on create and update and filled in on every read; merge and JSON patch
(strategic merge patch is 415, as for any custom resource) and server-side apply
(`application/apply-patch+yaml`, `fieldManager`, `force`: conflicts, merges by the CRD's list and map
markers, `managedFields` kept for every write: `serversideapply.py`); `PUT` needs a resourceVersion. Discovery follows
CRDs as they come and go, with short names and categories; RBAC applies by group and plural.
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io` gets custom resources as a `Table` of their
printer columns, and `/openapi/v3` describes every group version (paths, and component schemas for
custom resources), so kubectl 1.27+ validates on the server and `kubectl apply` needs no
`--validate=false`; `/openapi/v2` is an empty document, so older kubectl (Debian's 1.20) finds
nothing to validate against and applies too.

What it does NOT implement (code relying on these must be tested against a real cluster):

- API groups other than core/v1, apps/v1 (DaemonSets only: no Deployments, ReplicaSets,
  StatefulSets, ControllerRevisions), scheduling.k8s.io/v1, admissionregistration.k8s.io/v1
  (ValidatingAdmissionPolicy and its binding only), rbac.authorization.k8s.io/v1,
  authentication.k8s.io/v1 (`SelfSubjectReview` only: no `TokenReview`, no `TokenRequest`),
  authorization.k8s.io/v1 (access reviews only: no `LocalSubjectAccessReview`, no
  `SelfSubjectRulesReview`), apiextensions.k8s.io/v1 and the CRDs' groups; no events.k8s.io
  (core/v1 Events only), and core/v1 resources other than the seven above; no aggregated
  discovery (clients fall back to legacy discovery), no `storageVersionHash`.
- CRDs and custom resources: no conversion webhooks (every version holds the same fields: only
  apiVersion changes), no `scale` subresource, no `selectableFields`; CEL is cel-python's (no
  Kubernetes CEL libraries, no type checking of rules when a CRD is written, no cost estimation or
  budgets: a rule the real server would refuse as too costly is accepted here), no validation
  ratcheting (unchanged invalid fields are refused on update), no allOf/anyOf/oneOf/not evaluation,
  no check that defaults are valid and pruned, regular expressions are Python's (not RE2), and only
  some string formats are checked (see `schema.py`). Errors render Go values as JSON where the real
  server prints internal structs (`spec.versions`). Tables only for custom resources (built-in
  types answer JSON; watches answer JSON events, or with `as=PartialObjectMetadata` the metadata alone);
  `managedFields` for custom resources only.
- Authentication and authorization: an EKS token's signature is checked only when the server knows
  its cluster (`cluster_name`; `--cluster-name` on the command line, `local` by default; local mode's
  clusters), as STS would over the `x-k8s-aws-id` header (no STS is asked: the access key names the
  principal); no client certificates, no service account token issuing
  (`TokenRequest`: `service_account(ns, name, node=...)` is the identity of a token bound to a
  node, with the user extra `authentication.kubernetes.io/node-name`), no `userextras`
  impersonation. RBAC: no escalation or `bind` checks on role writes, and of the bootstrap
  policy only cluster-admin, system:discovery, system:basic-user, system:public-info-viewer and the
  user-facing admin, edit and view (their rules for the groups served here), which aggregate what
  other ClusterRoles are labelled for them, as the aggregation controller does, at once. Requests
  without a token get 401 by default; `anonymous="forbidden"` makes them `system:anonymous` (as on
  EKS: RBAC lets it read `/version` and health only), `anonymous="allowed"` serves them as the
  cluster admin.
- TLS unless `tls=True` (then HTTPS with a CA made at start, `ca_pem`, and a certificate for
  127.0.0.1 and localhost; no client certificates), HTTP/2, protobuf and CBOR bodies, `Table` output
  for built-in types, `pretty` for watch streams, gzip responses, the schemas of built-in types in
  OpenAPI (v3 has their paths only; v2 is empty). So kubectl (which sends a kubeconfig's token over
  TLS only: serve with `tls=True` and give it `write_kubeconfig`'s file) can get, watch, label,
  annotate, cordon, patch, delete and apply, but its
  typed `kubectl create <kind>` commands (protobuf bodies) get 415 and `kubectl explain` knows
  custom resources only.
- Server-side apply, `managedFields` and `fieldManager` for built-in types (their apply is 415:
  there are no schemas of them here to merge by).
- Decoding of built-in kinds: duplicate fields are not found (the JSON parser keeps the last one, as
  Go does, without the strict error), quantities keep their spelling (a real server stores the canonical
  form, `0.5` as `500m`), numbers in errors are printed as Python prints them (`1e3` as `1000.0`), a
  strategic merge patch's first error is looked for in the fields' alphabetical order (Go's is their
  declaration order), and CustomResourceDefinitions and the access reviews are not decoded as Go types
  (CRDs get the CRD validation above).
- Strategic merge patch: `retainKeys` strategies are not enforced beyond `$retainKeys`;
  `$setElementOrder` orders listed items first and keeps the rest after them.
- Validation beyond metadata (names, labels, annotations), secrets (types and their keys, data
  keys, size, `type` and `immutable`), ConfigMaps (keys, no key in both `data` and `binaryData`,
  size, `immutable`), events (the namespace rules of core/v1, and what an `eventTime` event
  requires), pods and pod templates (containers, names, images; pods' spec immutability),
  DaemonSets (selector against template labels, selector immutability, restartPolicy, update
  strategy) and PriorityClasses (value range and `system-` names, immutable value and
  preemptionPolicy): other fields are checked for their type only (decoding, above). Pod templates
  get the PodSpec and container defaults of pods, not probe, port or volume defaults.
- Admission beyond the ServiceAccount check and defaults of pods, the single default
  PriorityClass and ValidatingAdmissionPolicies (evaluated with cel-python: see `admission.py`);
  no projected token volume, no pod priority from its class, no
  LimitRange/ResourceQuota/PodSecurity, no webhooks; `metadata.generation` only for DaemonSets,
  CRDs and custom resources.
- Controllers: no scheduler, kubelet, DaemonSet controller (no pods, no status, no
  ControllerRevisions), token controller or
  root-CA publisher (no `kube-root-ca.crt` ConfigMap per namespace); events do not expire. A
  namespace's deletion removes its content at once (content with finalizers keeps it
  Terminating); pod deletion is immediate (no grace period); `gracePeriodSeconds` is accepted and
  ignored. The garbage collector works at once, on the DELETE of an owner that goes then (not when
  finalizers release one later); `Foreground` ends as `Background`; a dependent with another owner only
  loses the reference, that owner assumed present.
- Subresources other than `status` and the node proxy's `/configz` (no `binding`, `eviction`, `log`,
  `exec`, other `proxy` paths (the kubelet's 404), `ephemeralcontainers`, `resize`, namespace
  `finalize`). `/api/v1/nodes/NAME/proxy/configz` answers as the node's kubelet would (RBAC `get` on
  `nodes/proxy`), its `imagePullCredentialsVerificationPolicy` set per node with
  `set_image_credentials_policy` (`kubelet.py`).
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
