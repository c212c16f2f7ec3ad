"""RBAC: the four types are served, and enforced on every request with the API server's 403;
access reviews; dry-run deletes and namespaces that may not be deleted."""

# The typed client declares every field optional: these tests read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, no-untyped-call"

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import (
    ApiClient,
    ApiException,
    AuthorizationV1Api,
    CoreV1Api,
    RbacAuthorizationV1Api,
    V1DeleteOptions,
    V1SelfSubjectAccessReview,
    V1SubjectAccessReview,
)

from prewarm_devtools.kubeapi import Identity, KubeApiServer, service_account
from tests.support.kube import binding, call, node, pod, role, rule, status_of, subject
from tests.support.kubectl import kubectl_binary

pytestmark = pytest.mark.integration

TEAM = "team"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    """A server with namespace `team`, a node, pods and secrets, and tokens for alice, bob
    (group viewers) and the prewarm/dispatch service account; no RBAC for any of them yet."""
    with KubeApiServer() as server:
        server.seed_objects(
            [
                {"kind": "Namespace", "metadata": {"name": TEAM}},
                {"kind": "Namespace", "metadata": {"name": "prewarm"}},
                {"kind": "ServiceAccount", "metadata": {"name": "dispatch", "namespace": "prewarm"}},
                node("n1"),
                pod("web-1", TEAM),
                pod("web-1", "default"),
                {"kind": "Secret", "metadata": {"name": "pull", "namespace": TEAM}, "type": "Opaque"},
                {"kind": "Secret", "metadata": {"name": "other", "namespace": TEAM}, "type": "Opaque"},
            ]
        )
        server.add_identity("alice", Identity("alice"))
        server.add_identity("bob", Identity("bob", ("viewers",)))
        server.add_identity("dispatch", service_account("prewarm", "dispatch"))
        yield server


def grant(api: KubeApiServer, *objects: dict[str, Any]) -> None:
    """Create roles and bindings as the admin, through the API."""
    with api.api_client() as client:
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            plural = obj["kind"].lower() + "s"
            path = f"/apis/rbac.authorization.k8s.io/v1/{f'namespaces/{namespace}/' if namespace else ''}{plural}"
            answer = call(client, "POST", path, body=obj)
            assert answer.status == 201, answer.body


def forbidden(error: ApiException) -> tuple[int, str]:
    return error.status, status_of(error)["message"]


def test_the_rbac_types_are_served_and_discovered(api: KubeApiServer) -> None:
    with api.api_client() as client:
        rbac = RbacAuthorizationV1Api(client)
        # Given a Role and a RoleBinding made by the typed client
        rbac.create_namespaced_role(TEAM, role("pod-reader", [rule(["pods"], ["get"])], TEAM))
        rbac.create_namespaced_role_binding(
            TEAM, binding("alice-reads", "pod-reader", [subject("User", "alice")], TEAM)
        )
        # Then they read back, list, patch and delete as other objects do
        assert rbac.read_namespaced_role("pod-reader", TEAM).rules[0].verbs == ["get"]
        patched = rbac.patch_namespaced_role("pod-reader", TEAM, {"rules": [rule(["pods"], ["get", "list"])]})
        assert patched.rules[0].verbs == ["get", "list"]
        assert [b.metadata.name for b in rbac.list_namespaced_role_binding(TEAM).items] == ["alice-reads"]
        assert (
            rbac.read_namespaced_role_binding("alice-reads", TEAM).subjects[0].api_group == "rbac.authorization.k8s.io"
        )
        # And the bootstrap policy is there: cluster-admin bound to system:masters
        names = {r.metadata.name for r in rbac.list_cluster_role().items}
        assert {"cluster-admin", "system:discovery", "system:basic-user", "system:public-info-viewer"} <= names
        assert rbac.read_cluster_role_binding("cluster-admin").subjects[0].name == "system:masters"
        rbac.delete_namespaced_role("pod-reader", TEAM)
        with pytest.raises(ApiException) as raised:
            rbac.read_namespaced_role("pod-reader", TEAM)
        assert forbidden(raised.value) == (404, 'roles.rbac.authorization.k8s.io "pod-reader" not found')
        groups = call(client, "GET", "/apis").body
        assert {"rbac.authorization.k8s.io", "authorization.k8s.io"} <= {g["name"] for g in groups["groups"]}
        resources = call(client, "GET", "/apis/rbac.authorization.k8s.io/v1").body
        assert {r["name"]: r["namespaced"] for r in resources["resources"]} == {
            "clusterrolebindings": False,
            "clusterroles": False,
            "rolebindings": True,
            "roles": True,
        }
        reviews = call(client, "GET", "/apis/authorization.k8s.io/v1").body
        assert {r["name"] for r in reviews["resources"]} == {"selfsubjectaccessreviews", "subjectaccessreviews"}


