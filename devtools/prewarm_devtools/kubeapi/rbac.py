"""Authorization: what a request asks (RequestInfo), and whether RBAC allows it.

`request_attributes` reads a request as k8s.io/apiserver's RequestInfoFactory does; `Authorizer`
decides as the API server's authorizer chain does: members of `system:masters` may do anything,
then the stored ClusterRoleBindings and RoleBindings grant what their roles' rules allow. The
answers (a denial's message, an allowed review's reason) are worded as the API server words them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.auth import MASTERS, Identity
from prewarm_devtools.kubeapi.errors import StatusError
from prewarm_devtools.kubeapi.resources.apps import selector_requirements
from prewarm_devtools.kubeapi.resources.rbac import RBAC_GROUP
from prewarm_devtools.kubeapi.selectors import LabelSelector
from prewarm_devtools.kubeapi.store import Store

__all__ = ["BOOTSTRAP_POLICY", "Attributes", "Authorizer", "Decision", "aggregated_rules", "request_attributes"]

Obj = dict[str, Any]

_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Attributes:
    """What a request (or an access review) asks to do."""

    verb: str
    resource_request: bool
    path: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def _exact_name(field_selector: str) -> str:
    """The name a `metadata.name=<name>` term of a field selector requires, or ""."""
    for term in field_selector.split(","):
        key, _, value = term.replace("==", "=").partition("=")
        if key.strip() == "metadata.name" and not key.endswith("!"):
            name = value.strip()
            return name if name not in (".", "..") and "/" not in name and "%" not in name else ""
    return ""


def request_attributes(method: str, path: str, query: dict[str, str]) -> Attributes:
    """The attributes of an HTTP request, as RequestInfoFactory reads them."""
    parts = [p for p in path.split("/") if p]
    non_resource = Attributes(verb=method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return non_resource
        verb, parts = parts[0], parts[1:]
        special = True
    else:
        verb, special = _METHOD_VERBS.get(method, ""), False
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 and not special else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("1", "t", "T", "true", "TRUE", "True") else "list"
    if not name and verb in ("list", "watch"):
        name = _exact_name(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, True, path, group, version, resource, subresource, namespace, name)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _resource_matches(rule_resources: list[str], combined: str, subresource: str) -> bool:
    for resource in rule_resources:
        if resource in ("*", combined):
            return True
        if subresource and resource == f"*/{subresource}":
            return True
    return False


def _url_matches(rule_urls: list[str], path: str) -> bool:
    for url in rule_urls:
        if url in ("*", path):
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


def rule_allows(attributes: Attributes, rule: Obj) -> bool:
    """RBAC's RuleAllows: verbs, then API groups, resources and names, or non-resource URLs."""
    verbs = list(rule.get("verbs") or [])
    if not _matches(verbs, attributes.verb):
        return False
    if not attributes.resource_request:
        return _url_matches(list(rule.get("nonResourceURLs") or []), attributes.path)
    combined = attributes.resource + (f"/{attributes.subresource}" if attributes.subresource else "")
    names = list(rule.get("resourceNames") or [])
    return (
        _matches(list(rule.get("apiGroups") or []), attributes.group)
        and _resource_matches(list(rule.get("resources") or []), combined, attributes.subresource)
        and (not names or attributes.name in names)
    )


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _describe_subject(subject: Obj, binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f"ServiceAccount {_quote(subject.get('name', '') + '/' + namespace)}"
    return f"{subject.get('kind')} {_quote(subject.get('name', ''))}"


def _applies_to(identity: Identity, subject: Obj, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name") or ""
    if kind == "User":
        return identity.user == name
    if kind == "Group":
        return name in identity.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and identity.user == f"system:serviceaccount:{namespace}:{name}"
    return False


class Authorizer:
    """RBAC over the roles and bindings in `store`, behind the `system:masters` short cut."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def authorize(self, identity: Identity, attributes: Attributes) -> Decision:
        if MASTERS in identity.groups:
            return Decision(True)
        problems: list[str] = []
        for source, rule in self._rules(identity, attributes.namespace, problems):
            if rule_allows(attributes, rule):
                return Decision(True, f"RBAC: allowed by {source}")
        if not problems:
            return Decision(False)
        reason = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        return Decision(False, f"RBAC: {reason}")

    def check(self, identity: Identity, attributes: Attributes) -> None:
        """Nothing when allowed; the API server's 403 otherwise."""
        decision = self.authorize(identity, attributes)
        if not decision.allowed:
            raise forbidden(identity, attributes, decision.reason)

    def _rules(self, identity: Identity, namespace: str, problems: list[str]) -> Iterator[tuple[str, Obj]]:
        for binding in self._objects("clusterrolebindings", ""):
            yield from self._binding_rules(identity, binding, "", problems, self._describe_cluster_binding)
        if namespace:
            for binding in self._objects("rolebindings", f"{namespace}/"):
                yield from self._binding_rules(identity, binding, namespace, problems, self._describe_binding)

    def _objects(self, resource: str, prefix: str) -> list[Obj]:
        snapshot = self.store.snapshot(resource)
        lo, hi = snapshot.bounds(prefix)
        return [entry.obj for entry in snapshot.entries[lo:hi]]

    @staticmethod
    def _describe_cluster_binding(binding: Obj, subject: Obj) -> str:
        ref = binding.get("roleRef") or {}
        return (
            f"ClusterRoleBinding {_quote(binding['metadata']['name'])} of {ref.get('kind')} "
            f"{_quote(ref.get('name', ''))} to {_describe_subject(subject, '')}"
        )

    @staticmethod
    def _describe_binding(binding: Obj, subject: Obj) -> str:
        ref, meta = binding.get("roleRef") or {}, binding["metadata"]
        return (
            f"RoleBinding {_quote(meta['name'] + '/' + meta['namespace'])} of {ref.get('kind')} "
            f"{_quote(ref.get('name', ''))} to {_describe_subject(subject, meta['namespace'])}"
        )

    def _binding_rules(
        self,
        identity: Identity,
        binding: Obj,
        namespace: str,
        problems: list[str],
        describe: Callable[[Obj, Obj], str],
    ) -> Iterator[tuple[str, Obj]]:
        subject = next((s for s in binding.get("subjects") or [] if _applies_to(identity, s, namespace)), None)
        if subject is None:
            return
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = self.store.get("clusterroles", str(ref.get("name")))
            missing = f'clusterrole.{RBAC_GROUP} "{ref.get("name")}" not found'
        else:
            role = self.store.get("roles", f"{namespace}/{ref.get('name')}")
            missing = f'role.{RBAC_GROUP} "{ref.get("name")}" not found'
        if role is None:
            problems.append(missing)
            return
        source = describe(binding, subject)
        for rule in role.obj.get("rules") or []:
            yield source, rule


def forbidden(identity: Identity, attributes: Attributes, reason: str = "") -> StatusError:
    """The API server's 403 for a denied request, worded as responsewriters.Forbidden words it."""
    user = _quote(identity.user)
    if not attributes.resource_request:
        why = f"User {user} cannot {attributes.verb} path {_quote(attributes.path)}"
    else:
        resource = attributes.resource + (f"/{attributes.subresource}" if attributes.subresource else "")
        why = (
            f"User {user} cannot {attributes.verb} resource {_quote(resource)} in API group {_quote(attributes.group)}"
        )
        why += f" in the namespace {_quote(attributes.namespace)}" if attributes.namespace else " at the cluster scope"
    if reason:
        why += f": {reason}"
    if not attributes.resource_request:
        return errors.forbidden(f"forbidden: {why}")
    return errors.forbidden_resource(attributes.resource, attributes.name, attributes.group, why)


def _cluster_role(name: str, rules: list[Obj]) -> Obj:
    return {
        "kind": "ClusterRole",
        "apiVersion": f"{RBAC_GROUP}/v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "rules": rules,
    }


def _cluster_binding(name: str, role: str, groups: tuple[str, ...]) -> Obj:
    return {
        "kind": "ClusterRoleBinding",
        "apiVersion": f"{RBAC_GROUP}/v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
    }


_AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]


def _aggregated_role(name: str, into: str | None, selects: str) -> Obj:
    """`admin`, `edit` or `view`: rules gathered from the ClusterRoles labelled `aggregate-to-<selects>`."""
    role = _cluster_role(name, [])
    if into:
        role["metadata"]["labels"][_AGGREGATE + into] = "true"
    role["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {_AGGREGATE + selects: "true"}}]}
    return role


def _aggregate_to(name: str, rules: list[Obj]) -> Obj:
    role = _cluster_role(f"system:aggregate-to-{name}", rules)
    role["metadata"]["labels"][_AGGREGATE + name] = "true"
    return role


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


# The user-facing roles of the bootstrap policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go),
# for the groups served here: what `view`, `edit` and `admin` hold before anything aggregates into them.
_USER_FACING: tuple[Obj, ...] = (
    _aggregated_role("admin", None, "admin"),
    _aggregated_role("edit", "admin", "edit"),
    _aggregated_role("view", "edit", "view"),
    _aggregate_to("view", [
        _rule([""], ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
                     "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
                     "services/status"], _READ),
        _rule([""], ["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
                     "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"], _READ),
        _rule([""], ["namespaces"], _READ),
        _rule(["apps"], ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                         "deployments/status", "replicasets", "replicasets/scale", "replicasets/status",
                         "statefulsets", "statefulsets/scale", "statefulsets/status"], _READ),
    ]),
    _aggregate_to("edit", [
        _rule([""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"],
              _READ),
        _rule([""], ["serviceaccounts"], ["impersonate"]),
        _rule([""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], _WRITE),
        _rule([""], ["pods/eviction"], ["create"]),
        _rule([""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                     "replicationcontrollers/scale", "secrets", "serviceaccounts", "services", "services/proxy"],
              _WRITE),
        _rule([""], ["serviceaccounts/token"], ["create"]),
        _rule(["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale", "replicasets",
                         "replicasets/scale", "statefulsets", "statefulsets/scale"], _WRITE),
    ]),
    _aggregate_to("admin", [
        _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
        _rule([RBAC_GROUP], ["rolebindings", "roles"],
              ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]),
    ]),
)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    return LabelSelector(tuple(selector_requirements(selector) or ())).matches(labels)


