"""The disk guard's decision and its messages."""

from __future__ import annotations

import pytest

from prewarm_agent.cri.client import FsUsage
from prewarm_agent.cri.errors import CriUnavailableError
from prewarm_agent.disk import DiskGuard, FilesystemUsage, refusal

GIB = 1024**3


def usage(percent: float, usable: int = 100 * GIB) -> FilesystemUsage:
    return FilesystemUsage("/var/lib/containerd", int(usable * percent / 100), usable)


def test_above_the_threshold_is_refused_with_both_numbers() -> None:
    assert refusal([usage(91)], 85, None) == "disk guard: imagefs 91% used, threshold 85%"


def test_at_the_threshold_is_allowed() -> None:
    assert refusal([usage(85)], 85, None) is None


def test_an_image_that_would_cross_the_threshold_is_refused_with_the_room_left() -> None:
    message = refusal([usage(80)], 85, 6 * GIB)

    assert message == (
        f"disk guard: imagefs 80% used, threshold 85%; the image needs {6 * GIB} bytes, "
        f"{int(100 * GIB * 0.85) - int(100 * GIB * 0.8)} are free below the threshold"
    )


def test_an_image_that_fits_is_allowed() -> None:
    assert refusal([usage(80)], 85, 4 * GIB) is None


def test_every_image_filesystem_is_checked() -> None:
    assert refusal([usage(10), usage(99)], 85, None) == "disk guard: imagefs 99% used, threshold 85%"


class Runtime:
    def __init__(self, mountpoints: list[str] | Exception) -> None:
        self.mountpoints = mountpoints

    def image_fs_info(self) -> list[FsUsage]:
        if isinstance(self.mountpoints, Exception):
            raise self.mountpoints
        return [FsUsage(mountpoint=m, used_bytes=0, inodes_used=0, timestamp_ns=0) for m in self.mountpoints]


def test_the_guard_measures_the_runtimes_mountpoints() -> None:
    seen: list[str] = []

    def usage_of(mountpoint: str) -> FilesystemUsage:
        seen.append(mountpoint)
        return usage(95)

    guard = DiskGuard(Runtime(["/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"]), 90, usage_of)

    assert guard.check(None) == "disk guard: imagefs 95% used, threshold 90%"
    assert seen == ["/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"]


def test_a_mountpoint_not_mounted_in_the_pod_is_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def missing(mountpoint: str) -> FilesystemUsage:
        raise FileNotFoundError(2, "No such file or directory")

    guard = DiskGuard(Runtime(["/var/lib/containerd/x"]), 90, missing)

    assert guard.check(None) is None
    assert guard.check(None) is None
    warnings = [r for r in caplog.records if "cannot see imagefs /var/lib/containerd/x" in r.getMessage()]
    assert len(warnings) == 1
    assert "mount it from the host at the same path" in warnings[0].getMessage()


def test_a_runtime_that_does_not_answer_does_not_block_the_pull() -> None:
    guard = DiskGuard(Runtime(CriUnavailableError("socket down")), 90, lambda m: usage(99))

    assert guard.check(None) is None
