"""The nodes' kubelet policies for images already present (KEP-2535), read through the API server's node
proxy (`GET /api/v1/nodes/NAME/proxy/configz`, RBAC `get` on `nodes/proxy`), for `prewarm doctor` and
`prewarm describe job`. A node whose configuration cannot be read is reported with the reason, never
left out: RBAC (403), a kubelet the API server cannot reach, a node gone, an answer that is not a kubelet
configuration."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from prewarm.domain.verification import KubeletConfigError, KubeletImagePolicy
from prewarm_cli.output import listed

# Reads at once (one GET per node). The kubernetes client pools 5 connections per CPU: more readers than
# that would open and drop connections, each with a urllib3 warning.
READERS = 4
NODES_PROXY_FIX = ("grant `get` on `nodes/proxy` to whoever runs this (docs/credentials.md, \"Reading the "
                   "kubelets' policies\")")


class ConfigzApi(Protocol):
    """`prewarm.adapters.kube.KubeCluster` reads a node's kubelet configuration."""

    def get_node_configz(self, name: str) -> dict[str, Any]: ...


@dataclass
class NodePolicies:
    """Each node's policy, and why the others could not be read."""

    policies: dict[str, KubeletImagePolicy] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def forbidden(self) -> bool:
        """Whether some node could not be read for want of RBAC on nodes/proxy."""
        return any(why.startswith("forbidden") for why in self.unreadable.values())


def _why(error: Exception) -> str:
    from prewarm.services.ports import ClusterAuthError, ClusterError, ClusterNotFoundError, ClusterUnavailableError

    if isinstance(error, ClusterAuthError):
        return "forbidden: no get on nodes/proxy" if error.status == 403 else f"not authenticated: {error}"
    if isinstance(error, ClusterNotFoundError):
        return "node not found"
    if isinstance(error, ClusterUnavailableError):
        return f"kubelet not reached: {error}"
    if isinstance(error, KubeletConfigError | ClusterError):
        return f"no kubelet configuration: {error}"
    raise error


def read_policies(api: ConfigzApi, nodes: Iterable[str]) -> NodePolicies:
    """The policy of each of `nodes`, read READERS at a time."""
    from prewarm.services.ports import ClusterError

    def read(node: str) -> tuple[str, KubeletImagePolicy | str]:
        try:
            return node, KubeletImagePolicy.from_configz(api.get_node_configz(node))
        except (ClusterError, KubeletConfigError) as e:
            return node, _why(e)

    found = NodePolicies()
    names = sorted(set(nodes))
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(names)))) as pool:
        for node, result in pool.map(read, names):
            if isinstance(result, str):
                found.unreadable[node] = result
            else:
                found.policies[node] = result
    return found


def exposing_nodes(policies: Mapping[str, KubeletImagePolicy], images: Sequence[str | None]) -> dict[str, str]:
    """The nodes whose policy lets any pod use one of `images` once warmed (None: a rule's image, not
    known before its push), each with its policy's description."""
    return {node: policy.describe() for node, policy in policies.items()
            if any(policy.lets_any_pod_use(image) for image in images)}


def by_description(nodes: Mapping[str, str]) -> dict[str, list[str]]:
    """Nodes grouped by what is said of them (a policy, a reason), each group sorted."""
    groups: dict[str, list[str]] = {}
    for node, text in sorted(nodes.items()):
        groups.setdefault(text, []).append(node)
    return groups


_PULLED_WITH = {
    "shared": "shared credentials (the agents' registry copy or role, which every job may use)",
    "own": "the job's pull secrets",
    "none": "no credentials (no pull secrets, not a private ECR image)",
}


def describe_credentials(image: str, pull_secrets: Sequence[str], pull_secrets_only: bool, nodes: Sequence[str],
                         cluster: Callable[[], ConfigzApi]) -> list[str]:
    """`prewarm describe job`'s `Image Credentials:` lines: what the agents pull the image with, and whether
    the kubelets of the job's `nodes` (read through `cluster()`, opened only when needed) let any pod use
    it once warmed."""
    from prewarm.domain.verification import warm_credentials
    from prewarm.services.ports import ClusterError

    how = warm_credentials(image, pull_secrets, pull_secrets_only)
    lines = ["Image Credentials:", f"  Pulled With:       {_PULLED_WITH[how]}"
                                   + (" only (pullSecretsOnly)" if pull_secrets_only else "")]
    if how == "none":
        return lines
    if not nodes:
        return [*lines, "  Kubelet Policies:  no nodes yet"]
    try:
        found = read_policies(cluster(), nodes)
    except ClusterError as e:
        return [*lines, f"  Kubelet Policies:  not read: {e}"]
    groups = by_description({n: p.describe() for n, p in found.policies.items()})
    lines.append("  Kubelet Policies:  " + ("; ".join(f"{p} on {listed(g)}" for p, g in groups.items()) or "none read"))
    exposed = exposing_nodes(found.policies, [image])
    if exposed:
        without = "credentials of its own" if how == "shared" else "the job's pull secrets"
        shown = listed(sorted(exposed))
        lines.append(f"  Warning:           any pod on {len(exposed)} of {len(nodes)} nodes ({shown}) "
                     f"may use this image without {without}: set their kubelets' "
                     "imagePullCredentialsVerificationPolicy to AlwaysVerify (docs/credentials.md)")
    if found.unreadable:
        reasons = "; ".join(f"{listed(g)}: {why}" for why, g in by_description(found.unreadable).items())
        fix = f": {NODES_PROXY_FIX}" if found.forbidden else ""
        lines.append(f"  Not Read:          {len(found.unreadable)} nodes ({reasons}){fix}")
    return lines
