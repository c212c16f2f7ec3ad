"""`prewarm describe`: one job in full, with its nodes; or one registered node and how it warmed."""

from __future__ import annotations

import time
from functools import partial

import click

from prewarm_cli.cluster_choice import chosen, cluster_option, reach, shown
from prewarm_cli.errors import EXIT_OK, CommandError
from prewarm_cli.options import (
    cluster_options,
    current_store,
    namespace_option,
    resource_name,
    target_options,
)


@click.command()
@click.argument("resource", metavar="job|cronjob|node|snapshot")
@click.argument("name")
@namespace_option
@cluster_option()
@cluster_options
@target_options
@click.pass_context
def describe(ctx: click.Context, resource: str, name: str, namespace: str, cluster: str | None,
             kubeconfig: str | None, context: str | None) -> int:
    """Show a job: spec, status, each node's pull and the excluded nodes (a list job: its ImagePullJobs),
    and for a private image what it is pulled with and whether the nodes' kubelets let any pod use it
    (read through the node proxy: `get` on `nodes/proxy`).
    Or a registered node: its agent's hello and how its startup taint came off (hello to warm).
    `--cluster` names the cluster of the job or node (default: the stack's own); a job that has namesakes
    in other clusters (a rule's push makes one job per cluster) ends with each cluster's counts.
    Or a warm snapshot: its node class's snapshot and digests, against the newest push; the nodes booted
    from it; the snapshots kept; the last bake's steps and what it costs.
    Or a cron job (AdvancedCronJob): its schedule, time zone and policies, its last and next run times, its
    active runs and the finished runs its history limits keep, and its EventBridge Scheduler schedules as
    Scheduler holds them (`scheduler:GetSchedule`), with how they differ from the spec."""
    kind = resource_name(resource, ("jobs", "cronjobs", "nodes", "snapshots"), "describe")
    from prewarm.services.jobs import list_views, view_job
    from prewarm_cli import output as cli_output

    now = time.time()
    where = chosen(ctx, cluster)
    store = current_store(ctx)
    if kind == "snapshots":
        from prewarm_cli.snapshot_output import describe_snapshot

        found = store.get_warm_snapshot(name)
        if found is None:
            raise CommandError(f'warm snapshot "{name}" not found')
        click.echo(describe_snapshot(found, store.list_nodes(), now=now))
        return EXIT_OK
    if kind == "cronjobs":
        from prewarm.domain.keys import JobKey
        from prewarm.services.cron_jobs import describe_cron_job
        from prewarm_cli.cron_output import describe_cron_job as cron_text
        from prewarm_cli.options import current_target

        described = describe_cron_job(store, current_target(ctx).cron_schedules(), JobKey(namespace, name, where),
                                      now=now)
        click.echo(cron_text(described, now=now))
        return EXIT_OK
    if kind == "nodes":
        node = store.get_node(name, where)
        if node is None:
            in_cluster = f" in cluster {where}" if where else ""
            raise CommandError(f"node \"{name}\" not registered{in_cluster}: no agent on it has said hello")
        from prewarm.services.boot import node_bytes_pulled

        click.echo(cli_output.describe_node(node, now=now, bytes_pulled=node_bytes_pulled(store, name, where)))
        return EXIT_OK
    view = view_job(store, namespace, name, now=now, with_tasks=True, with_agents=True, cluster=where)
    click.echo(cli_output.describe_job(view, now=now))
    record = view.record
    from prewarm.services.warm_budgets import budget_usage

    if (usage := budget_usage(store, namespace, cluster=where)) is not None:
        click.echo(f"Warm Budget:  {usage}")
    if record.is_pull_job:
        from prewarm_cli.kubelets import describe_credentials

        nodes = sorted({task.node for task in view.tasks})
        spec = record.pull_job.spec
        click.echo("\n".join(describe_credentials(
            spec.image, spec.pull_secrets or [], record.pull_secrets_only, nodes,
            lambda: reach(ctx, where, kubeconfig, context))))
    namesakes = [v for v in list_views(store, namespace=namespace, now=now)
                 if v.record.name == name and v.record.cluster != where]
    if namesakes:
        counts = cli_output.jobs_table([view, *namesakes], now=now, cluster_names=partial(shown, ctx))
        click.echo(f"Clusters:\n{counts}")
    return EXIT_OK


# --- delete --------------------------------------------------------------------------------------

