"""`prewarm doctor`: is the stack healthy? One line per check, each problem with its fix."""

from __future__ import annotations

import click

from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK
from prewarm_cli.options import cluster_options, current_target, target_options


@click.command()
@cluster_options
@target_options
@click.pass_context
def doctor(ctx: click.Context, kubeconfig: str | None, context: str | None) -> int:
    """Check the stack and its cluster: outputs, the functions' cluster access and RBAC, the agents,
    node queues, dead-letter queues, credential expiry, whether each registry's token may pull, and the last
    sweep and daily round.

    \b
    Prints `ok`, `FAIL` (the problem, then its fix) or `skip` (its input failed) per check.
    Exit code 0 when nothing failed, 1 otherwise.
    """
    from prewarm_cli.doctor.run import Doctor
    from prewarm_cli.targets.stack import STACK_OUTPUTS

    target = current_target(ctx)
    found = Doctor(env=target.env, local=target.local, client=target.client,
                   cluster=lambda: target.cluster(kubeconfig, context), store=target.store(), queues=target.queues(),
                   outputs=STACK_OUTPUTS)
    failed = False
    for result in found.run():
        click.echo(result.line())
        failed = failed or result.failed
    return EXIT_FAILURE if failed else EXIT_OK
