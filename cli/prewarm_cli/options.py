"""Options and context shared by the commands: the target, the store, namespaces and resource names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prewarm_cli.targets import (
    ENDPOINT_ENV,
    STACK_ENV,
    STATE_ENV,
    Target,
    resolve_target,
)

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore

from prewarm_cli.errors import DEBUG_ENV

F = TypeVar("F", bound=Callable[..., Any])

_RESOURCES = {
    "job": "jobs", "jobs": "jobs",
    "rule": "rules", "rules": "rules", "prewarmrule": "rules", "prewarmrules": "rules",
    "node": "nodes", "nodes": "nodes",
    "snapshot": "snapshots", "snapshots": "snapshots", "warmsnapshot": "snapshots", "warmsnapshots": "snapshots",
    "cronjob": "cronjobs", "cronjobs": "cronjobs", "advancedcronjob": "cronjobs", "advancedcronjobs": "cronjobs",
    "acj": "cronjobs",
}


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value not in (None, False):
        ctx.meta[f"prewarm.{param.name}"] = value
    return value


def target_options(f: F) -> F:
    """--local/--stack/--region/--debug, accepted before or after the command name."""
    options = [
        click.option("--local", is_flag=True, expose_value=False, callback=_remember,
                     help=f"Operate the local stack (`prewarm local up`; state in ${STATE_ENV} or "
                          f"~/.prewarm/local.json). Also chosen by ${ENDPOINT_ENV}."),
        click.option("--stack", metavar="NAME", expose_value=False, callback=_remember,
                     help=f"Operate the deployed CloudFormation stack NAME (default: ${STACK_ENV})."),
        click.option("--region", metavar="REGION", expose_value=False, callback=_remember,
                     help="AWS region of the stack (default: the AWS configuration's)."),
        click.option("--debug", is_flag=True, expose_value=False, callback=_remember,
                     help=f"Show tracebacks and debug logs (also ${DEBUG_ENV}=1)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def current_target(ctx: click.Context) -> Target:
    """The stack this invocation operates, resolved once."""
    if "prewarm.target" not in ctx.meta:
        ctx.meta["prewarm.target"] = resolve_target(
            local=bool(ctx.meta.get("prewarm.local")), stack=ctx.meta.get("prewarm.stack"),
            region=ctx.meta.get("prewarm.region"),
        )
    target: Target = ctx.meta["prewarm.target"]
    return target


def current_store(ctx: click.Context) -> DynamoJobStore:
    """The target's job store, built once per invocation."""
    if "prewarm.store" not in ctx.meta:
        ctx.meta["prewarm.store"] = current_target(ctx).store()
    store: DynamoJobStore = ctx.meta["prewarm.store"]
    return store


def resource_name(value: str, allowed: Sequence[str], command: str) -> str:
    resource = _RESOURCES.get(value.lower())
    if resource is None or resource not in allowed:
        raise click.UsageError(f'"{command}" does not know the resource type "{value}": use {choices(allowed)}')
    return resource


def choices(values: Sequence[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def cluster_options(f: F) -> F:
    """--kubeconfig/--context: reach the cluster as a kubeconfig's user instead of with an EKS token."""
    f = click.option("--context", metavar="NAME", help="The kubeconfig context (with --kubeconfig).")(f)
    return click.option(
        "--kubeconfig", metavar="PATH", envvar="PREWARM_KUBECONFIG",
        help="Reach the cluster as this kubeconfig's user instead of an EKS token from your AWS credentials.",
    )(f)


def namespace_option(f: F) -> F:
    return click.option("-n", "--namespace", default="default", show_default=True, metavar="NS",
                        help="Namespace of the job.")(f)


# --- The commands --------------------------------------------------------------------------------
