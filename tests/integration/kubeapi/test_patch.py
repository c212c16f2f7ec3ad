"""PATCH in the three formats, with the list strategies of the real core/v1 types."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import base64

import pytest
from kubernetes.client import ApiClient, ApiException, CoreV1Api

from tests.support.kube import call, node, status_of

pytestmark = pytest.mark.integration

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def patch(client: ApiClient, path: str, body: object, content_type: str) -> dict:  # type: ignore[type-arg]
    answer = call(client, "PATCH", path, body=body, content_type=content_type)
    assert answer.status == 200, answer.body
    result: dict = answer.body  # type: ignore[type-arg]
    return result


@pytest.mark.parametrize("content_type", [MERGE, STRATEGIC])
def test_label_patch_adds_changes_and_null_deletes(kube_client: ApiClient, content_type: str) -> None:
    # Given a node with three labels
    call(kube_client, "POST", "/api/v1/nodes", body=node("n1", {"keep": "1", "change": "old", "drop": "x"}))
    # When a patch changes one, deletes one with null and adds one
    body = {"metadata": {"labels": {"change": "new", "drop": None, "add": "yes"}}}
    patched = patch(kube_client, "/api/v1/nodes/n1", body, content_type)
    # Then the others are kept
    assert patched["metadata"]["labels"] == {"keep": "1", "change": "new", "add": "yes"}


def test_merge_patch_replaces_lists_whole(kube_client: ApiClient) -> None:
    call(
        kube_client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        body={"metadata": {"name": "sa"}, "secrets": [{"name": "a"}]},
    )
    patched = patch(kube_client, "/api/v1/namespaces/default/serviceaccounts/sa", {"secrets": [{"name": "b"}]}, MERGE)
    assert patched["secrets"] == [{"name": "b"}]


def test_strategic_merge_of_a_merge_keyed_list_keeps_existing_entries_and_adds_no_duplicates(
    core_v1: CoreV1Api,
) -> None:
    # Given a service account whose `secrets` (patch strategy merge, key name) hold a and b
    core_v1.create_namespaced_service_account(
        "default", {"metadata": {"name": "sa"}, "secrets": [{"name": "a"}, {"name": "b"}]}
    )
    # When a strategic merge patch sends b again and c
    patched = core_v1.patch_namespaced_service_account("sa", "default", {"secrets": [{"name": "b"}, {"name": "c"}]})
    # Then a and b stay, c is added, b is not doubled
    assert [s.name for s in patched.secrets] == ["a", "b", "c"]


def test_strategic_merge_delete_directive_removes_one_entry(core_v1: CoreV1Api) -> None:
    core_v1.create_namespaced_service_account(
        "default", {"metadata": {"name": "sa"}, "secrets": [{"name": "a"}, {"name": "b"}]}
    )
    patched = core_v1.patch_namespaced_service_account(
        "sa", "default", {"secrets": [{"name": "a", "$patch": "delete"}]}
    )
    assert [s.name for s in patched.secrets] == ["b"]


def test_strategic_merge_replace_directive_replaces_the_list(core_v1: CoreV1Api) -> None:
    core_v1.create_namespaced_service_account("default", {"metadata": {"name": "sa"}, "secrets": [{"name": "a"}]})
    body = {"secrets": [{"$patch": "replace"}, {"name": "z"}]}
    assert [s.name for s in core_v1.patch_namespaced_service_account("sa", "default", body).secrets] == ["z"]


def test_strategic_merge_replaces_service_account_image_pull_secrets_as_eks_does(core_v1: CoreV1Api) -> None:
    # Given a service account with an image pull secret
    body = {"metadata": {"name": "builder"}, "imagePullSecrets": [{"name": "existing"}]}
    core_v1.create_namespaced_service_account("default", body)
    # When a strategic merge patch sends another one
    patched = core_v1.patch_namespaced_service_account(
        "builder", "default", {"imagePullSecrets": [{"name": "prewarm"}]}
    )
    # Then the list is replaced: ServiceAccount.imagePullSecrets has no patch merge key (listType atomic)
    assert [s.name for s in patched.image_pull_secrets] == ["prewarm"]


def test_json_patch_appends_an_image_pull_secret_keeping_the_others(core_v1: CoreV1Api) -> None:
    # Given a service account with an image pull secret
    created = core_v1.create_namespaced_service_account(
        "default", {"metadata": {"name": "builder"}, "imagePullSecrets": [{"name": "existing"}]}
    )
    # When a JSON patch tests the resourceVersion and appends to the list
    operations = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": created.metadata.resource_version},
        {"op": "add", "path": "/imagePullSecrets/-", "value": {"name": "prewarm"}},
    ]
    patched = core_v1.patch_namespaced_service_account("builder", "default", operations)
    # Then both secrets are there
    assert [s.name for s in patched.image_pull_secrets] == ["existing", "prewarm"]


def test_json_patch_whose_test_fails_is_422_and_changes_nothing(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("n1", {"a": "1"}))
    operations = [
        {"op": "test", "path": "/metadata/labels/a", "value": "2"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "3"},
    ]
    with pytest.raises(ApiException) as raised:
        core_v1.patch_node("n1", operations)
    assert (raised.value.status, status_of(raised.value)["reason"]) == (422, "Invalid")
    assert core_v1.read_node("n1").metadata.labels == {"a": "1"}


def test_json_patch_escapes_slashes_in_label_keys(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("n1"))
    patched = core_v1.patch_node("n1", [{"op": "add", "path": "/metadata/labels/example.com~1team", "value": "ml"}])
    assert patched.metadata.labels == {"example.com/team": "ml"}


def test_node_conditions_merge_by_type_through_the_status_subresource(
    core_v1: CoreV1Api, kube_client: ApiClient
) -> None:
    conditions = [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]
    call(kube_client, "POST", "/api/v1/nodes", body={**node("n1"), "status": {"conditions": conditions}})
    patched = core_v1.patch_node_status("n1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert [(c.type, c.status) for c in patched.status.conditions] == [("Ready", "False"), ("DiskPressure", "False")]


def test_finalizers_union_and_delete_from_primitive_list(kube_client: ApiClient) -> None:
    body = node("n1")
    body["metadata"]["finalizers"] = ["a/one", "a/two"]
    call(kube_client, "POST", "/api/v1/nodes", body=body)
    added = patch(kube_client, "/api/v1/nodes/n1", {"metadata": {"finalizers": ["a/two", "a/three"]}}, STRATEGIC)
    assert added["metadata"]["finalizers"] == ["a/one", "a/two", "a/three"]
    removed = patch(
        kube_client, "/api/v1/nodes/n1", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/one"]}}, STRATEGIC
    )
    assert removed["metadata"]["finalizers"] == ["a/two", "a/three"]
    patch(kube_client, "/api/v1/nodes/n1", {"metadata": {"finalizers": None}}, MERGE)


def test_secret_data_merges_by_key_and_string_data_is_folded(kube_client: ApiClient) -> None:
    created = {
        "metadata": {"name": "s"},
        "data": {"a": base64.b64encode(b"1").decode(), "b": base64.b64encode(b"2").decode()},
    }
    call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=created)
    patched = patch(
        kube_client, "/api/v1/namespaces/default/secrets/s", {"data": {"a": None}, "stringData": {"c": "3"}}, STRATEGIC
    )
    assert {k: base64.b64decode(v).decode() for k, v in patched["data"].items()} == {"b": "2", "c": "3"}
    assert "stringData" not in patched


def test_patch_with_a_stale_resource_version_is_409(kube_client: ApiClient) -> None:
    call(kube_client, "POST", "/api/v1/nodes", body=node("n1"))
    answer = call(
        kube_client,
        "PATCH",
        "/api/v1/nodes/n1",
        body={"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}},
        content_type=MERGE,
    )
    assert (answer.status, answer.body["reason"]) == (409, "Conflict")


def test_patch_of_a_missing_object_is_404(kube_client: ApiClient) -> None:
    answer = call(kube_client, "PATCH", "/api/v1/nodes/ghost", body={"metadata": {}}, content_type=MERGE)
    assert (answer.status, answer.body["message"]) == (404, 'nodes "ghost" not found')


def test_server_side_apply_of_a_built_in_type_is_415(kube_client: ApiClient) -> None:
    call(kube_client, "POST", "/api/v1/nodes", body=node("n1"))
    answer = call(
        kube_client, "PATCH", "/api/v1/nodes/n1", body="metadata: {}", content_type="application/apply-patch+yaml"
    )
    assert (answer.status, answer.body["reason"]) == (415, "UnsupportedMediaType")


def test_strategic_merge_item_without_its_merge_key_is_refused(kube_client: ApiClient) -> None:
    call(kube_client, "POST", "/api/v1/namespaces/default/serviceaccounts", body={"metadata": {"name": "sa"}})
    answer = call(
        kube_client,
        "PATCH",
        "/api/v1/namespaces/default/serviceaccounts/sa",
        body={"secrets": [{"namespace": "x"}]},
        content_type=STRATEGIC,
    )
    assert answer.status == 500
    assert answer.body["message"].endswith("does not contain declared merge key: name")
