"""`prewarm`: apply, read, delete and watch pre-warm jobs and rules on a Prewarm stack.

Answers as kubectl does for the same objects. Exit codes: 0 ok, 1 failure (a missing job, a failed
node in `watch`, an unreachable stack), 2 usage or validation error. Errors are one `error: ...`
line on stderr; `--debug` adds the traceback. Only click and the standard library load at start:
boto3, pydantic and rich are imported by the commands that need them.
"""


from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    pass

from prewarm_cli.commands import apply, cluster, delete, describe, doctor, get, install, watch
from prewarm_cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, debug_requested, known_error
from prewarm_cli.options import target_options


class PrewarmGroup(click.Group):
    """The root group: turns errors into one `error:` line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            mapped = known_error(e, ctx.meta.get("prewarm.target"))
            if mapped is None:
                raise
            raise mapped from e

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> int:
        argv = list(sys.argv[1:] if args is None else args)
        debug = debug_requested(argv)
        _configure_logging(debug)
        try:
            rv = super().main(argv, prog_name or "prewarm", complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else EXIT_OK
        except click.ClickException as e:
            if debug:
                traceback.print_exception(e)
            message = e.format_message()
            if isinstance(e, click.UsageError) and e.ctx is not None:
                message = f"{message.rstrip('.')} (see '{e.ctx.command_path} --help')"
            click.echo(f"error: {message}", err=True)
            code = e.exit_code
        except click.Abort:
            click.echo("error: interrupted", err=True)
            code = EXIT_INTERRUPTED
        except Exception as e:  # noqa: BLE001 - the top of the CLI: every bug becomes one line and exit 1
            if debug:
                traceback.print_exception(e)
                hint = ""
            else:
                hint = " (run with --debug for the traceback)"
            click.echo(f"error: unexpected {type(e).__name__}: {e}{hint}", err=True)
            code = EXIT_FAILURE
        if standalone_mode:
            sys.exit(code)
        return code


def _configure_logging(debug: bool) -> None:
    logger = logging.getLogger("prewarm")
    if not any(getattr(h, "_prewarm_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        handler._prewarm_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)


@click.group("prewarm", cls=PrewarmGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="prewarm", prog_name="prewarm", message="%(prog)s %(version)s")
@target_options
def cli() -> None:
    """Pre-warm container images on Kubernetes nodes: Kruise ImagePullJob, ImageListPullJob and PrewarmRule.

    \b
    Target a stack with --local (a stack started by `prewarm local up`) or --stack NAME (deployed).
    Exit codes: 0 ok, 1 failure, 2 usage or validation error.
    """


for _command in (apply.apply, get.get, describe.describe, delete.delete, watch.watch, install.install,
                 install.uninstall, doctor.doctor, cluster.cluster):
    cli.add_command(_command)

# Other packages add commands through this entry-point group: local mode adds `local` and `demo`.
PLUGIN_GROUP = "prewarm.cli"


def load_plugins(group: click.Group = cli) -> None:
    """Adds the commands that installed packages register under `PLUGIN_GROUP`, once."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        if entry.name not in group.commands:
            group.add_command(entry.load(), entry.name)


def main(argv: Sequence[str] | None = None) -> None:
    """The `prewarm` console script."""
    load_plugins()
    cli.main(args=argv, prog_name="prewarm")
