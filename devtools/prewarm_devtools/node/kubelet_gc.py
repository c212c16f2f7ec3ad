"""kubelet's image garbage collection, through the CRI as the kubelet runs it
(kubernetes pkg/kubelet/images/image_gc_manager.go, `freeSpace`): once the image filesystem passes its high
threshold, images are removed least recently used first until enough bytes are freed, skipping those a
container uses and, since kubelet 1.29, those the runtime reports `pinned`.

The kubelet learns which images are in use from CRI `ListContainers` (every container it lists, in any
state); so does this.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from prewarm_agent.cri.client import CriImageClient, ImageInfo


@dataclass(frozen=True)
class Collected:
    """What one pass removed, and what it kept because a container uses it or the runtime reported it pinned."""

    removed: tuple[ImageInfo, ...]
    kept_pinned: tuple[ImageInfo, ...]
    kept_in_use: tuple[ImageInfo, ...] = ()

    @property
    def freed_bytes(self) -> int:
        return sum(image.size for image in self.removed)


def collect_images(cri: CriImageClient, bytes_to_free: int | None = None,
                   candidates: Collection[str] | None = None) -> Collected:
    """Remove unused, unpinned images (the order ListImages gives: this harness has no last-used times)
    until `bytes_to_free` are freed (None: as many as may go, the disk far past its threshold).
    `candidates`: the image ids the pass may take (None: every image), so a test leaves others' alone."""
    in_use = cri.images_in_use()
    removed: list[ImageInfo] = []
    kept: list[ImageInfo] = []
    used: list[ImageInfo] = []
    freed = 0
    for image in cri.list_images():
        if bytes_to_free is not None and freed >= bytes_to_free:
            break
        if candidates is not None and image.id not in candidates:
            continue
        if in_use & {image.id, *image.repo_tags, *image.repo_digests}:
            used.append(image)
            continue
        if image.pinned:
            kept.append(image)
            continue
        cri.remove_image(image.id)
        removed.append(image)
        freed += image.size
    return Collected(tuple(removed), tuple(kept), tuple(used))
