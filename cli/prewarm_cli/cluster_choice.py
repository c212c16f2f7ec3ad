"""`--cluster`: which of the stack's clusters a job command means, and how the CLI reaches it.

The stack's own cluster (its `ClusterName`) is the default, so one-cluster users never name it; any other
must be registered (`prewarm cluster add`). Jobs of a registered cluster are keyed by it
(`prewarm.domain.clusters`), so `-n ml web` in two clusters are two jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prewarm_cli.options import current_store, current_target

if TYPE_CHECKING:
    from prewarm.adapters.kube import KubeCluster

F = TypeVar("F", bound=Callable[..., Any])


def cluster_option(*, multiple: bool = False) -> Callable[[F], F]:
    help_text = ("The cluster of the job: the stack's own (its ClusterName, the default) or one registered with "
                 "`prewarm cluster add`.")
    if multiple:
        help_text = "Apply the jobs to this cluster (repeatable: one job per cluster). " + help_text.split(": ", 1)[1]
    return click.option("--cluster", "clusters" if multiple else "cluster", metavar="NAME", multiple=multiple,
                        help=help_text)


def own_cluster_name(ctx: click.Context) -> str:
    return current_target(ctx).env.get("CLUSTER_NAME", "")


def chosen(ctx: click.Context, name: str | None) -> str:
    """The cluster `--cluster` names, as the stack keys it ("" for its own); a name that is not an EKS
    cluster name, or no cluster the stack serves, is a usage error naming it."""
    from prewarm.domain.clusters import ClusterError, resolve_cluster

    try:
        cluster = resolve_cluster(name, own_cluster_name(ctx))
    except ClusterError as e:
        raise click.BadParameter(str(e), param_hint="'--cluster'") from None
    if cluster and current_store(ctx).get_cluster(cluster) is None:
        raise click.BadParameter(f'cluster "{cluster}" is not registered with {current_target(ctx).description}: '
                                 "see `prewarm cluster list`", param_hint="'--cluster'")
    return cluster


def chosen_many(ctx: click.Context, names: Sequence[str]) -> list[str]:
    """Each cluster `--cluster` names, once, in order; none named means the stack's own."""
    return list(dict.fromkeys(chosen(ctx, n) for n in names)) if names else [chosen(ctx, None)]


def shown(ctx: click.Context, cluster: str) -> str:
    """A cluster as people name it: the stack's own by its ClusterName."""
    return cluster or own_cluster_name(ctx) or "(stack's own)"


def reach(ctx: click.Context, cluster: str, kubeconfig: str | None = None, context: str | None = None) -> KubeCluster:
    """The API of `cluster` as you: a kubeconfig's user, or an EKS token from your AWS credentials (a
    registered cluster at the endpoint and CA `prewarm cluster add` recorded)."""
    from prewarm.adapters.kube import KubeCluster
    from prewarm.services.ports import ClusterConfigError

    target = current_target(ctx)
    if not cluster or kubeconfig:
        return target.cluster(kubeconfig, context)
    registered = current_store(ctx).get_cluster(cluster)
    if registered is None:
        raise ClusterConfigError(f'cluster "{cluster}" is not registered with {target.description}')
    return KubeCluster.for_registered(registered, session=target.session())