def test_invalid_roles_and_bindings_are_422(api: KubeApiServer) -> None:
    with api.api_client() as client:
        rbac = RbacAuthorizationV1Api(client)
        with pytest.raises(ApiException) as raised:
            rbac.create_namespaced_role(TEAM, role("bad", [{"resources": ["pods"], "verbs": []}], TEAM))
        assert forbidden(raised.value) == (
            422,
            'Role.rbac.authorization.k8s.io "bad" is invalid: [rules[0].verbs: Required value: verbs must contain '
            "at least one value, rules[0].apiGroups: Required value: resource rules must supply at least one api "
            "group]",
        )
        answer = call(
            client,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            body=binding("x", "pod-reader", [subject("ServiceAccount", "dispatch")], role_kind="Role"),
        )
        assert answer.status == 422
        assert {c["field"] for c in answer.body["details"]["causes"]} == {"roleRef.kind", "subjects[0].namespace"}
        # The role a binding grants cannot change
        rbac.create_namespaced_role_binding(TEAM, binding("b", "r1", [subject("User", "alice")], TEAM))
        with pytest.raises(ApiException) as raised:
            rbac.patch_namespaced_role_binding("b", TEAM, {"roleRef": {"name": "r2"}})
        assert raised.value.status == 422 and "cannot change roleRef" in status_of(raised.value)["message"]


def test_a_role_binding_allows_in_its_namespace_only(api: KubeApiServer) -> None:
    # Given alice may get and list pods in team
    grant(
        api,
        role("pod-reader", [rule(["pods"], ["get", "list"])], TEAM),
        binding("alice-reads", "pod-reader", [subject("User", "alice")], TEAM),
    )
    with api.api_client("alice") as client:
        core = CoreV1Api(client)
        # Then she may there
        assert [p.metadata.name for p in core.list_namespaced_pod(TEAM).items] == ["web-1"]
        assert core.read_namespaced_pod("web-1", TEAM).metadata.namespace == TEAM
        # But not in default, nor across namespaces, nor any other verb, each with the API server's words
        new = pod("web-2", TEAM)
        status = {"status": {"phase": "Failed"}}
        denied = [
            (lambda: core.list_namespaced_pod("default"), "pods", "list", "pods", "default"),
            (lambda: core.read_namespaced_pod("web-1", "default"), 'pods "web-1"', "get", "pods", "default"),
            (lambda: core.list_pod_for_all_namespaces(), "pods", "list", "pods", ""),
            (lambda: core.list_namespaced_pod(TEAM, watch=True, timeout_seconds=1), "pods", "watch", "pods", TEAM),
            (lambda: core.delete_namespaced_pod("web-1", TEAM), 'pods "web-1"', "delete", "pods", TEAM),
            (lambda: core.delete_collection_namespaced_pod(TEAM), "pods", "deletecollection", "pods", TEAM),
            (lambda: core.create_namespaced_pod(TEAM, new), "pods", "create", "pods", TEAM),
            (lambda: core.patch_namespaced_pod_status("web-1", TEAM, status), 'pods "web-1"', "patch",
             "pods/status", TEAM),
        ]  # fmt: skip
        for attempt, what, verb, resource, namespace in denied:
            with pytest.raises(ApiException) as raised:
                attempt()
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            assert forbidden(raised.value) == (
                403,
                f'{what} is forbidden: User "alice" cannot {verb} resource "{resource}" in API group "" {scope}',
            )
        body = status_of(raised.value)
        assert (body["reason"], body["details"]) == ("Forbidden", {"name": "web-1", "kind": "pods"})


