"""Local nodes' kubelets list each node's images on its Node (`status.images`), as a kubelet does: repo
digests then tags, the largest image first, through `PATCH nodes/NAME/status` only when they changed, and
without touching what others wrote on the Node (its taints, the control plane's condition)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from prewarm_agent.cri.client import ImageInfo
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.localnodes import node_object
from prewarm_devtools.node.kubelet_status import MAX_IMAGES, LocalKubelets, node_images

pytestmark = pytest.mark.integration

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


class FakeContainerd:
    """A containerd whose CRI lists `images`, counting the lists."""

    def __init__(self, images: list[ImageInfo]) -> None:
        self.images = images
        self.lists = 0

    @contextmanager
    def cri_client(self, timeout: float = 10.0) -> Any:
        outer = self

        class Client:
            def list_images(self) -> list[ImageInfo]:
                outer.lists += 1
                return list(outer.images)

        yield Client()


def image(name: str, size: int, digest: str = "") -> ImageInfo:
    return ImageInfo(f"sha256:{name}", (f"r/{name}:v1",), (f"r/{name}@sha256:{digest}",) if digest else (), size)


def test_the_node_lists_its_images_as_a_kubelet_does_and_keeps_its_taints(kube_api: KubeApiServer) -> None:
    # Given a tainted Node whose containerd holds two images
    kube_api.seed_objects([node_object("n-1", {"pool": "a"}, [TAINT])])
    containerd = FakeContainerd([image("small", 10, "1"), image("big", 20)])
    kubelets = LocalKubelets(lambda: [("n-1", containerd, kube_api)])
    # When its kubelet's image cache and status loop pass
    kubelets.refresh_cache()
    kubelets.update_statuses()
    # Then the Node lists them, the largest first, digests before tags; its taint is still there
    node = kube_api.get_object("nodes", "n-1")
    assert node is not None
    assert node["status"]["images"] == [{"names": ["r/big:v1"], "sizeBytes": 20},
                                        {"names": ["r/small@sha256:1", "r/small:v1"], "sizeBytes": 10}]
    assert node["spec"]["taints"] == [TAINT]
    # and an unchanged list is not written again; a pulled image is, on the next passes
    version = node["metadata"]["resourceVersion"]
    kubelets.refresh_cache()
    kubelets.update_statuses()
    assert kube_api.get_object("nodes", "n-1")["metadata"]["resourceVersion"] == version
    containerd.images.append(image("new", 5, "2"))
    kubelets.refresh_cache()
    kubelets.update_statuses()
    listed = kube_api.get_object("nodes", "n-1")["status"]["images"]
    assert [i["names"][0] for i in listed] == ["r/big:v1", "r/small@sha256:1", "r/new@sha256:2"]


def test_a_node_gone_from_the_api_is_skipped_and_the_others_still_written(kube_api: KubeApiServer) -> None:
    kube_api.seed_objects([node_object("n-2", {}, [])])
    nodes = [("gone", FakeContainerd([image("a", 1)]), kube_api), ("n-2", FakeContainerd([image("b", 2)]), kube_api)]
    kubelets = LocalKubelets(lambda: nodes)
    kubelets.refresh_cache()
    kubelets.update_statuses()
    assert kube_api.get_object("nodes", "n-2")["status"]["images"] == [{"names": ["r/b:v1"], "sizeBytes": 2}]


def test_at_most_fifty_images_and_five_names_each() -> None:
    many = [ImageInfo(f"sha256:{i}", tuple(f"r/{i}:t{j}" for j in range(7)), (), i) for i in range(60)]
    listed = node_images(many)
    assert len(listed) == MAX_IMAGES and listed[0]["sizeBytes"] == 59
    assert all(len(i["names"]) == 5 for i in listed)


def test_nodes_of_the_same_name_in_two_clusters_each_list_their_own_images(kube_api: KubeApiServer) -> None:
    # Local mode's clusters repeat node names; a node added again under its name is a new node
    with KubeApiServer() as other:
        for api in (kube_api, other):
            api.seed_objects([node_object("n-1", {}, [])])
        here, there = FakeContainerd([image("a", 1)]), FakeContainerd([image("b", 2)])
        nodes = [("n-1", here, kube_api), ("n-1", there, other)]
        kubelets = LocalKubelets(lambda: nodes)
        kubelets.refresh_cache()
        kubelets.update_statuses()
        assert [i["names"] for i in kube_api.get_object("nodes", "n-1")["status"]["images"]] == [["r/a:v1"]]
        assert [i["names"] for i in other.get_object("nodes", "n-1")["status"]["images"]] == [["r/b:v1"]]
        # n-1 of the first cluster removed and added again, with the same images: its new Node gets them
        kube_api.remove_object("nodes", "n-1")
        kube_api.seed_objects([node_object("n-1", {}, [])])
        nodes[0] = ("n-1", FakeContainerd([image("a", 1)]), kube_api)
        kubelets.refresh_cache()
        kubelets.update_statuses()
        assert [i["names"] for i in kube_api.get_object("nodes", "n-1")["status"]["images"]] == [["r/a:v1"]]
