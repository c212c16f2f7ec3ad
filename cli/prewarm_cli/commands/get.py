"""`prewarm get`: list jobs, rules or nodes."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from prewarm_cli.cluster_choice import chosen, cluster_option, own_cluster_name, reach, shown
from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK, CommandError
from prewarm_cli.options import (
    cluster_options,
    current_store,
    current_target,
    namespace_option,
    resource_name,
    target_options,
)

if TYPE_CHECKING:
    from prewarm.services.nodes import NodesView


@click.command()
@click.argument("resource", metavar="jobs|rules|cronjobs|nodes|snapshots")
@click.argument("names", nargs=-1)
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json", "name"]),
              help="wide: more columns; yaml/json: the manifests with their status; name: kind/name only.")
@click.option("--show-labels", is_flag=True, help="Nodes: add a LABELS column with every label.")
@cluster_option()
@cluster_options
@target_options
@click.pass_context
def get(ctx: click.Context, resource: str, names: tuple[str, ...], namespace: str, all_namespaces: bool,
        output: str | None, show_labels: bool, cluster: str | None, kubeconfig: str | None,
        context: str | None) -> int:
    """List jobs (Kruise's columns), rules, cron jobs (AdvancedCronJobs), nodes or warm snapshots; or show the
    named ones.

    \b
    Jobs: of every cluster the stack serves (a CLUSTER column once it serves several), or of the one
    `--cluster` names; named jobs are looked up in that cluster (default: the stack's own).

    \b
    Nodes: every node of the cluster and every node whose agent said hello, with its agent
    (Registered, NotReporting, Absent) and why its startup taint is as it is.

    \b
    Snapshots: each WarmSnapshot's node class, the snapshot it boots from, how many images it holds, its
    age and the newest push's, and its status (Pending, Baking, Current, Stale, Failed, Deleting).
    """
    kind = resource_name(resource, ("jobs", "rules", "cronjobs", "nodes", "snapshots"), "get")
    if all_namespaces and names:
        raise click.UsageError("a job cannot be retrieved by name across all namespaces: use -n instead of -A")
    from prewarm_cli import output as cli_output

    store = current_store(ctx)
    now = time.time()
    missing: list[str] = []
    summary = ""
    if kind == "jobs":
        from prewarm.services.jobs import JobNotFoundError, list_views, view_job

        where = chosen(ctx, cluster)
        if names:
            views = []
            for name in names:
                try:
                    views.append(view_job(store, namespace, name, now=now, cluster=where))
                except JobNotFoundError as e:
                    missing.append(str(e))
        else:
            views = list_views(store, namespace=None if all_namespaces else namespace, now=now,
                               cluster=where if cluster else None)
        docs = [cli_output.job_document(v, shown(ctx, v.record.cluster)) for v in views]
        several = bool(where) or any(v.record.cluster for v in views) or any(
            c.name != own_cluster_name(ctx) for c in store.list_clusters())
        text = cli_output.jobs_table(views, now=now, wide=output == "wide", all_namespaces=all_namespaces,
                                     cluster_names=functools.partial(shown, ctx) if several else None)
        empty = "No jobs found." if all_namespaces else f"No jobs found in {namespace} namespace."
    elif kind == "rules":
        rules = sorted(store.list_rules(), key=lambda r: r.get("metadata", {}).get("name", ""))
        if names:
            by_name = {r.get("metadata", {}).get("name"): r for r in rules}
            missing = [f'rule "{n}" not found' for n in names if n not in by_name]
            rules = [by_name[n] for n in names if n in by_name]
        docs = [cli_output.rule_document(r) for r in rules]
        text = cli_output.rules_table(rules)
        empty = "No rules found."
    elif kind == "snapshots":
        from prewarm_cli.snapshot_output import snapshot_document, snapshots_table

        records = store.list_warm_snapshots()
        if names:
            found = {r[0].get("metadata", {}).get("name"): r for r in records}
            missing = [f'warm snapshot "{n}" not found' for n in names if n not in found]
            records = [found[n] for n in names if n in found]
        docs = [snapshot_document(r) for r in records]
        text = snapshots_table(records, now=now)
        empty = "No warm snapshots found."
    elif kind == "cronjobs":
        from prewarm.services.cron_jobs import cron_job_statuses

        where = chosen(ctx, cluster)
        crons = [c for c in store.list_cron_jobs() if c.key.cluster == where
                 and (all_namespaces or c.key.namespace == namespace) and (not names or c.key.name in names)]
        missing = [f'advancedcronjob "{n}" not found in namespace "{namespace}"' for n in names
                   if n not in {c.key.name for c in crons}]
        docs = [{**c.manifest, "status": status}
                for c, status in zip(crons, cron_job_statuses(store, crons, now=now), strict=True)]
        text = cli_output.cron_jobs_table(docs)
        empty = "No cron jobs found." if all_namespaces else f"No cron jobs found in {namespace} namespace."
    else:
        from prewarm_cli import node_output

        view = _view_nodes(ctx, chosen(ctx, cluster), kubeconfig, context, now=now)
        states = view.nodes
        if names:
            states, missing = node_output.names_found(states, names)
        for problem in view.problems:
            click.echo(f"warning: {problem}", err=True)
        docs = [node_output.node_document(s, now=now) for s in states]
        text = node_output.nodes_table(states, now=now, wide=output == "wide", show_labels=show_labels)
        # How many nodes lack a working agent, as `get jobs` counts them per job: on stderr, below the table.
        summary = node_output.nodes_summary(states) if output not in ("yaml", "json", "name") else ""
        empty = "No nodes found: the cluster has none and no agent has said hello."
    if docs:
        if output in ("yaml", "json", "name"):
            click.echo(cli_output.render_documents(docs, output, single=len(names) == 1))
        else:
            click.echo(text)
            if summary:
                click.echo(summary, err=True)
    elif not names:
        click.echo(empty, err=True)
    for problem in missing:
        click.echo(f"error: {problem}", err=True)
    return EXIT_FAILURE if missing else EXIT_OK


def _view_nodes(ctx: click.Context, where: str, kubeconfig: str | None, context: str | None, *,
                now: float) -> NodesView:
    """The nodes of cluster `where` as the table and the cluster show them; without a cluster to reach, the
    table's alone."""
    from prewarm.domain.intervals import NO_AGENT_GRACE_SECONDS, STARTUP_TAINT_GRACE_SECONDS
    from prewarm.services.nodes import view_nodes
    from prewarm.services.ports import ClusterError

    target = current_target(ctx)
    # The sweep's StartupTaintGraceSeconds and NoAgentGraceSeconds (stack parameters, which the target's
    # environment carries), which time its removal of a startup taint.
    grace = _seconds(target.env, "STARTUP_TAINT_GRACE_SECONDS", STARTUP_TAINT_GRACE_SECONDS)
    no_agent_grace = _seconds(target.env, "NO_AGENT_GRACE_SECONDS", NO_AGENT_GRACE_SECONDS)
    try:
        cluster = reach(ctx, where, kubeconfig, context)
    except ClusterError as e:
        return view_nodes(current_store(ctx), None, now=now, grace=grace, no_agent_grace=no_agent_grace,
                          unreachable=f"cannot reach the cluster ({e})", cluster_name=where)
    with cluster:
        return view_nodes(current_store(ctx), cluster, now=now, grace=grace, no_agent_grace=no_agent_grace,
                          cluster_name=where)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A stack's seconds setting as its target carries it; `default` (the template's) when it carries none."""
    value = env.get(name) or str(default)
    try:
        return float(value)
    except ValueError:
        raise CommandError(f"the stack's {name} is {value!r}, not a number of seconds") from None


# --- describe ------------------------------------------------------------------------------------

