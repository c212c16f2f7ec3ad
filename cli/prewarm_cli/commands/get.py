"""`prewarm get`: list jobs, rules or nodes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    pass

from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK
from prewarm_cli.options import current_store, namespace_option, resource_name, target_options


@click.command()
@click.argument("resource", metavar="jobs|rules|nodes")
@click.argument("names", nargs=-1)
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json", "name"]),
              help="wide: more columns; yaml/json: the manifests with their status; name: kind/name only.")
@click.option("--show-labels", is_flag=True, help="Nodes: add a LABELS column with every label.")
@target_options
@click.pass_context
def get(ctx: click.Context, resource: str, names: tuple[str, ...], namespace: str, all_namespaces: bool,
        output: str | None, show_labels: bool) -> int:
    """List jobs (Kruise's columns), rules or registered nodes; or show the named ones."""
    kind = resource_name(resource, ("jobs", "rules", "nodes"), "get")
    if all_namespaces and names:
        raise click.UsageError("a job cannot be retrieved by name across all namespaces: use -n instead of -A")
    from prewarm_cli import output as cli_output

    store = current_store(ctx)
    now = time.time()
    missing: list[str] = []
    if kind == "jobs":
        from prewarm.services.jobs import JobNotFoundError, list_views, view_job

        if names:
            views = []
            for name in names:
                try:
                    views.append(view_job(store, namespace, name, now=now))
                except JobNotFoundError as e:
                    missing.append(str(e))
        else:
            views = list_views(store, namespace=None if all_namespaces else namespace, now=now)
        docs = [cli_output.job_document(v) for v in views]
        text = cli_output.jobs_table(views, now=now, wide=output == "wide", all_namespaces=all_namespaces)
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
    else:
        nodes = sorted(store.list_nodes(), key=lambda n: n.name)
        if names:
            known = {n.name for n in nodes}
            missing = [f'node "{n}" not registered' for n in names if n not in known]
            nodes = [n for n in nodes if n.name in names]
        docs = [cli_output.node_document(n) for n in nodes]
        text = cli_output.nodes_table(nodes, now=now, wide=output == "wide", show_labels=show_labels)
        empty = "No nodes have registered: no agent has said hello yet."
    if docs:
        if output in ("yaml", "json", "name"):
            click.echo(cli_output.render_documents(docs, output, single=len(names) == 1))
        else:
            click.echo(text)
    elif not names:
        click.echo(empty, err=True)
    for problem in missing:
        click.echo(f"error: {problem}", err=True)
    return EXIT_FAILURE if missing else EXIT_OK


# --- describe ------------------------------------------------------------------------------------

