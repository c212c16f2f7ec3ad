"""`prewarm local node kubelet NAME --policy ...`: the control channel sets the policy local mode's kubelet
stand-in reports at the node proxy's /configz, and refuses what it cannot set."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from prewarm_devtools.control import ControlError
from prewarm_devtools.kubeapi import KubeApiServer
from prewarm_devtools.localmode import LocalMode


@pytest.fixture
def mode() -> Iterator[LocalMode]:
    local = LocalMode(agents=False, control=False)
    local.kube = KubeApiServer()
    local.kube.seed_objects([{"kind": "Node", "metadata": {"name": "n1"}}])
    try:
        yield local
    finally:
        shutil.rmtree(local.base_dir, ignore_errors=True)


def configz(mode: LocalMode) -> dict[str, object]:
    node = mode.kube.get_object("nodes", "n1")
    return mode.kube.kubelets.configz(node, "v1.35.0")["kubeletconfig"]  # type: ignore[no-any-return]


def test_the_policy_is_set_per_node(mode: LocalMode) -> None:
    answer = mode._control_route("POST", ["nodes", "n1", "kubelet"],
                                 {"policy": "NeverVerifyAllowlistedImages", "allowlist": ["r.example.com/base/*"]})
    assert answer == {"node": "n1", "policy": "NeverVerifyAllowlistedImages", "allowlist": ["r.example.com/base/*"]}
    assert configz(mode)["imagePullCredentialsVerificationPolicy"] == "NeverVerifyAllowlistedImages"
    mode._control_route("POST", ["nodes", "n1", "kubelet"], {"policy": None})
    assert "imagePullCredentialsVerificationPolicy" not in configz(mode)


def test_a_missing_node_or_an_unknown_policy_is_refused(mode: LocalMode) -> None:
    with pytest.raises(ControlError, match='node "n2" not found'):
        mode._control_route("POST", ["nodes", "n2", "kubelet"], {"policy": "AlwaysVerify"})
    with pytest.raises(ControlError, match="unknown imagePullCredentialsVerificationPolicy 'Often'"):
        mode._control_route("POST", ["nodes", "n1", "kubelet"], {"policy": "Often"})
