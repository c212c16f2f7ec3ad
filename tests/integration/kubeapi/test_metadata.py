"""Metadata-only reads (`Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`), as the
API server answers them: the metadata of each item and nothing else, paged with limit/continue, watches
whose events carry the metadata alone, and 406 NotAcceptable for a representation the server does not have."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from prewarm_devtools.kubeapi import KubeApiServer
from prewarm_devtools.kubeapi.synthetic import generate_nodes
from tests.support.kube import call

pytestmark = pytest.mark.integration

NODES = 1200
LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
ONE = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


@pytest.fixture(scope="module")
def api(kube_api_module: KubeApiServer) -> KubeApiServer:
    kube_api_module.seed_objects(generate_nodes(NODES, seed=5))
    return kube_api_module


@pytest.fixture
def client(api: KubeApiServer) -> Iterator[ApiClient]:
    with ApiClient(api.client_configuration()) as api_client:
        yield api_client


def get(client: ApiClient, path: str, accept: str, *, lines: bool = False, **query: Any) -> tuple[int, Any]:
    """GET as `accept` asks: the status and the JSON answer (`lines`: a watch's events, one a line)."""
    method, url, headers, body, post = client.param_serialize(
        method="GET", resource_path=path, query_params=list(query.items()), header_params={"Accept": accept},
        auth_settings=["BearerToken"])
    response = client.call_api(method, url, headers, body, post)
    data = response.read()  # type: ignore[no-untyped-call]
    if lines:
        return response.status, [json.loads(line) for line in data.splitlines() if line.strip()]
    return response.status, json.loads(data) if data else None


def test_a_metadata_list_pages_with_limit_and_continue_and_holds_metadata_only(
    api: KubeApiServer, client: ApiClient
) -> None:
    full = {n["metadata"]["name"]: n for n in api.list_objects("nodes")}
    # When the nodes are listed as metadata, 500 at a time
    status, first = get(client, "/api/v1/nodes", LIST, limit=500)
    assert status == 200
    # Then the list is a meta.k8s.io/v1 PartialObjectMetadataList, with the list's own metadata
    assert (first["kind"], first["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert first["metadata"]["remainingItemCount"] == NODES - 500 and first["metadata"]["resourceVersion"]
    items = list(first["items"])
    token = first["metadata"]["continue"]
    while token:
        status, page = get(client, "/api/v1/nodes", LIST, limit=500, **{"continue": token})
        assert status == 200 and page["kind"] == "PartialObjectMetadataList"
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        items += page["items"]
        token = page["metadata"].get("continue", "")
    # ... every node once, each a PartialObjectMetadata of exactly the node's metadata: no spec, no status
    assert sorted(i["metadata"]["name"] for i in items) == sorted(full)
    for item in items:
        assert set(item) == {"kind", "apiVersion", "metadata"}
        assert (item["kind"], item["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
        assert item["metadata"] == full[item["metadata"]["name"]]["metadata"]
    # ... and far smaller than the full list (each synthetic node carries its images and conditions)
    _, whole = get(client, "/api/v1/nodes", "application/json", limit=500)
    assert len(json.dumps(first)) * 3 < len(json.dumps(whole))


def test_one_object_as_metadata_and_selectors_apply(api: KubeApiServer, client: ApiClient) -> None:
    name = api.list_objects("nodes")[0]["metadata"]["name"]
    status, one = get(client, f"/api/v1/nodes/{name}", ONE)
    assert status == 200
    assert (one["kind"], one["apiVersion"], one["metadata"]["name"]) == ("PartialObjectMetadata", "meta.k8s.io/v1",
                                                                         name)
    assert set(one) == {"kind", "apiVersion", "metadata"}
    # v1beta1 is still served; field selectors select as for the full list
    status, listed = get(client, "/api/v1/nodes", LIST.replace("v=v1", "v=v1beta1"),
                         fieldSelector=f"metadata.name={name}")
    assert (status, listed["apiVersion"], [i["metadata"]["name"] for i in listed["items"]]) == (
        200, "meta.k8s.io/v1beta1", [name])
    # A missing node is still a 404 Status
    status, missing = get(client, "/api/v1/nodes/no-such-node", ONE)
    assert (status, missing["kind"], missing["reason"]) == (404, "Status", "NotFound")


@pytest.mark.parametrize("accept", [
    "application/json;as=Foo;g=meta.k8s.io;v=v1",
    "application/json;as=PartialObjectMetadataList;g=apps;v=v1",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v2",
])
def test_a_representation_the_server_does_not_have_is_406(client: ApiClient, accept: str) -> None:
    status, body = get(client, "/api/v1/nodes", accept, limit=1)
    assert (status, body["kind"], body["reason"], body["code"]) == (406, "Status", "NotAcceptable", 406)
    assert body["message"] == ("only the following media types are accepted: application/json, application/yaml, "
                               "application/vnd.kubernetes.protobuf")
    # ... unless the header offers one it has: the next range is served, as client-go's fallback expects
    status, body = get(client, "/api/v1/nodes", f"{accept},application/json", limit=1)
    assert (status, body["kind"]) == (200, "NodeList")


def test_the_wrong_shape_of_metadata_is_406(api: KubeApiServer, client: ApiClient) -> None:
    name = api.list_objects("nodes")[0]["metadata"]["name"]
    # A list asked for as one object, and one object asked for as a list: 406 without a fallback
    status, body = get(client, "/api/v1/nodes", f"{ONE},application/json", limit=1)
    assert (status, body["reason"]) == (406, "NotAcceptable")
    assert body["message"].startswith("you requested PartialObjectMetadata, but the requested object is a list")
    status, body = get(client, f"/api/v1/nodes/{name}", LIST)
    assert (status, body["reason"]) == (406, "NotAcceptable")
    assert "is not a list" in body["message"]
    # q decides before order
    status, body = get(client, f"/api/v1/nodes/{name}", f"application/json;q=0.5,{ONE}")
    assert (status, body["kind"]) == (200, "PartialObjectMetadata")


def test_a_metadata_watch_streams_the_metadata_of_each_event(api: KubeApiServer, client: ApiClient) -> None:
    # Given a node changed after a known resourceVersion
    name = api.list_objects("nodes")[1]["metadata"]["name"]
    rv = str(api.resource_version)
    patched = call(client, "PATCH", f"/api/v1/nodes/{name}", body={"metadata": {"labels": {"seen": "yes"}}},
                   content_type="application/merge-patch+json")
    assert patched.status == 200
    # When the nodes are watched from it as metadata (a metadata informer's watch)
    status, events = get(client, "/api/v1/nodes", ONE, watch="true", resourceVersion=rv, timeoutSeconds=1,
                         lines=True)
    # Then each event's object is a PartialObjectMetadata of the node's metadata
    assert status == 200 and [e["type"] for e in events] == ["MODIFIED"]
    change = events[0]["object"]
    assert set(change) == {"kind", "apiVersion", "metadata"}
    assert (change["kind"], change["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert change["metadata"] == api.get_object("nodes", name)["metadata"]
    assert change["metadata"]["labels"]["seen"] == "yes"
