"""Local mode's further EKS clusters (`prewarm local up --clusters N`): one stack serving several clusters.

The stack's own cluster is `local` (its ClusterName); each further one, `local-2`, `local-3`..., is one
more embedded Kubernetes API with the same nodes (EKS names nodes after their private IPs, which repeat
across VPCs), each node with its own containerd and agent, told its cluster (`PREWARM_CLUSTER`). As on
AWS, each API checks that an EKS token was signed for it, and the AWS limits layer plays EKS for it
(`aws_limits.eks`: DescribeCluster answers its endpoint and CA, access entries reach its API). Each is
registered through `prewarm cluster add`'s own code (`prewarm_cli.clusters.register_cluster`): its
access entries created through the EKS API, the cluster recorded with its labels (`env=prod`, so rules can
tell them from the own cluster), checked by an invocation of the stack's resource sync function (the layer
runs its handler: `aws_limits.lambdas`), the install applied as the operator.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prewarm_devtools.kubeapi.server import KubeApiServer
    from prewarm_devtools.sam.stack import LocalStack

# The labels of every further cluster: rules tell them from the own cluster by them.
EXTRA_LABELS = {"env": "prod"}


def extra_cluster_names(own: str, count: int) -> list[str]:
    """`local-2`... for a stack of `count` clusters whose own is `own`.

    >>> extra_cluster_names("local", 3)
    ['local-2', 'local-3']
    """
    return [f"{own}-{i}" for i in range(2, count + 1)]


@dataclass
class LocalCluster:
    """A further cluster of a local stack: its API, its CA's file (for the agents), the agents' service
    account token prefix there, its nodes (`LocalNode`) and the DaemonSet controller it plays."""

    name: str
    labels: dict[str, str]
    kube: KubeApiServer
    ca_file: Path
    url: str
    agent_token: str = field(default_factory=lambda: f"agent-{secrets.token_urlsafe(24)}")
    nodes: dict[str, Any] = field(default_factory=dict)
    daemonset: Any = None

    @property
    def ca_data(self) -> str:
        return base64.b64encode(self.kube.ca_pem.encode()).decode() if self.kube.ca_pem else ""

    def agent_token_of(self, node: str) -> str:
        """The node-bound token of the agent pod on `node`, as in the own cluster (`LocalMode._agent_token_of`)."""
        from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
        from prewarm_devtools.kubeapi.auth import service_account

        token = f"{self.agent_token}.{node}"
        self.kube.add_identity(token, service_account(AGENT_NAMESPACE, AGENT_NAME, node=node))
        return token

    def status(self, node_status: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        names = sorted({n["metadata"]["name"] for n in self.kube.list_objects("nodes")} | set(self.nodes))
        # The store is read directly: a stopped API (an outage being played) still has its nodes.
        return {"name": self.name, "labels": dict(self.labels), "kubernetes": self.url,
                "api": self.kube.state,
                "nodes": [node_status(self.nodes.get(n)) | {"name": n} for n in names]}


def share_principals(kube: KubeApiServer, stack: LocalStack) -> None:
    """What STS would tell any cluster: who each local key is (the operator, each function's role); and
    the operator, who created every local cluster, is its admin (EKS bootstraps the creator's access)."""
    from prewarm_devtools.kubeapi.auth import MASTERS, AccessEntry
    from prewarm_devtools.sam.aws import OPERATOR

    kube.map_access_key(OPERATOR.access_key_id, OPERATOR.arn)
    kube.add_access_entry(OPERATOR.arn, AccessEntry(groups=(MASTERS,)))
    for fn in stack.functions.values():
        if fn.identity is not None:
            kube.map_access_key(fn.identity.access_key_id, fn.identity.arn)


def start_cluster(name: str, base_dir: Path, stack: LocalStack, layer: Any, *, seed: Callable[[Any], None]
                  ) -> LocalCluster:
    """Cluster `name`'s API, seeded by `seed(kube)`, known to the principals and served by the layer as EKS."""
    from prewarm_devtools.kubeapi.server import KubeApiServer

    kube = KubeApiServer(tls=True, cluster_name=name).start()
    ca_file = base_dir / f"kube-ca-{name}.crt"
    ca_file.write_text(kube.ca_pem or "")
    seed(kube)
    share_principals(kube, stack)
    cluster = LocalCluster(name, dict(EXTRA_LABELS), kube, ca_file, kube.url)
    layer.eks.serve(name, kube.url, cluster.ca_data, kube)
    return cluster


def register(cluster: LocalCluster, stack: LocalStack, objects: list[dict[str, Any]], env: dict[str, str],
             endpoint_url: str, *, region: str = "") -> None:
    """`prewarm cluster add` of the cluster, with the stack's settings `env` (outputs included), as the operator;
    in `region` when given (`--cluster-region`)."""
    from prewarm.adapters.kube import KubeCluster
    from prewarm_cli.clusters import reach_from_stack, register_cluster
    from prewarm_cli.targets import target_from_env

    target = target_from_env(env, description=f"local stack at {endpoint_url}", region=stack.region,
                             endpoint_url=endpoint_url, local=True)
    register_cluster(target, target.store(), cluster.name, cluster.labels, objects, lambda line: None,
                     lambda registered: KubeCluster.for_registered(registered, session=target.session()),
                     reach_from_stack(target), region=region)