def test_a_cluster_role_binding_to_a_group_allows_cluster_scoped_reads(api: KubeApiServer) -> None:
    # Given group viewers may get, list and watch nodes
    grant(
        api,
        role("node-viewer", [rule(["nodes"], ["get", "list", "watch"])]),
        binding("viewers", "node-viewer", [subject("Group", "viewers")]),
    )
    with api.api_client("bob") as client:
        core = CoreV1Api(client)
        # Then bob, a viewer, may read nodes
        assert [n.metadata.name for n in core.list_node().items] == ["n1"]
        assert core.read_node("n1").metadata.name == "n1"
        # But not write them, nor read their status subresource
        with pytest.raises(ApiException) as raised:
            core.delete_node("n1")
        assert forbidden(raised.value) == (
            403,
            'nodes "n1" is forbidden: User "bob" cannot delete resource "nodes" in API group "" at the cluster scope',
        )
        with pytest.raises(ApiException) as raised:
            core.read_node_status("n1")
        assert forbidden(raised.value) == (
            403,
            'nodes "n1" is forbidden: User "bob" cannot get resource "nodes/status" in API group "" '
            "at the cluster scope",
        )
    # And alice, no viewer, may not read them
    with api.api_client("alice") as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_node()
    assert raised.value.status == 403


def test_service_accounts_are_bound_by_name_and_by_their_groups(api: KubeApiServer) -> None:
    # Given the dispatch account bound by name (its namespace taken from the binding) to read pods in prewarm,
    # and all accounts of prewarm bound, as a group, to read nodes
    grant(
        api,
        role("pod-reader", [rule(["pods"], ["list"])], "prewarm"),
        binding("dispatch-pods", "pod-reader", [subject("ServiceAccount", "dispatch")], "prewarm"),
        role("node-lister", [rule(["nodes"], ["list"])]),
        binding("prewarm-nodes", "node-lister", [subject("Group", "system:serviceaccounts:prewarm")]),
    )
    with api.api_client("dispatch") as client:
        core = CoreV1Api(client)
        assert core.list_namespaced_pod("prewarm").items == []
        assert len(core.list_node().items) == 1
        with pytest.raises(ApiException) as raised:
            core.list_namespaced_pod(TEAM)
        assert forbidden(raised.value) == (
            403,
            'pods is forbidden: User "system:serviceaccount:prewarm:dispatch" cannot list resource "pods" '
            'in API group "" in the namespace "team"',
        )


def test_resource_names_subresources_and_wildcards(api: KubeApiServer) -> None:
    # Given alice may get the secret `pull` only, patch any status subresource, and do anything to
    # service accounts (any verb), in team
    grant(
        api,
        role(
            "narrow",
            [
                rule(["secrets"], ["get", "list"], names=["pull"]),
                rule(["*/status"], ["patch"]),
                rule(["serviceaccounts"], ["*"], groups=("*",)),
            ],
            TEAM,
        ),
        binding("alice-narrow", "narrow", [subject("User", "alice")], TEAM),
    )
    with api.api_client("alice") as client:
        core = CoreV1Api(client)
        assert core.read_namespaced_secret("pull", TEAM).metadata.name == "pull"
        # A list names no object unless its field selector asks for exactly one
        assert len(core.list_namespaced_secret(TEAM, field_selector="metadata.name=pull").items) == 1
        for attempt in (lambda: core.read_namespaced_secret("other", TEAM), lambda: core.list_namespaced_secret(TEAM)):
            with pytest.raises(ApiException) as raised:
                attempt()
            assert raised.value.status == 403
        assert core.patch_namespaced_pod_status("web-1", TEAM, {"status": {"phase": "Succeeded"}}).status.phase == (
            "Succeeded"
        )
        with pytest.raises(ApiException) as raised:
            core.patch_namespaced_pod("web-1", TEAM, {"metadata": {"labels": {"a": "b"}}})
        assert raised.value.status == 403
        core.create_namespaced_service_account(TEAM, {"metadata": {"name": "bot"}})
        core.delete_namespaced_service_account("bot", TEAM)


