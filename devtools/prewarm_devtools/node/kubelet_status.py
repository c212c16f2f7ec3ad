"""The images a kubelet lists on its Node (`status.images`), for local nodes, as the kubelet lists them.

The kubelet's image manager reads the runtime's images (CRI `ListImages`) into a cache every 30 s, and its
node status loop (`nodeStatusUpdateFrequency`, 10 s) writes them to the Node through `PATCH
nodes/NAME/status` when they changed (kubernetes pkg/kubelet/nodestatus/setters.go, `Images`): each image's
repo digests then tags as `names` (5 at most), its size as `sizeBytes`, the largest images first, 50 at
most (`nodeStatusMaxImages`). The control plane reads a node's digests there (`prewarm.domain.boot
.digests_on_node`): a re-pull of an image the node holds does not take its warm condition off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prewarm_agent.cri.client import ImageInfo
from prewarm_devtools.node.process import Ticker

log = logging.getLogger(__name__)

# kubelet's defaults (KubeletConfiguration): the image cache's refresh, the status loop, its caps.
IMAGE_CACHE_SECONDS = 30.0
STATUS_UPDATE_SECONDS = 10.0
MAX_IMAGES = 50
MAX_NAMES_PER_IMAGE = 5


def node_images(images: Iterable[ImageInfo], most: int = MAX_IMAGES) -> list[dict[str, Any]]:
    """`status.images` as the kubelet writes it from the runtime's images.

    >>> node_images([ImageInfo("sha256:a", ("r/a:v1",), ("r/a@sha256:1",), 10),
    ...              ImageInfo("sha256:b", ("r/b:v1",), (), 20)])
    [{'names': ['r/b:v1'], 'sizeBytes': 20}, {'names': ['r/a@sha256:1', 'r/a:v1'], 'sizeBytes': 10}]
    """
    largest = sorted(images, key=lambda image: image.size, reverse=True)[:most]
    return [{"names": [*image.repo_digests, *image.repo_tags][:MAX_NAMES_PER_IMAGE], "sizeBytes": image.size}
            for image in largest]


class LocalKubelets:
    """One loop for every local node's kubelet: the image cache read from each node's containerd every
    `cache_seconds`, and each Node's `status.images` patched on the next status tick when it changed.

    `nodes()` gives (node name, its containerd, the embedded API server of its cluster) for each running
    node. A node whose containerd or API does not answer keeps its last status, as a kubelet retries."""

    def __init__(self, nodes: Callable[[], Iterable[tuple[str, Any, Any]]], *,
                 cache_seconds: float = IMAGE_CACHE_SECONDS, status_seconds: float = STATUS_UPDATE_SECONDS) -> None:
        self._nodes = nodes
        self._cache_seconds, self._status_seconds = cache_seconds, status_seconds
        # By node: its API server and its name (names repeat across local mode's clusters).
        self._cache: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self._ticks = 0
        self._ticker = Ticker("local-kubelets", self._tick, status_seconds)

    def start(self) -> LocalKubelets:
        self._tick()
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker.stop()

    def _tick(self) -> None:
        """The image cache every `cache_seconds` (from the first tick), the statuses every tick."""
        if self._ticks % max(1, round(self._cache_seconds / self._status_seconds)) == 0:
            self.refresh_cache()
        self._ticks += 1
        self.update_statuses()

    def refresh_cache(self) -> None:
        """The image manager's pass: each node's images from its containerd (a node gone is forgotten)."""
        nodes = list(self._nodes())
        for key in set(self._cache) - {(id(kube), name) for name, _, kube in nodes}:
            del self._cache[key]
        for name, containerd, kube in nodes:
            try:
                with containerd.cri_client(timeout=5.0) as cri:
                    self._cache[(id(kube), name)] = node_images(cri.list_images())
            except Exception as e:  # noqa: BLE001 - a kubelet logs it and tries again on its next pass
                log.debug("kubelet of %s: images not listed: %s", name, e)

    def update_statuses(self) -> None:
        """The status loop's pass: each Node whose listed images differ from the cache's is patched (a Node
        made again under its name, or rewritten by another, gets them back)."""
        for name, _, kube in list(self._nodes()):
            images = self._cache.get((id(kube), name))
            if images is None or kube is None or (node := kube.get_object("nodes", name)) is None:
                continue
            if (node.get("status") or {}).get("images") == images:
                continue
            try:
                self._patch(kube, name, images)
            except Exception as e:  # noqa: BLE001 - as above
                log.debug("kubelet of %s: status not written: %s", name, e)

    @staticmethod
    def _patch(kube: Any, name: str, images: list[dict[str, Any]]) -> None:
        from kubernetes.client import CoreV1Api

        with kube.api_client() as client:
            # A strategic merge patch replaces `images` whole: ContainerImage has no merge key. The answer is
            # not read into the client's models, which refuse a local node's `nodeInfo` (it has no osImage).
            CoreV1Api(client).patch_node_status(name, {"status": {"images": images}}, _request_timeout=5,
                                                _preload_content=False)
