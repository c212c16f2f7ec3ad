"""`KubeCluster.list_node_metadata` and `get_node_metadata` against the embedded API over real HTTP: the
metadata of every node, page by page, never the nodes' spec and status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm.services.ports import ClusterError
from prewarm_devtools.kubeapi import KubeApiServer
from prewarm_devtools.kubeapi.synthetic import generate_nodes

pytestmark = pytest.mark.integration

NODES = 1100


@pytest.fixture(scope="module")
def api(kube_api_module: KubeApiServer) -> KubeApiServer:
    kube_api_module.seed_objects(generate_nodes(NODES, seed=9))
    return kube_api_module


@pytest.fixture
def cluster(api: KubeApiServer) -> Iterator[KubeCluster]:
    with KubeCluster(api.url, lambda: api.token, page_size=500) as kube:
        yield kube


def test_every_node_s_metadata_in_pages_without_spec_or_status(api: KubeApiServer, cluster: KubeCluster) -> None:
    accepts: list[str] = []
    original = cluster._client.call_api

    def recording(method: str, url: str, header_params: dict[str, str], **kwargs: Any) -> Any:
        accepts.append(header_params["Accept"])
        return original(method, url, header_params=header_params, **kwargs)

    cluster._client.call_api = recording
    listed = cluster.list_node_metadata()
    # Three pages of 500, each asked for as metadata
    assert accepts == ["application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"] * 3
    full = {n["metadata"]["name"]: n for n in api.list_objects("nodes")}
    assert sorted(i["metadata"]["name"] for i in listed) == sorted(full)
    assert all("spec" not in i and "status" not in i for i in listed)
    some = listed[7]["metadata"]
    assert some == full[some["name"]]["metadata"] and some["creationTimestamp"] and some["uid"]


def test_one_node_s_metadata_or_none(api: KubeApiServer, cluster: KubeCluster) -> None:
    name = api.list_objects("nodes")[3]["metadata"]["name"]
    one = cluster.get_node_metadata(name)
    assert one is not None and one["kind"] == "PartialObjectMetadata" and one["metadata"]["name"] == name
    assert "status" not in one
    assert cluster.get_node_metadata("no-such-node") is None


def test_a_server_that_refuses_metadata_says_so(cluster: KubeCluster) -> None:
    # 406 from a server without the representation: an error naming the status, not an empty list
    with pytest.raises(ClusterError, match="406 NotAcceptable"):
        cluster._request("GET", "/api/v1/nodes", accept="application/json;as=Nothing;g=meta.k8s.io;v=v1")