def test_rbac_objects_are_guarded_in_their_own_group(api: KubeApiServer) -> None:
    with api.api_client("alice") as client, pytest.raises(ApiException) as raised:
        RbacAuthorizationV1Api(client).list_namespaced_role(TEAM)
    body = status_of(raised.value)
    assert (body["message"], body["details"]) == (
        'roles.rbac.authorization.k8s.io is forbidden: User "alice" cannot list resource "roles" '
        'in API group "rbac.authorization.k8s.io" in the namespace "team"',
        {"group": "rbac.authorization.k8s.io", "kind": "roles"},
    )


def test_a_binding_to_a_missing_role_says_so_in_the_denial(api: KubeApiServer) -> None:
    grant(api, binding("dangling", "gone", [subject("User", "alice")], TEAM))
    with api.api_client("alice") as client, pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_namespaced_pod(TEAM)
    assert forbidden(raised.value) == (
        403,
        'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "team": '
        'RBAC: role.rbac.authorization.k8s.io "gone" not found',
    )


def test_non_resource_urls_follow_the_bootstrap_policy() -> None:
    # Given anonymous requests allowed in, as on EKS
    with KubeApiServer(anonymous="forbidden") as api, ApiClient(api.client_configuration()) as client:
        client.configuration.api_key = {}
        # Then health and version are public, discovery is for authenticated users only
        assert call(client, "GET", "/version", authenticate=False).status == 200
        answer = call(client, "GET", "/api", authenticate=False)
        assert (answer.status, answer.body["message"], answer.body["details"]) == (
            403,
            'forbidden: User "system:anonymous" cannot get path "/api"',
            {},
        )
    with KubeApiServer(identities={"alice": Identity("alice")}) as api, api.api_client("alice") as client:
        assert call(client, "GET", "/apis").status == 200


