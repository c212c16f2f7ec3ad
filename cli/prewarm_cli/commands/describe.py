"""`prewarm describe`: one job in full, with its nodes; or one registered node and how it warmed."""

from __future__ import annotations

import time

import click

from prewarm_cli.errors import EXIT_OK, CommandError
from prewarm_cli.options import (
    cluster_options,
    current_store,
    current_target,
    namespace_option,
    resource_name,
    target_options,
)


@click.command()
@click.argument("resource", metavar="job|node")
@click.argument("name")
@namespace_option
@cluster_options
@target_options
@click.pass_context
def describe(ctx: click.Context, resource: str, name: str, namespace: str, kubeconfig: str | None,
             context: str | None) -> int:
    """Show a job: spec, status, each node's pull and the excluded nodes (a list job: its ImagePullJobs),
    and for a private image what it is pulled with and whether the nodes' kubelets let any pod use it
    (read through the node proxy: `get` on `nodes/proxy`).
    Or a registered node: its agent's hello and how its startup taint came off (hello to warm)."""
    kind = resource_name(resource, ("jobs", "nodes"), "describe")
    from prewarm.services.jobs import view_job
    from prewarm_cli import output as cli_output

    now = time.time()
    if kind == "nodes":
        node = current_store(ctx).get_node(name)
        if node is None:
            raise CommandError(f"node \"{name}\" not registered: no agent on it has said hello")
        click.echo(cli_output.describe_node(node, now=now))
        return EXIT_OK
    view = view_job(current_store(ctx), namespace, name, now=now, with_tasks=True, with_agents=True)
    click.echo(cli_output.describe_job(view, now=now))
    record = view.record
    if record.is_pull_job:
        from prewarm_cli.kubelets import describe_credentials

        nodes = sorted({task.node for task in view.tasks})
        spec = record.pull_job.spec
        click.echo("\n".join(describe_credentials(
            spec.image, spec.pull_secrets or [], record.pull_secrets_only, nodes,
            lambda: current_target(ctx).cluster(kubeconfig, context))))
    return EXIT_OK


# --- delete --------------------------------------------------------------------------------------

