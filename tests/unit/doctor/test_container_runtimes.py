"""The containerd a node runs, read from its kubelet's report, and the doctor's `container runtimes` line."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.runtimes import (
    PROGRESS_TIMEOUT_ADVICE,
    UNPIGZ_ADVICE,
    ContainerRuntime,
    KubeletVersion,
    KubeletVersionError,
    RuntimeVersionError,
)
from prewarm_cli.doctor.runtimes import check_container_runtimes


def node(name: str, runtime: str | None, kubelet: str | None = None) -> dict[str, Any]:
    info = {} if runtime is None else {"containerRuntimeVersion": runtime}
    if kubelet is not None:
        info["kubeletVersion"] = kubelet
    return {"metadata": {"name": name}, "status": {"nodeInfo": info}}


@pytest.mark.parametrize(("reported", "release", "pins", "transfer"), [
    ("containerd://2.1.9+unknown", (2, 1, 9), True, True),      # Debian sid's
    ("containerd://1.7.24~ds1", (1, 7, 24), True, False),       # Debian trixie's
    ("containerd://1.7.10", (1, 7, 10), True, False),           # the first that pins
    ("containerd://1.7.9", (1, 7, 9), False, False),
    ("containerd://1.6.20~ds1", (1, 6, 20), False, False),      # Debian bookworm's
    # The CRI pulls through the transfer service by default from 2.1.0 (containerd#8515), not in 2.0
    ("containerd://v2.0.0-rc.1", (2, 0, 0), True, False),
    ("containerd://2.0.7", (2, 0, 7), True, False),
    ("containerd://2.1", (2, 1, 0), True, True),
    ("cri-o://1.30.1", (1, 30, 1), False, False),               # another runtime: no containerd label
])
def test_a_reported_version_says_whether_pinning_works_and_how_pulls_go(
        reported: str, release: tuple[int, int, int], pins: bool, transfer: bool) -> None:
    runtime = ContainerRuntime.parse(reported)

    assert runtime.release == release and runtime.text == reported
    assert runtime.pins is pins
    assert runtime.pulls_through_transfer_service is transfer
    # ... and which node settings help its pulls: unpigz on every containerd, the progress timeout on 2.1+
    containerd = runtime.name == "containerd"
    expected = ((UNPIGZ_ADVICE,) if containerd else ()) + ((PROGRESS_TIMEOUT_ADVICE,) if transfer else ())
    assert runtime.pull_advice == expected


@pytest.mark.parametrize("reported", ["", "containerd", "containerd://", "://1.7.0", "containerd://latest"])
def test_a_version_that_is_not_runtime_and_version_is_refused_naming_it(reported: str) -> None:
    with pytest.raises(RuntimeVersionError, match=f"containerRuntimeVersion '{reported}' is not <runtime>://"):
        ContainerRuntime.parse(reported)


def test_nodes_that_all_pin_are_counted_by_version() -> None:
    result = check_container_runtimes([node("a", "containerd://2.1.9+unknown"), node("b", "containerd://2.1.9"),
                                       node("c", "containerd://1.7.24~ds1")])

    assert result.line() == ("ok    container runtimes: containerd 1.7.24 on 1 node; containerd 2.1.9 on 2 nodes "
                             f"(for pulls: {UNPIGZ_ADVICE}; {PROGRESS_TIMEOUT_ADVICE})")


def test_nodes_where_pinning_cannot_work_are_warned_of_by_name_and_version() -> None:
    result = check_container_runtimes([node("a", "containerd://2.1.9"), node("b", "containerd://1.6.20~ds1"),
                                       node("c", None), node("d", "docker://20.10")])

    assert result.ok and result.warning and not result.failed
    assert result.detail == (
        "containerd 1.6.20 on 1 node; containerd 2.1.9 on 1 node; docker 20.10.0 on 1 node; not reported on 1 node "
        f"(for pulls: {UNPIGZ_ADVICE}; {PROGRESS_TIMEOUT_ADVICE}); "
        "pinning cannot work on 3: b (containerd 1.6.20), c (not reported), d (docker 20.10.0)")
    assert result.line().startswith("warn  container runtimes: ")
    assert "run containerd 1.7.10 or later" in result.fix


def test_without_agent_nodes_the_check_is_skipped() -> None:
    assert check_container_runtimes([]).line() == "skip  container runtimes: no node for the agents"


@pytest.mark.parametrize(("reported", "honours"), [
    ("v1.34.1-eks-113cf36", True),
    ("v1.29.0", True),
    ("v1.29.0-alpha.1", True),
    ("v1.28.2-eks-a5df82a", True),   # the backports of kubernetes#119986
    ("v1.28.1", False),
    ("v1.27.6", True),
    ("v1.27.5+k3s1", False),
    ("v1.26.9", True),
    ("v1.26.8", False),
    ("v1.25.14", True),
    ("v1.25.13", False),
    ("v1.24.17", False),             # never backported
])
def test_a_kubelet_version_says_whether_its_image_gc_honours_pins(reported: str, honours: bool) -> None:
    assert KubeletVersion.parse(reported).honours_pins is honours


def test_a_kubelet_version_that_is_not_a_version_is_refused_naming_it() -> None:
    with pytest.raises(KubeletVersionError, match="kubeletVersion 'unknown' is not v<major>"):
        KubeletVersion.parse("unknown")


def test_nodes_whose_kubelet_ignores_pins_are_warned_of_with_the_kubelet_version() -> None:
    # Before: only containerRuntimeVersion was read, and a 1.27.3 kubelet's node passed as able to pin.
    result = check_container_runtimes([node("a", "containerd://2.1.9", "v1.33.5-eks-113cf36"),
                                       node("b", "containerd://1.7.27", "v1.27.3-eks-2f008fe"),
                                       node("c", "containerd://1.6.20", "v1.24.17"),
                                       node("d", "containerd://2.1.9", "unknown")])

    assert result.ok and result.warning
    assert result.detail.endswith("; pinning cannot work on 2: b (kubelet v1.27.3-eks-2f008fe), "
                                  "c (containerd 1.6.20, kubelet v1.24.17)")
    assert "kubelet 1.29 or later" in result.fix