def test_self_subject_access_reviews_answer_for_the_caller(api: KubeApiServer) -> None:
    grant(
        api,
        role("pod-reader", [rule(["pods"], ["list"])], TEAM),
        binding("alice-reads", "pod-reader", [subject("User", "alice")], TEAM),
    )
    with api.api_client("alice") as client:
        reviews = AuthorizationV1Api(client)

        def can(verb: str, resource: str, namespace: str) -> Any:
            spec = {"resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace}}
            return reviews.create_self_subject_access_review(V1SelfSubjectAccessReview(spec=spec)).status

        allowed = can("list", "pods", TEAM)
        assert allowed.allowed is True
        assert allowed.reason == 'RBAC: allowed by RoleBinding "alice-reads/team" of Role "pod-reader" to User "alice"'
        assert can("list", "pods", "default").allowed is False
        assert can("delete", "pods", TEAM).allowed is False
        path = {"nonResourceAttributes": {"path": "/api", "verb": "get"}}
        status = reviews.create_self_subject_access_review(V1SelfSubjectAccessReview(spec=path)).status
        assert (status.allowed, status.reason) == (
            True,
            'RBAC: allowed by ClusterRoleBinding "system:discovery" of ClusterRole "system:discovery" to Group '
            '"system:authenticated"',
        )
        answer = call(client, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={"spec": {}})
        assert (answer.status, answer.body["message"]) == (
            422,
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: '
            '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
        )
        # Alice may not ask about others
        with pytest.raises(ApiException) as raised:
            reviews.create_subject_access_review(
                V1SubjectAccessReview(spec={"user": "bob", "resourceAttributes": {"verb": "get", "resource": "pods"}})
            )
        assert forbidden(raised.value) == (
            403,
            'subjectaccessreviews.authorization.k8s.io is forbidden: User "alice" cannot create resource '
            '"subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope',
        )


def test_subject_access_reviews_answer_for_any_user_groups_and_service_account(api: KubeApiServer) -> None:
    grant(
        api,
        role("node-viewer", [rule(["nodes"], ["get"])]),
        binding(
            "viewers", "node-viewer", [subject("Group", "viewers"), subject("ServiceAccount", "dispatch", "prewarm")]
        ),
    )
    with api.api_client() as client:
        reviews = AuthorizationV1Api(client)

        def review(spec: dict[str, Any]) -> Any:
            spec = {**spec, "resourceAttributes": {"verb": "get", "resource": "nodes", "name": "n1"}}
            return reviews.create_subject_access_review(V1SubjectAccessReview(spec=spec)).status

        assert review({"user": "bob", "groups": ["viewers"]}).allowed is True
        assert review({"user": "bob"}).allowed is False
        allowed = review({"user": "system:serviceaccount:prewarm:dispatch"})
        assert (allowed.allowed, allowed.reason) == (
            True,
            'RBAC: allowed by ClusterRoleBinding "viewers" of ClusterRole "node-viewer" to ServiceAccount '
            '"dispatch/prewarm"',
        )
        assert review({"user": "root", "groups": ["system:masters"]}).allowed is True
        answer = call(
            client,
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={"spec": {"resourceAttributes": {"verb": "get", "resource": "nodes"}}},
        )
        assert (answer.status, answer.body["message"]) == (
            422,
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": at least one of '
            "user or group must be specified",
        )


@pytest.mark.parametrize("where", ["query", "body"])
def test_a_dry_run_delete_deletes_nothing(api: KubeApiServer, where: str) -> None:
    with api.api_client() as client:
        core = CoreV1Api(client)
        if where == "query":
            deleted = core.delete_namespaced_pod("web-1", TEAM, dry_run="All")
            core.delete_namespace(TEAM, dry_run="All")
        else:
            deleted = core.delete_namespaced_pod("web-1", TEAM, body=V1DeleteOptions(dry_run=["All"]))
            core.delete_namespace(TEAM, body=V1DeleteOptions(dry_run=["All"]))
        assert deleted.metadata.name == "web-1"
        assert core.read_namespaced_pod("web-1", TEAM).metadata.deletion_timestamp is None
        assert core.read_namespace(TEAM).status.phase == "Active"
        answer = call(client, "DELETE", f"/api/v1/namespaces/{TEAM}/pods/web-1", body={"dryRun": ["Some"]})
        assert (answer.status, answer.body["message"]) == (
            422,
            'DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{"Some"}: supported values: '
            '"All"',
        )
        core.delete_namespaced_pod("web-1", TEAM)
        assert [p.metadata.name for p in core.list_namespaced_pod(TEAM).items] == []


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-public"])
def test_system_namespaces_may_not_be_deleted_even_by_the_admin(api: KubeApiServer, namespace: str) -> None:
    with api.api_client() as client:
        core = CoreV1Api(client)
        for dry_run in ("All", None):
            with pytest.raises(ApiException) as raised:
                core.delete_namespace(namespace, dry_run=dry_run)
            body = status_of(raised.value)
            assert (raised.value.status, body["reason"], body["message"], body["details"]) == (
                403,
                "Forbidden",
                f'namespaces "{namespace}" is forbidden: this namespace may not be deleted',
                {"name": namespace, "kind": "namespaces"},
            )
        assert core.read_namespace(namespace).status.phase == "Active"
        # Others may be
        core.delete_namespace("kube-node-lease")


KUBECTL = kubectl_binary()


def test_kubectl_auth_can_i_and_a_forbidden_get(api: KubeApiServer, tmp_path: Path) -> None:
    # Given kubectl (which sends no token over plain HTTP: the server serves it as the admin) and
    # alice, who may list pods in team
    grant(
        api,
        role("pod-reader", [rule(["pods"], ["get", "list"])], TEAM),
        binding("alice-reads", "pod-reader", [subject("User", "alice")], TEAM),
    )
    with KubeApiServer(anonymous="allowed") as local:
        local.seed_objects(api.list_objects("namespaces") + api.list_objects("pods", TEAM))
        local.seed_objects(api.list_objects("roles", TEAM) + api.list_objects("rolebindings", TEAM))
        kubeconfig = str(local.write_kubeconfig(tmp_path / "config"))

        def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [KUBECTL, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60, check=False
            )

        # When kubectl asks, as alice (impersonation), Then the answers are RBAC's
        assert kubectl("auth", "can-i", "list", "pods", "-n", TEAM, "--as", "alice").stdout.strip() == "yes"
        no = kubectl("auth", "can-i", "delete", "pods", "-n", TEAM, "--as", "alice")
        assert (no.returncode, no.stdout.strip()) == (1, "no")
        assert kubectl("get", "pods", "-n", TEAM, "--as", "alice", "-o", "name").stdout.split() == ["pod/web-1"]
        denied = kubectl("get", "pods", "-n", "default", "--as", "alice")
        assert denied.returncode == 1
        assert denied.stderr.strip().endswith(
            'Error from server (Forbidden): pods is forbidden: User "alice" cannot list resource "pods" in API group '
            '"" in the namespace "default"'
        )
        protected = kubectl("delete", "namespace", "kube-system")
        assert 'namespaces "kube-system" is forbidden: this namespace may not be deleted' in protected.stderr


def test_the_built_in_user_roles_aggregate_what_is_labelled_for_them(api: KubeApiServer) -> None:
    # Given prewarm's job roles, labelled to aggregate into edit and admin (jobs) and view (reading them)
    manifest = Path(__file__).resolve().parents[3] / "cli/prewarm_cli/install/manifests/80-resources-rbac.yaml"
    shipped = [d for d in yaml.safe_load_all(manifest.read_text()) if d and d["metadata"]["name"].startswith(
        "prewarm-jobs-")]
    assert {d["metadata"]["name"] for d in shipped} == {"prewarm-jobs-edit", "prewarm-jobs-view"}
    # And alice bound to the built-in edit role in team, bob (group viewers) to view
    grant(api, *shipped,
          binding("alice-edits", "edit", [subject("User", "alice")], TEAM, role_kind="ClusterRole"),
          binding("viewers-view", "view", [subject("Group", "viewers")], TEAM, role_kind="ClusterRole"))

    def can(user: str, verb: str, resource: str, group: str = "prewarm.dev") -> bool:
        with api.api_client(user) as client:
            spec = {"resourceAttributes": {"verb": verb, "resource": resource, "group": group, "namespace": TEAM}}
            review = AuthorizationV1Api(client).create_self_subject_access_review(V1SelfSubjectAccessReview(spec=spec))
            return bool(review.status.allowed)

    # Then edit holds prewarm's job rules and the built-in ones, as on EKS; view reads and never writes
    assert can("alice", "create", "imagepulljobs") and can("alice", "delete", "imagelistpulljobs")
    assert can("alice", "create", "secrets", "") and can("alice", "list", "pods", "")
    assert not can("alice", "create", "rolebindings", "rbac.authorization.k8s.io")  # admin's, not edit's
    assert can("bob", "list", "imagepulljobs") and can("bob", "get", "imagepulljobs/status")
    assert not can("bob", "create", "imagepulljobs") and not can("bob", "get", "secrets", "")
    # And admin gathers edit's rules (edit aggregates into admin) with its own
    admin = {tuple(r["resources"]) for r in api.get_object("clusterroles", "admin")["rules"]}
    assert ("imagepulljobs", "imagelistpulljobs", "advancedcronjobs") in admin and ("rolebindings", "roles") in admin
    # And a role that stops matching leaves the aggregate
    with api.api_client() as client:
        answer = call(client, "DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/prewarm-jobs-edit")
        assert answer.status == 200
    assert not can("alice", "create", "imagepulljobs")
