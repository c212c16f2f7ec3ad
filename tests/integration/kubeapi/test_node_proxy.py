"""The node proxy's `/configz`: each node's kubelet configuration as a real API server forwards it, with
RBAC's `get` on `nodes/proxy` enforced, and read through `KubeCluster.get_node_configz`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm.domain.verification import KubeletImagePolicy, VerificationPolicy
from prewarm.services.ports import ClusterAuthError, ClusterNotFoundError, ClusterUnavailableError
from prewarm_devtools.kubeapi import Identity, KubeApiServer
from tests.support.kube import binding, call, node, role, rule, subject

pytestmark = pytest.mark.integration


def versioned(name: str, kubelet: str) -> dict[str, Any]:
    doc = node(name)
    doc.setdefault("status", {})["nodeInfo"] = {"kubeletVersion": kubelet}
    return doc


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.seed_objects([versioned("old", "v1.33.5-eks-113cf36"), versioned("new", "v1.35.0-eks-1"), node("n3")])
        server.add_identity("alice", Identity("alice"))
        yield server


def cluster(api: KubeApiServer, token: str | None = None) -> KubeCluster:
    return KubeCluster(api.url, token_source=lambda: token or api.token)


def test_configz_follows_the_kubelet_version_until_a_policy_is_set(api: KubeApiServer) -> None:
    with cluster(api) as admin:
        # Before 1.35 the gate is off and the field absent; from 1.35 the kubelet's default
        assert "imagePullCredentialsVerificationPolicy" not in admin.get_node_configz("old")["kubeletconfig"]
        new = admin.get_node_configz("new")
        assert new["kubeletconfig"]["imagePullCredentialsVerificationPolicy"] == "NeverVerifyPreloadedImages"
        assert KubeletImagePolicy.from_configz(new).policy is VerificationPolicy.NEVER_VERIFY_PRELOADED

        api.set_image_credentials_policy("old", "NeverVerifyAllowlistedImages", ["registry.example.com/base/*"])
        config = admin.get_node_configz("old")["kubeletconfig"]
        assert config["imagePullCredentialsVerificationPolicy"] == "NeverVerifyAllowlistedImages"
        assert config["preloadedImagesVerificationAllowlist"] == ["registry.example.com/base/*"]
        assert config["featureGates"]["KubeletEnsureSecretPulledImages"] is True


def test_configz_needs_get_on_nodes_proxy_as_on_a_real_api_server(api: KubeApiServer) -> None:
    with cluster(api, "alice") as alice:
        with pytest.raises(ClusterAuthError) as refused:
            alice.get_node_configz("new")
        assert 'nodes "new" is forbidden' in str(refused.value)
        assert 'cannot get resource "nodes/proxy"' in str(refused.value)
        # `get` on nodes (without the subresource) does not reach the kubelet
        with api.api_client() as client:
            for obj in (role("node-reader", [rule(["nodes"], ["get"])]),
                        binding("alice-nodes", "node-reader", [subject("User", "alice")])):
                plural = obj["kind"].lower() + "s"
                assert call(client, "POST", f"/apis/rbac.authorization.k8s.io/v1/{plural}", body=obj).status == 201
        with pytest.raises(ClusterAuthError):
            alice.get_node_configz("new")
        with api.api_client() as client:
            for obj in (role("node-proxy", [rule(["nodes/proxy"], ["get"])]),
                        binding("alice-proxy", "node-proxy", [subject("User", "alice")])):
                plural = obj["kind"].lower() + "s"
                assert call(client, "POST", f"/apis/rbac.authorization.k8s.io/v1/{plural}", body=obj).status == 201
        assert "kubeletconfig" in alice.get_node_configz("new")


def test_a_missing_node_an_unreachable_kubelet_and_other_paths(api: KubeApiServer) -> None:
    with cluster(api) as admin:
        with pytest.raises(ClusterNotFoundError, match='nodes "gone" not found'):
            admin.get_node_configz("gone")
        api.kubelets.set_reachable("n3", False)
        with pytest.raises(ClusterUnavailableError, match="error trying to reach service"):
            admin.get_node_configz("n3")
    with api.api_client() as client:
        answer = call(client, "GET", "/api/v1/nodes/new/proxy/pods")
        assert answer.status == 404 and "404 page not found" in answer.body


def test_an_unknown_policy_or_a_stray_allowlist_is_refused(api: KubeApiServer) -> None:
    with pytest.raises(ValueError, match="unknown imagePullCredentialsVerificationPolicy 'Sometimes'"):
        api.set_image_credentials_policy("new", "Sometimes")
    with pytest.raises(ValueError, match="only to NeverVerifyAllowlistedImages"):
        api.set_image_credentials_policy("new", "AlwaysVerify", ["x/*"])
