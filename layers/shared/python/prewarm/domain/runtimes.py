"""A node's container runtime, as its kubelet reports it (`status.nodeInfo.containerRuntimeVersion`,
`containerd://2.1.9`), and what that version can do for Prewarm.

Pinning (`io.cri-containerd.pinned`, which keeps an image from kubelet's image garbage collection) needs
containerd 1.7.10 or later (containerd#9381): an older one stores the label but its CRI never reports the
image pinned, so the kubelet may remove it. It also needs a kubelet that reads the CRI's `pinned` field
(`KubeletVersion.honours_pins`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTAINERD = "containerd"
PINNING_SINCE = (1, 7, 10)
# The kubelet's image GC skips what the CRI reports pinned only since kubernetes#119986 (1.29; before it the
# kubelet dropped the field and saw every image unpinned), backported to these patch releases (#120053-6).
KUBELET_PINNING_SINCE = (1, 29, 0)
KUBELET_PINNING_BACKPORTS = {(1, 25): 14, (1, 26): 9, (1, 27): 6, (1, 28): 2}
# The CRI pulls through the transfer service by default from containerd 2.1.0 (containerd#8515, merged
# after 2.0; docs/cri/config.md at v2.1.0, "Transfer Service for Image Pull"); 2.0 pulls as 1.7 does.
TRANSFER_PULL_SINCE = (2, 1, 0)
# What moved a CRI pull of a 2 GiB image on 2 cores (benchmarks/pull_limit.py, docs/performance.md
# section 14): gunzip in Go was the bottleneck on every version, unpigz took a third of the time off
# it and more; max_concurrent_downloads, the snapshotter and the transfer service's options did not help.
UNPIGZ_ADVICE = "pigz on the nodes: containerd gunzips layers with unpigz when it is on its PATH"
# containerd#13909 (a long unpack cancelled through the transfer service) and #14158 ("0s" hangs it).
PROGRESS_TIMEOUT_ADVICE = ("image_pull_progress_timeout above 5m for multi-GB layers, never 0s "
                           "(containerd#13909, #14158)")
# `containerd://1.7.27`, `containerd://2.1.9+unknown`, `containerd://1.6.20~ds1`, `containerd://v2.0.0-rc.1`.
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


class RuntimeVersionError(ValueError):
    """A containerRuntimeVersion that is not `<runtime>://<version>`."""


class KubeletVersionError(ValueError):
    """A kubeletVersion that is not `v<major>.<minor>.<patch>`."""


@dataclass(frozen=True)
class ContainerRuntime:
    """A runtime's name and numeric version (`release` is (major, minor, patch)); `text` as reported."""

    name: str
    release: tuple[int, int, int]
    text: str

    @classmethod
    def parse(cls, reported: str) -> ContainerRuntime:
        """`containerd://2.1.9` as the kubelet reports it.

        >>> ContainerRuntime.parse("containerd://1.7.27").release
        (1, 7, 27)
        """
        name, sep, version = reported.partition("://")
        found = _VERSION.match(version)
        if not sep or not name or found is None:
            raise RuntimeVersionError(
                f"containerRuntimeVersion {reported!r} is not <runtime>://<version> (e.g. containerd://2.1.9)")
        major, minor, patch = (int(part or 0) for part in found.groups())
        return cls(name, (major, minor, patch), reported)

    @property
    def version(self) -> str:
        """`2.1.9`."""
        return ".".join(str(part) for part in self.release)

    @property
    def pins(self) -> bool:
        """Whether a pinned image stays out of kubelet's image garbage collection on this runtime."""
        return self.name == CONTAINERD and self.release >= PINNING_SINCE

    @property
    def pull_advice(self) -> tuple[str, ...]:
        """Node settings that make pulls faster or safer on this runtime (docs/agent.md, "containerd versions")."""
        if self.name != CONTAINERD:
            return ()
        if self.pulls_through_transfer_service:
            return (UNPIGZ_ADVICE, PROGRESS_TIMEOUT_ADVICE)
        return (UNPIGZ_ADVICE,)

    @property
    def pulls_through_transfer_service(self) -> bool:
        """Whether the CRI pulls through the transfer service by default (`use_local_image_pull = false`)."""
        return self.name == CONTAINERD and self.release >= TRANSFER_PULL_SINCE


@dataclass(frozen=True)
class KubeletVersion:
    """A kubelet's version as its Node reports it (`status.nodeInfo.kubeletVersion`, `v1.34.1-eks-113cf36`)."""

    release: tuple[int, int, int]
    text: str

    @classmethod
    def parse(cls, reported: str) -> KubeletVersion:
        """`v1.34.1-eks-113cf36` as the Node reports it.

        >>> KubeletVersion.parse("v1.28.2-eks-a5df82a").release
        (1, 28, 2)
        """
        found = _VERSION.match(reported)
        if found is None:
            raise KubeletVersionError(f"kubeletVersion {reported!r} is not v<major>.<minor>.<patch> (e.g. v1.34.1)")
        major, minor, patch = (int(part or 0) for part in found.groups())
        return cls((major, minor, patch), reported)

    @property
    def honours_pins(self) -> bool:
        """Whether the kubelet's image garbage collection skips the images its CRI reports pinned."""
        if self.release >= KUBELET_PINNING_SINCE:
            return True
        since = KUBELET_PINNING_BACKPORTS.get(self.release[:2])
        return since is not None and self.release[2] >= since
