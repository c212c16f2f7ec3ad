"""What `prewarm install` puts into a local cluster, and the access each caller gets to it, as on EKS."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prewarm_devtools.sam.stack import LocalStack


def render_install(stack: LocalStack, *, agent_role_arn: str, credentials_config: dict[str, Any],
                   max_warm_seconds: int | None = None, cluster: str = "") -> list[dict[str, Any]]:
    """What `prewarm install` installs into a local cluster (`cluster`: a further one's name)."""
    from prewarm_cli.commands.install import LOCAL_IMAGE
    from prewarm_cli.install.render import ALL_NAMESPACES, InstallValues, render, values_from_stack

    values = values_from_stack(
        {**stack.env(), "AGENT_ROLE_ARN": agent_role_arn}, region=stack.region, image=LOCAL_IMAGE,
        credentials_config=json.dumps(credentials_config), pull_secret_namespaces=ALL_NAMESPACES,
        max_warm_seconds=InstallValues.max_warm_seconds if max_warm_seconds is None else max_warm_seconds,
        cluster=cluster,
    )
    objects: list[dict[str, Any]] = render(values)
    return objects


def grant_cluster_access(kube: Any, stack: LocalStack, *, agent_token: str, agent_role_arn: str,
                         max_warm_seconds: int | None = None,
                         credentials_config: dict[str, Any]) -> None:
    """Each function calls the embedded API as its own role, with exactly the RBAC `prewarm install` ships.

    As on EKS: the template's access entries give each function role its Kubernetes groups (created
    through the EKS API the AWS limits layer plays for the cluster, when it is on), the operator (the
    cluster's creator) is an admin, the agents are their service account (`agent_token`), and install
    binds the groups and the agents' service account.
    """
    from prewarm.adapters.kube import KubeCluster
    from prewarm_cli.install.apply import install
    from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
    from prewarm_devtools import aws_limits
    from prewarm_devtools.kubeapi.auth import AccessEntry, service_account
    from prewarm_devtools.localclusters import share_principals

    share_principals(kube, stack)
    layer = aws_limits.active()
    name = kube.authenticator.cluster_name
    if layer is not None and name:
        layer.eks.serve(name, kube.url, base64.b64encode(kube.ca_pem.encode()).decode(), kube)
    for principal, groups in stack.access_entries().items():
        if layer is not None and name:
            layer.eks.create_access_entry(name, {"principalArn": principal, "kubernetesGroups": list(groups)})
        else:
            kube.add_access_entry(principal, AccessEntry(groups=groups))
    kube.add_identity(agent_token, service_account(AGENT_NAMESPACE, AGENT_NAME))
    objects = render_install(stack, agent_role_arn=agent_role_arn, credentials_config=credentials_config,
                             max_warm_seconds=max_warm_seconds)
    with KubeCluster(kube.url, lambda: kube.token, ca_data=kube.ca_pem) as cluster:
        install(cluster, objects)
