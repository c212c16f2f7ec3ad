"""The nodes' kubelet policies for images already present (KEP-2535), read through the API server's node
proxy (`GET /api/v1/nodes/NAME/proxy/configz`, RBAC `get` on `nodes/proxy`), for `prewarm doctor` and
`prewarm describe job`. A node whose configuration cannot be read is reported with the reason, never
left out: RBAC (403), a kubelet the API server cannot reach, a node gone, an answer that is not a kubelet
configuration.

`prewarm doctor` reads one node per pool (`read_pool_policies`): the nodes of one managed node group or
Karpenter NodePool, else of one instance type, at one kubelet version, share a kubelet configuration, so
a fleet of 5,000 nodes in a few pools costs a few GETs, not 5,000."""

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
# What makes nodes one pool: their managed node group's or Karpenter NodePool's label (EKS Auto Mode's
# too), else their instance type; and their kubelet version, since a pool being upgraded runs two.
POOL_LABELS = ("eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The nodes of a pool tried, one after another, when one cannot be read for a reason of its own (its
# kubelet not reached, the node gone); an RBAC refusal is the same for every node and ends the pool.
SAMPLES_PER_POOL = 3
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
    # Read per pool: each pool and the node its policy was read from (None: none could be).
    sampled: dict[str, str | None] = field(default_factory=dict)

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


def _read(api: ConfigzApi, node: str) -> KubeletImagePolicy | str:
    """`node`'s policy, or why it could not be read."""
    from prewarm.services.ports import ClusterError

    try:
        return KubeletImagePolicy.from_configz(api.get_node_configz(node))
    except (ClusterError, KubeletConfigError) as e:
        return _why(e)


def read_policies(api: ConfigzApi, nodes: Iterable[str]) -> NodePolicies:
    """The policy of each of `nodes`, read READERS at a time."""

    def read(node: str) -> tuple[str, KubeletImagePolicy | str]:
        return node, _read(api, node)

    found = NodePolicies()
    names = sorted(set(nodes))
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(names)))) as pool:
        for node, result in pool.map(read, names):
            if isinstance(result, str):
                found.unreadable[node] = result
            else:
                found.policies[node] = result
    return found


def node_pool(node: Mapping[str, Any]) -> str:
    """The pool of a Node object: `eks.amazonaws.com/nodegroup=NAME` or `karpenter.sh/nodepool=NAME`, else
    `node.kubernetes.io/instance-type=TYPE`, with its kubelet version.

    >>> node_pool({"metadata": {"labels": {"karpenter.sh/nodepool": "gpu"}},
    ...            "status": {"nodeInfo": {"kubeletVersion": "v1.34.1-eks-1"}}})
    'karpenter.sh/nodepool=gpu, kubelet v1.34.1-eks-1'
    """
    labels = (node.get("metadata") or {}).get("labels") or {}
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or "unknown"
    label = next((k for k in POOL_LABELS if labels.get(k)), INSTANCE_TYPE_LABEL)
    return f"{label}={labels.get(label) or 'unknown'}, kubelet {version}"


def read_pool_policies(api: ConfigzApi, nodes: Iterable[Mapping[str, Any]]) -> NodePolicies:
    """The policy of each of `nodes` (Node objects), read from one node of each pool (`node_pool`) and
    given to every node of it; the next node of the pool is tried when one cannot be reached, up to
    SAMPLES_PER_POOL. A pool none of whose nodes could be read has all its nodes unreadable, with the
    reason. Pools are read READERS at a time."""
    pools: dict[str, list[str]] = {}
    for node in nodes:
        pools.setdefault(node_pool(node), []).append(str(node["metadata"]["name"]))

    def sample(pool: str) -> tuple[str, str | None, KubeletImagePolicy | str]:
        result: KubeletImagePolicy | str = "no node"
        for name in sorted(pools[pool])[:SAMPLES_PER_POOL]:
            result = _read(api, name)
            if not isinstance(result, str):
                return pool, name, result
            if result.startswith(("forbidden", "not authenticated")):
                break
        return pool, None, result

    found = NodePolicies()
    with ThreadPoolExecutor(max_workers=max(1, min(READERS, len(pools)))) as pool_readers:
        for pool, read_from, result in pool_readers.map(sample, sorted(pools)):
            found.sampled[pool] = read_from
            for name in pools[pool]:
                if isinstance(result, str):
                    found.unreadable[name] = result
                else:
                    found.policies[name] = result
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