def aggregated_rules(roles: list[Obj]) -> dict[str, list[Obj]]:
    """What the ClusterRole aggregation controller writes: for each role with an `aggregationRule`, the rules
    of every other ClusterRole its selectors match, taken in name order, each rule once; repeated until
    nothing changes (an aggregated role may itself be aggregated, as `edit` is into `admin`)."""
    by_name = {str(r["metadata"]["name"]): r for r in roles}
    rules = {name: list(r.get("rules") or []) for name, r in by_name.items()}
    changed: dict[str, list[Obj]] = {}
    for _ in range(len(by_name) + 1):
        moved = False
        for name, role in sorted(by_name.items()):
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if selectors is None:
                continue
            gathered: list[Obj] = []
            for other, candidate in sorted(by_name.items()):
                labels = (candidate.get("metadata") or {}).get("labels") or {}
                if other != name and any(_selects(sel or {}, labels) for sel in selectors):
                    gathered += [r for r in rules[other] if r not in gathered]
            if gathered != rules[name]:
                rules[name] = changed[name] = gathered
                moved = True
        if not moved:
            break
    return changed


_PUBLIC_INFO = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
#: The part of the API server's bootstrap policy that matters here: cluster-admin for
#: system:masters, discovery and self reviews for every authenticated user, health and version
#: for everyone (anonymous requests included, when anonymous authentication is on), and the
#: user-facing `admin`, `edit` and `view`, which other ClusterRoles aggregate into.
BOOTSTRAP_POLICY: tuple[Obj, ...] = (
    _cluster_role(
        "cluster-admin",
        [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}],
    ),
    _cluster_role(
        "system:discovery",
        [
            {
                "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *_PUBLIC_INFO],
                "verbs": ["get"],
            }
        ],
    ),
    _cluster_role(
        "system:basic-user",
        [
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            },
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
        ],
    ),
    _cluster_role("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_INFO, "verbs": ["get"]}]),
    *_USER_FACING,
    _cluster_binding("cluster-admin", "cluster-admin", (MASTERS,)),
    _cluster_binding("system:discovery", "system:discovery", ("system:authenticated",)),
    _cluster_binding("system:basic-user", "system:basic-user", ("system:authenticated",)),
    _cluster_binding(
        "system:public-info-viewer", "system:public-info-viewer", ("system:authenticated", "system:unauthenticated")
    ),
)
