"""limit/continue paging: consistent snapshots across pages, expiry (410) and garbage tokens (400)."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient, ApiException, CoreV1Api

from prewarm_devtools.kubeapi import KubeApiServer
from prewarm_devtools.kubeapi.synthetic import generate_nodes
from tests.support.kube import call, node, status_of

pytestmark = pytest.mark.integration

NODES = 2500


@pytest.fixture(scope="module")
def paged_api(kube_api_module: KubeApiServer) -> KubeApiServer:
    kube_api_module.seed_objects(generate_nodes(NODES, seed=3))
    return kube_api_module


@pytest.fixture
def client(paged_api: KubeApiServer) -> Iterator[ApiClient]:
    with ApiClient(paged_api.client_configuration()) as api_client:
        yield api_client


def page(client: ApiClient, limit: int, token: str = "", **params: str) -> dict[str, Any]:
    query = [("limit", limit), *params.items()]
    if token:
        query.append(("continue", token))
    answer = call(client, "GET", "/api/v1/nodes", query)
    assert answer.status == 200, answer.body
    body: dict[str, Any] = answer.body
    return body


def test_pages_of_500_return_every_node_exactly_once_from_one_snapshot(
    paged_api: KubeApiServer, client: ApiClient
) -> None:
    # Given 2,500 nodes, When listing them 500 at a time while nodes come and go between pages
    first = page(client, 500)
    names = [n["metadata"]["name"] for n in first["items"]]
    snapshot_rv = first["metadata"]["resourceVersion"]
    assert first["metadata"]["remainingItemCount"] == NODES - 500
    token = first["metadata"]["continue"]
    pages = 1
    while token:
        paged_api.seed_objects([node(f"zz-added-during-page-{pages}")])
        paged_api.seed_objects([node(f"aa-added-during-page-{pages}")])
        body = page(client, 500, token)
        assert body["kind"] == "NodeList" and body["apiVersion"] == "v1"
        assert body["metadata"]["resourceVersion"] == snapshot_rv
        names += [n["metadata"]["name"] for n in body["items"]]
        token = body["metadata"].get("continue", "")
        pages += 1
    # Then five pages hold each original node once, and nothing added after the first page
    assert pages == 5
    assert len(names) == NODES == len(set(names))
    assert names == sorted(names)
    assert not any("added-during" in name for name in names)
    for name in [n for n in (o["metadata"]["name"] for o in paged_api.list_objects("nodes")) if "added" in n]:
        paged_api.remove_object("nodes", name)


def test_typed_client_pages_with_the_continue_token(client: ApiClient) -> None:
    v1 = CoreV1Api(client)
    first = v1.list_node(limit=1000)
    second = v1.list_node(limit=1000, _continue=first.metadata.var_continue)
    third = v1.list_node(limit=1000, _continue=second.metadata.var_continue)
    assert [len(first.items), len(second.items), len(third.items)] == [1000, 1000, 500]
    assert third.metadata.var_continue is None
    assert second.metadata.remaining_item_count == 500


def test_selector_pages_carry_no_remaining_count(client: ApiClient) -> None:
    # Given a label selector, When paging, Then each page is full and remainingItemCount is absent (as etcd)
    body = page(client, 100, labelSelector="kubernetes.io/arch=arm64")
    assert len(body["items"]) == 100
    assert all(n["metadata"]["labels"]["kubernetes.io/arch"] == "arm64" for n in body["items"])
    assert "remainingItemCount" not in body["metadata"] and body["metadata"]["continue"]


def test_a_page_that_reaches_the_end_has_no_continue_token(client: ApiClient) -> None:
    body = page(client, NODES)
    assert len(body["items"]) == NODES
    assert "continue" not in body["metadata"]


def test_expired_continue_token_is_410_with_a_token_for_the_inconsistent_rest(
    paged_api: KubeApiServer, client: ApiClient
) -> None:
    # Given a first page, When its snapshot expires (as etcd compaction does)
    first = page(client, 500)
    paged_api.expire_continue_tokens()
    answer = call(client, "GET", "/api/v1/nodes", [("limit", 500), ("continue", first["metadata"]["continue"])])
    # Then the API answers 410 Expired with a continue token that resumes from the current state
    assert answer.status == 410
    assert answer.body["reason"] == "Expired"
    assert answer.body["message"].startswith("The provided continue parameter is too old")
    rest = page(client, 5000, answer.body["metadata"]["continue"])
    names = [n["metadata"]["name"] for n in first["items"] + rest["items"]]
    assert len(names) == len(set(names)) == NODES


def test_typed_client_raises_410_for_an_expired_token(paged_api: KubeApiServer, client: ApiClient) -> None:
    v1 = CoreV1Api(client)
    token = v1.list_node(limit=10).metadata.var_continue
    paged_api.expire_continue_tokens()
    with pytest.raises(ApiException) as raised:
        v1.list_node(limit=10, _continue=token)
    assert (raised.value.status, status_of(raised.value)["reason"]) == (410, "Expired")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("not base64 at all!", "invalid continue token: continue key is not valid"),
        (
            base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":0,"start":"x"}').decode(),
            "invalid continue token: continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)",
        ),
        (
            base64.urlsafe_b64encode(json.dumps({"v": "v9", "rv": 5, "start": "x"}).encode()).decode(),
            "invalid continue token: continue key is not valid: server does not recognize this encoded version",
        ),
    ],
)
def test_garbage_continue_token_is_a_bad_request(client: ApiClient, token: str, message: str) -> None:
    with pytest.raises(ApiException) as raised:
        CoreV1Api(client).list_node(limit=10, _continue=token)
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"]) == (400, "BadRequest")
    assert status["message"].startswith(message)


def test_continue_with_a_resource_version_is_a_bad_request(client: ApiClient) -> None:
    token = page(client, 10)["metadata"]["continue"]
    answer = call(client, "GET", "/api/v1/nodes", [("limit", 10), ("continue", token), ("resourceVersion", "5")])
    assert (answer.status, answer.body["message"]) == (
        400,
        "specifying resource version is not allowed when using continue",
    )


def test_resource_version_zero_is_accepted(client: ApiClient) -> None:
    body = page(client, 3, resourceVersion="0")
    assert len(body["items"]) == 3 and int(body["metadata"]["resourceVersion"]) > 0


def test_exact_resource_version_of_a_held_snapshot_is_served(client: ApiClient) -> None:
    first = page(client, 5)
    rv = first["metadata"]["resourceVersion"]
    again = page(client, 5, resourceVersion=rv, resourceVersionMatch="Exact")
    assert [n["metadata"]["name"] for n in again["items"]] == [n["metadata"]["name"] for n in first["items"]]


def test_exact_resource_version_too_old_is_410(paged_api: KubeApiServer, client: ApiClient) -> None:
    paged_api.expire_continue_tokens()
    paged_api.seed_objects([node("bump")])
    answer = call(client, "GET", "/api/v1/nodes", [("resourceVersion", "2"), ("resourceVersionMatch", "Exact")])
    paged_api.remove_object("nodes", "bump")
    assert (answer.status, answer.body["reason"]) == (410, "Expired")
