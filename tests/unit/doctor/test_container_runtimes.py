"""The containerd a node runs, read from its kubelet's report, and the doctor's `container runtimes` line."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.runtimes import PROGRESS_TIMEOUT_ADVICE, UNPIGZ_ADVICE, ContainerRuntime, RuntimeVersionError
from prewarm_cli.doctor.runtimes import check_container_runtimes


def node(name: str, runtime: str | None) -> dict[str, Any]:
    info = {} if runtime is None else {"containerRuntimeVersion": runtime}
    return {"metadata": {"name": name}, "status": {"nodeInfo": info}}


@pytest.mark.parametrize(("reported", "release", "pins", "transfer"), [
    ("containerd://2.1.9+unknown", (2, 1, 9), True, True),      # Debian sid's
    ("containerd://1.7.24~ds1", (1, 7, 24), True, False),       # Debian trixie's
    ("containerd://1.7.10", (1, 7, 10), True, False),           # the first that pins
    ("containerd://1.7.9", (1, 7, 9), False, False),
    ("containerd://1.6.20~ds1", (1, 6, 20), False, False),      # Debian bookworm's
    ("containerd://v2.0.0-rc.1", (2, 0, 0), True, True),
    ("containerd://2.1", (2, 1, 0), True, True),
    ("cri-o://1.30.1", (1, 30, 1), False, False),               # another runtime: no containerd label
])
def test_a_reported_version_says_whether_pinning_works_and_how_pulls_go(
        reported: str, release: tuple[int, int, int], pins: bool, transfer: bool) -> None:
    runtime = ContainerRuntime.parse(reported)

    assert runtime.release == release and runtime.text == reported
    assert runtime.pins is pins
    assert runtime.pulls_through_transfer_service is transfer
    # ... and which node settings help its pulls: unpigz on every containerd, the progress timeout on 2.x
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
