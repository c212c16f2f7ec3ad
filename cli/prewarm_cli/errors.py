"""Errors the CLI turns into one `error:` line, and its exit codes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from prewarm_cli.targets import (
    Target,
    TargetError,
)

if TYPE_CHECKING:
    pass

DEBUG_ENV = "PREWARM_DEBUG"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandError(click.ClickException):
    """A command failed for a reason other than its input (exit code 1)."""

    exit_code = EXIT_FAILURE


# --- Errors and the group ------------------------------------------------------------------------


def debug_requested(argv: Sequence[str]) -> bool:
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--debug" in options or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def known_error(error: BaseException, target: Target | None) -> click.ClickException | None:
    """The one-line error for failures a user can act on; None for a bug (shown with its traceback)."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    from prewarm.adapters.sqs import QueueError
    from prewarm.services.jobs import JobNotFoundError
    from prewarm.services.ports import ClusterError, StoreError

    where = f" ({target.description}, table {target.table_name})" if target is not None else ""
    if isinstance(error, TargetError):
        return click.UsageError(str(error)) if error.exit_code == EXIT_USAGE else CommandError(str(error))
    if isinstance(error, JobNotFoundError):
        return CommandError(str(error))
    if isinstance(error, EndpointConnectionError) and target is not None and target.local:
        return CommandError(f"{error}: is the local stack running? Start it with `prewarm local up`")
    if isinstance(error, NoCredentialsError):
        return CommandError(f"{error}: configure AWS credentials (AWS_PROFILE, aws configure or SSO)")
    if isinstance(error, ClusterError):
        return CommandError(f"Kubernetes API: {error}")
    if isinstance(error, StoreError | QueueError | BotoCoreError | ClientError):
        return CommandError(f"{error}{where}")
    return None
