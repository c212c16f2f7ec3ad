"""The disk guard: no pull starts on a node whose image filesystem is too full for it.

containerd says where images live (`ImageFsInfo` mountpoints) and how much they use, but not how big
the disk is, so the filesystem itself is asked (`statvfs`, as `df`). In a pod the mountpoint must be
mounted from the host at the same path (the DaemonSet mounts `/var/lib/containerd` read-only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from prewarm_agent.cri.client import FsUsage
from prewarm_agent.cri.errors import CriError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilesystemUsage:
    """A filesystem's bytes in use and bytes usable by unprivileged writers (used + available)."""

    mountpoint: str
    used_bytes: int
    usable_bytes: int

    @property
    def percent(self) -> float:
        return 100.0 * self.used_bytes / self.usable_bytes if self.usable_bytes else 0.0


def refusal(usages: Iterable[FilesystemUsage], threshold_percent: float, size_bytes: int | None) -> str | None:
    """Why a pull of `size_bytes` (None: unknown) must not start, or None when it may."""
    for usage in usages:
        if usage.percent > threshold_percent:
            return f"disk guard: imagefs {usage.percent:.0f}% used, threshold {threshold_percent:g}%"
        if size_bytes and usage.usable_bytes:
            room = int(usage.usable_bytes * threshold_percent / 100) - usage.used_bytes
            if size_bytes > room:
                return (
                    f"disk guard: imagefs {usage.percent:.0f}% used, threshold {threshold_percent:g}%; "
                    f"the image needs {size_bytes} bytes, {max(room, 0)} are free below the threshold"
                )
    return None


def statvfs_usage(mountpoint: str) -> FilesystemUsage:
    """The usage of the filesystem holding `mountpoint`; raises OSError when it is not mounted here."""
    st = os.statvfs(mountpoint)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return FilesystemUsage(mountpoint, used, used + st.f_bavail * st.f_frsize)


class ImageFilesystems(Protocol):
    def image_fs_info(self) -> list[FsUsage]: ...


class DiskGuard:
    """Checks the runtime's image filesystems against `threshold_percent` before each new pull."""

    def __init__(
        self,
        runtime: ImageFilesystems,
        threshold_percent: float,
        usage_of: Callable[[str], FilesystemUsage] = statvfs_usage,
    ) -> None:
        self.runtime = runtime
        self.threshold_percent = threshold_percent
        self._usage_of = usage_of
        self._unreadable: set[str] = set()

    def check(self, size_bytes: int | None) -> str | None:
        """The refusal message, or None. A filesystem that cannot be read is skipped (logged once)."""
        try:
            filesystems = self.runtime.image_fs_info()
        except CriError as e:
            log.warning("disk guard skipped: the runtime did not report its image filesystems: %s", e)
            return None
        usages = []
        for fs in filesystems:
            try:
                usages.append(self._usage_of(fs.mountpoint))
            except OSError as e:
                if fs.mountpoint not in self._unreadable:
                    self._unreadable.add(fs.mountpoint)
                    log.warning(
                        "disk guard cannot see imagefs %s (%s): mount it from the host at the same path",
                        fs.mountpoint, e.strerror or e,
                    )
        return refusal(usages, self.threshold_percent, size_bytes)
