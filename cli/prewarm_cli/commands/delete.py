"""`prewarm delete`: delete jobs (cancelling their in-flight pulls), rules, warm snapshots, or cron jobs (with
their runs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from prewarm_cli.cluster_choice import chosen, cluster_option
from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK
from prewarm_cli.options import current_store, namespace_option, resource_name, target_options


@click.command()
@click.argument("resource", metavar="job|rule|snapshot|cronjob")
@click.argument("names", nargs=-1, required=True)
@namespace_option
@cluster_option()
@target_options
@click.pass_context
def delete(ctx: click.Context, resource: str, names: tuple[str, ...], namespace: str, cluster: str | None) -> int:
    """Delete jobs (in-flight pulls are cancelled on their nodes), rules, warm snapshots (their EBS snapshots
    are kept), or cron jobs (with their runs)."""
    kind = resource_name(resource, ("jobs", "rules", "snapshots", "cronjobs"), "delete")
    store = current_store(ctx)
    code = EXIT_OK
    from prewarm.domain.sources import Source, SourceConflictError, source_of
    from prewarm.services.jobs import check_source

    if kind == "rules":
        rules = {r.get("metadata", {}).get("name"): r for r in store.list_rules()}
        for name in names:
            try:
                if name in rules:
                    check_source("PrewarmRule", "", name, owner=source_of(rules[name]), by=Source.CLI)
            except SourceConflictError as e:
                click.echo(f"error: {e}", err=True)
                code = EXIT_FAILURE
                continue
            if store.delete_rule(name):
                click.echo(f'prewarmrule.prewarm.dev "{name}" deleted')
            else:
                click.echo(f'error: rule "{name}" not found', err=True)
                code = EXIT_FAILURE
        return code
    if kind == "snapshots":
        return _delete_warm_snapshots(store, names)
    where = chosen(ctx, cluster)
    if kind == "cronjobs":
        return _each(names, lambda name: _delete_cron_job(store, namespace, name, where))
    return _each(names, lambda name: _delete_job(store, namespace, name, where))


def _delete_warm_snapshots(store: Any, names: tuple[str, ...]) -> int:
    """Marks each deleted: its running bake fails, Fast Snapshot Restore goes off on its snapshots (the
    bakes' function does it), and the resource sync drops the record once it is off; the snapshots stay."""
    from prewarm.domain.sources import Source, SourceConflictError, source_of
    from prewarm.services.bakes import delete_warm_snapshot
    from prewarm.services.jobs import check_source

    code = EXIT_OK
    for name in names:
        found = store.get_warm_snapshot(name)
        try:
            if found is None:
                raise LookupError(f'warm snapshot "{name}" not found')
            check_source("WarmSnapshot", "", name, owner=source_of(found[0]), by=Source.CLI)
        except (LookupError, SourceConflictError) as e:
            click.echo(f"error: {e}", err=True)
            code = EXIT_FAILURE
            continue
        gone = delete_warm_snapshot(store, name, time.time())
        click.echo(f'warmsnapshot.prewarm.dev "{name}" deleted' + ("" if gone else (
            " (Fast Snapshot Restore is turned off on its snapshots first; the record goes at a later sync)")))
    return code


def _each(names: tuple[str, ...], delete_one: Callable[[str], str]) -> int:
    """Deletes each of `names` (`delete_one` says how it went); one not found or refused is an error, and
    the others are deleted still."""
    from prewarm.domain.sources import SourceConflictError
    from prewarm.services.jobs import JobNotFoundError

    code = EXIT_OK
    for name in names:
        try:
            click.echo(delete_one(name))
        except (JobNotFoundError, SourceConflictError) as e:
            click.echo(f"error: {e}", err=True)
            code = EXIT_FAILURE
    return code


def _delete_job(store: Any, namespace: str, name: str, cluster: str) -> str:
    """A job; the stack's dispatch function sends the cancels: node queues take messages from its roles only."""
    from prewarm.domain.jobs import job_key
    from prewarm.services.jobs import not_found, request_deletion

    record = store.get_job(job_key(namespace, name, cluster))
    if record is None:
        raise not_found(namespace, name, cluster)
    cancelling = request_deletion(store, namespace, name, now=time.time(), cluster=cluster)
    note = f" ({cancelling} in-flight pull{'s' if cancelling != 1 else ''} being cancelled)" if cancelling else ""
    return f'{record.api_kind.lower()}.apps.kruise.io "{name}" deleted{note}'


def _delete_cron_job(store: Any, namespace: str, name: str, cluster: str) -> str:
    """A cron job and its runs; dispatch_job deletes its schedules when its item goes."""
    from prewarm.domain.jobs import job_key
    from prewarm.services.cron_jobs import delete_cron_job

    runs = delete_cron_job(store, job_key(namespace, name, cluster), now=time.time())
    note = f" ({len(runs)} run{'s' if len(runs) != 1 else ''} deleted)" if runs else ""
    return f'advancedcronjob.apps.kruise.io "{name}" deleted{note}'


# --- watch ---------------------------------------------------------------------------------------

