"""`prewarm describe`: one job in full, with its nodes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    pass

from prewarm_cli.errors import EXIT_OK
from prewarm_cli.options import current_store, namespace_option, resource_name, target_options


@click.command()
@click.argument("resource", metavar="job")
@click.argument("name")
@namespace_option
@target_options
@click.pass_context
def describe(ctx: click.Context, resource: str, name: str, namespace: str) -> int:
    """Show a job: spec, status, each node's pull and the excluded nodes (a list job: its ImagePullJobs)."""
    resource_name(resource, ("jobs",), "describe")
    from prewarm.services.jobs import view_job
    from prewarm_cli import output as cli_output

    now = time.time()
    view = view_job(current_store(ctx), namespace, name, now=now, with_tasks=True, with_agents=True)
    click.echo(cli_output.describe_job(view, now=now))
    return EXIT_OK


# --- delete --------------------------------------------------------------------------------------

