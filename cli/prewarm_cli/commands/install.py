"""`prewarm install` and `prewarm uninstall`: the agent DaemonSet, its RBAC and the functions' RBAC."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prewarm_cli.errors import EXIT_OK
from prewarm_cli.options import cluster_options, current_target, target_options

# What `prewarm local up` installs: its agents run beside the embedded cluster, not from an image.
LOCAL_IMAGE = "prewarm-agent:local"

if TYPE_CHECKING:
    from prewarm_cli.targets import Target

F = TypeVar("F", bound=Callable[..., Any])


def install_options(f: F) -> F:
    """The options that fill in what install puts into a cluster (`install`, `cluster add`)."""
    options = [
        click.option("--image", metavar="IMAGE",
                     help="The agent's container image [default: <stack account>.dkr.ecr.<region>.amazonaws.com/"
                          "prewarm-agent:<this CLI's version>]."),
        click.option("--agent-role-arn", metavar="ARN",
                     help="The agents' IAM role, for IRSA (default: the stack's AgentRoleArn)."),
        click.option("--pod-identity", is_flag=True,
                     help="The agents get AWS credentials from an EKS Pod Identity association, not IRSA."),
        click.option("--registry-allowlist", metavar="HOSTS", default="",
                     help="Comma-separated registries the agents may pull from (default: any)."),
        click.option("--bottlerocket", is_flag=True,
                     help="Give the agent the SELinux type Bottlerocket requires to reach containerd's socket."),
        click.option("--pull-secret-namespaces", metavar="NS,...", default="",
                     help="Namespaces whose pull secrets jobs may name ('*': every namespace, also later ones)."),
        click.option("--pull-secret-names", metavar="NAME,...", default="",
                     help="The only secrets jobs may name as pullSecrets there (default: any secret of those "
                          "namespaces)."),
        click.option("--startup-taint", metavar="KEY[=VALUE]:EFFECT", default="prewarm.dev/warming:NoSchedule",
                     show_default=True,
                     help="The taint new nodes join with (Karpenter startupTaints, node group taints); the agent "
                          "removes it once the node's images are present."),
        click.option("--max-warm-seconds", type=int, default=900, show_default=True,
                     help="Remove the startup taint this long after the node joined, whatever is missing."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def rendered_objects(target: Target, *, image: str | None, agent_role_arn: str | None, pod_identity: bool,
                     registry_allowlist: str, bottlerocket: bool, pull_secret_namespaces: str, pull_secret_names: str,
                     startup_taint: str, max_warm_seconds: int, cluster: str = "") -> list[dict[str, Any]]:
    """What install puts into a cluster of `target`'s stack (`cluster`: a registered one's name); a bad
    option is a usage error naming it."""
    from prewarm_cli.install.render import InstallError, default_agent_image, values_from_stack
    from prewarm_cli.install.render import render as render_objects

    if not image:
        image = LOCAL_IMAGE if target.local else default_agent_image(target.env, target.region or "")
    try:
        values = values_from_stack(
            target.env, region=target.region or "", image=image,
            credentials_config=_credentials_config(target), agent_role_arn=agent_role_arn or "",
            pod_identity=pod_identity, registry_allowlist=[h for h in registry_allowlist.split(",") if h],
            bottlerocket=bottlerocket, pull_secret_namespaces=[pull_secret_namespaces],
            pull_secret_names=[pull_secret_names],
            startup_taint=startup_taint, max_warm_seconds=max_warm_seconds, cluster=cluster,
        )
        return render_objects(values)
    except InstallError as e:
        raise click.UsageError(str(e).replace("image is empty", "--image is required")) from None


@click.command()
@click.option("--render", is_flag=True, help="Print the manifests as YAML instead of installing them.")
@install_options
@cluster_options
@target_options
@click.pass_context
def install(ctx: click.Context, /, render: bool, kubeconfig: str | None, context: str | None, **options: Any) -> int:
    """Install the agent and the functions' RBAC into the stack's cluster, filled in from the stack.

    \b
    Idempotent: an unchanged object is not written; objects an earlier install made that are no longer
    wanted are deleted. `prewarm uninstall` removes everything it installed.
    """
    target = current_target(ctx)
    objects = rendered_objects(target, **options)
    if render:
        import yaml

        click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)
        return EXIT_OK
    from prewarm_cli.install.apply import install as apply_objects

    with target.cluster(kubeconfig, context) as cluster:
        apply_objects(cluster, objects, report=lambda change: click.echo(str(change)))
    return EXIT_OK


@click.command()
@click.option("--crds", is_flag=True,
              help="Also delete the CustomResourceDefinitions, and with them every ImagePullJob, "
                   "ImageListPullJob and PrewarmRule resource.")
@cluster_options
@target_options
@click.pass_context
def uninstall(ctx: click.Context, crds: bool, kubeconfig: str | None, context: str | None) -> int:
    """Remove what `prewarm install` installed (and nothing else); the CRDs stay unless --crds."""
    from prewarm_cli.install.apply import uninstall as remove_objects

    target = current_target(ctx)
    with target.cluster(kubeconfig, context) as cluster:
        changes = remove_objects(cluster, include_crds=crds, report=lambda change: click.echo(str(change)))
    if not changes:
        click.echo("No resources found: nothing that prewarm install made is in the cluster")
    if not crds:
        click.echo("The prewarm.dev CustomResourceDefinitions and their resources were kept (--crds deletes them)",
                   err=True)
    return EXIT_OK


def _credentials_config(target: Target) -> str:
    """The stack's credentials configuration: inline, or read from its SSM parameter."""
    inline = target.env.get("CREDENTIALS_CONFIG", "")
    parameter = target.env.get("CREDENTIALS_CONFIG_PARAMETER", "")
    if inline or not parameter:
        return inline
    value: str = target.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    return value
