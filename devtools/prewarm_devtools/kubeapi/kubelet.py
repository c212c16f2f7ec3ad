"""The kubelets behind the API server's node proxy, as far as `/configz` goes.

`GET /api/v1/nodes/NAME/proxy/configz` is how a client reads a node's kubelet configuration on a real
cluster: the API server authorizes it as `get` on `nodes/proxy` (RBAC, checked before this is reached)
and forwards it to the node's kubelet, which answers `{"kubeletconfig": {...}}` (its
KubeletConfiguration, v1beta1 field names, no kind). A node that does not exist is the API server's 404;
a kubelet it cannot reach is its 503 `error trying to reach service: ...`; a path the kubelet does not
serve is the kubelet's own `404 page not found` (text/plain), passed through.

The configuration served follows the node's kubelet version (`status.nodeInfo.kubeletVersion`, else the
API server's): KEP-2535's feature gate `KubeletEnsureSecretPulledImages` is on by default from 1.35,
where the kubelet defaults `imagePullCredentialsVerificationPolicy` to `NeverVerifyPreloadedImages`;
before, the gate is off and the field is absent (kubernetes `pkg/kubelet/apis/config/v1beta1/defaults.go`).
`set_image_credentials_policy` sets a node's policy (and allowlist) as an admin's kubelet config would,
`set_reachable` makes its kubelet unreachable.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prewarm_devtools.kubeapi.errors import StatusError

POLICIES = ("NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify")
# KEP-2535's gate is beta and on by default from this minor version.
ENFORCED_FROM = (1, 35)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class _Setting:
    policy: str | None
    allowlist: tuple[str, ...] = ()


def _enforced(version: str) -> bool:
    match = _VERSION.match(version)
    return match is not None and (int(match.group(1)), int(match.group(2))) >= ENFORCED_FROM


def _base_config() -> dict[str, Any]:
    """The fields an EKS AMI's kubelet reports that matter to nobody here, so answers look like real ones."""
    return {
        "enableServer": True,
        "syncFrequency": "1m0s",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True, "cacheTTL": "2m0s"},
                           "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "5m0s",
                                                         "cacheUnauthorizedTTL": "30s"}},
        "registryPullQPS": 5,
        "registryBurst": 10,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
        "clusterDomain": "cluster.local",
        "maxPods": 110,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "featureGates": {"RotateKubeletServerCertificate": True},
    }


class Kubelets:
    """Each node's kubelet as the node proxy reaches it (thread-safe: settings change while serving)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings: dict[str, _Setting] = {}
        self._unreachable: set[str] = set()

    def set_image_credentials_policy(self, node: str, policy: str | None, allowlist: Sequence[str] = ()) -> None:
        """Node `node`'s kubelet runs with `imagePullCredentialsVerificationPolicy: policy` (None: the
        feature gate off, no field) and `preloadedImagesVerificationAllowlist: allowlist`."""
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"unknown imagePullCredentialsVerificationPolicy {policy!r}: one of {', '.join(POLICIES)}")
        if allowlist and policy != "NeverVerifyAllowlistedImages":
            raise ValueError("an allowlist applies only to NeverVerifyAllowlistedImages")
        with self._lock:
            self._settings[node] = _Setting(policy, tuple(allowlist))

    def set_reachable(self, node: str, reachable: bool) -> None:
        """Whether the API server reaches `node`'s kubelet (a stopped kubelet, a blocked port 10250)."""
        with self._lock:
            (self._unreachable.discard if reachable else self._unreachable.add)(node)

    def configz(self, node: Mapping[str, Any], server_version: str) -> dict[str, Any]:
        """The `/configz` answer of `node`'s kubelet."""
        name = node["metadata"]["name"]
        with self._lock:
            setting = self._settings.get(name)
        if setting is None:
            version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or server_version
            setting = _Setting("NeverVerifyPreloadedImages" if _enforced(version) else None)
        config = _base_config()
        if setting.policy is not None:
            config["featureGates"]["KubeletEnsureSecretPulledImages"] = True
            config["imagePullCredentialsVerificationPolicy"] = setting.policy
            if setting.allowlist:
                config["preloadedImagesVerificationAllowlist"] = list(setting.allowlist)
        return {"kubeletconfig": config}

    def proxy(self, method: str, node: Mapping[str, Any], rest: Sequence[str], server_version: str
              ) -> tuple[int, bytes, str]:
        """(status, body, content type) of a proxied request to `node`'s kubelet at `/<rest>`."""
        name = node["metadata"]["name"]
        with self._lock:
            unreachable = name in self._unreachable
        if unreachable:
            # The API server's proxy error responder: 503 with the dial error.
            raise StatusError(503, "ServiceUnavailable",
                              f"error trying to reach service: dial tcp {_address(node)}:10250: connect: "
                              "connection refused")
        if list(rest) != ["configz"]:
            return 404, b"404 page not found\n", "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, b"405 method not allowed\n", "text/plain; charset=utf-8"
        return 200, json.dumps(self.configz(node, server_version)).encode(), "application/json"


def _address(node: Mapping[str, Any]) -> str:
    for address in (node.get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return "127.0.0.1"
