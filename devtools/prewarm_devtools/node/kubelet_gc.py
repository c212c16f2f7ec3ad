"""kubelet's image garbage collection, through the CRI as the kubelet runs it
(kubernetes pkg/kubelet/images/image_gc_manager.go, `freeSpace`): once the image filesystem passes its high
threshold, images are removed least recently used first until enough bytes are freed, skipping those a
container uses and, since kubelet 1.29, those the runtime reports `pinned`.

The kubelet learns which images are in use from CRI `ListContainers`; here the caller names them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from prewarm_agent.cri.client import CriImageClient, ImageInfo


@dataclass(frozen=True)
class Collected:
    """What one pass removed, and what it kept because the runtime reported it pinned."""

    removed: tuple[ImageInfo, ...]
    kept_pinned: tuple[ImageInfo, ...]

    @property
    def freed_bytes(self) -> int:
        return sum(image.size for image in self.removed)


def collect_images(cri: CriImageClient, bytes_to_free: int | None = None, in_use: Collection[str] = ()) -> Collected:
    """Remove unused, unpinned images (the order ListImages gives: this harness has no last-used times)
    until `bytes_to_free` are freed (None: as many as may go, the disk far past its threshold)."""
    removed: list[ImageInfo] = []
    kept: list[ImageInfo] = []
    freed = 0
    for image in cri.list_images():
        if bytes_to_free is not None and freed >= bytes_to_free:
            break
        if image.id in in_use:
            continue
        if image.pinned:
            kept.append(image)
            continue
        cri.remove_image(image.id)
        removed.append(image)
        freed += image.size
    return Collected(tuple(removed), tuple(kept))
