"""`prewarm`: apply, read, delete and watch pre-warm jobs and rules on a Prewarm stack.

Answers as kubectl does for the same objects. Exit codes: 0 ok, 1 failure (a missing job, a failed
node in `watch`, an unreachable stack), 2 usage or validation error. Errors are one `error: ...`
line on stderr; `--debug` adds the traceback. Only click and the standard library load at start:
boto3, pydantic and rich are imported by the commands that need them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prewarm_local.target import (
    ENDPOINT_ENV,
    STACK_ENV,
    STATE_ENV,
    LocalState,
    Target,
    TargetError,
    clear_local_state,
    local_state_path,
    local_target,
    process_alive,
    read_local_state,
    resolve_target,
)

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.services.jobs import JobView
    from prewarm_local.cli_output import WatchState

F = TypeVar("F", bound=Callable[..., Any])

DEBUG_ENV = "PREWARM_DEBUG"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN_NAME = "<stdin>"
_RESOURCES = {
    "job": "jobs", "jobs": "jobs",
    "rule": "rules", "rules": "rules", "prewarmrule": "rules", "prewarmrules": "rules",
    "node": "nodes", "nodes": "nodes",
}


class CommandError(click.ClickException):
    """A command failed for a reason other than its input (exit code 1)."""

    exit_code = EXIT_FAILURE


# --- Errors and the group ------------------------------------------------------------------------


def _debug_requested(argv: Sequence[str]) -> bool:
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--debug" in options or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _known_error(error: BaseException, target: Target | None) -> click.ClickException | None:
    """The one-line error for failures a user can act on; None for a bug (shown with its traceback)."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    from prewarm.adapters.sqs import QueueError
    from prewarm.services.jobs import JobNotFoundError
    from prewarm.services.ports import StoreError

    where = f" ({target.description}, table {target.table_name})" if target is not None else ""
    if isinstance(error, TargetError):
        return click.UsageError(str(error)) if error.exit_code == EXIT_USAGE else CommandError(str(error))
    if isinstance(error, JobNotFoundError):
        return CommandError(str(error))
    if isinstance(error, EndpointConnectionError) and target is not None and target.local:
        return CommandError(f"{error}: is the local stack running? Start it with `prewarm local up`")
    if isinstance(error, NoCredentialsError):
        return CommandError(f"{error}: configure AWS credentials (AWS_PROFILE, aws configure or SSO)")
    if isinstance(error, StoreError | QueueError | BotoCoreError | ClientError):
        return CommandError(f"{error}{where}")
    return None


class PrewarmGroup(click.Group):
    """The root group: turns errors into one `error:` line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            mapped = _known_error(e, ctx.meta.get("prewarm.target"))
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
        debug = _debug_requested(argv)
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


# --- Targeting -----------------------------------------------------------------------------------


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


def _resource(value: str, allowed: Sequence[str], command: str) -> str:
    resource = _RESOURCES.get(value.lower())
    if resource is None or resource not in allowed:
        raise click.UsageError(f'"{command}" does not know the resource type "{value}": use {_choices(allowed)}')
    return resource


def _choices(values: Sequence[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _namespace_option(f: F) -> F:
    return click.option("-n", "--namespace", default="default", show_default=True, metavar="NS",
                        help="Namespace of the job.")(f)


# --- The commands --------------------------------------------------------------------------------


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


# --- apply ---------------------------------------------------------------------------------------


@dataclass
class _Document:
    where: str  # `jobs.yaml document 2` (`, item 1` inside a `kind: List`)
    body: Any


def _sources(filenames: Sequence[str], recursive: bool) -> Iterator[tuple[str, Callable[[], str]]]:
    for name in filenames:
        if name == "-":
            yield STDIN_NAME, lambda: sys.stdin.read()
            continue
        path = Path(name)
        if path.is_dir():
            found = path.rglob("*") if recursive else path.iterdir()
            for file in sorted(p for p in found if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES):
                yield str(file), functools.partial(file.read_text, encoding="utf-8")
        else:
            yield name, functools.partial(path.read_text, encoding="utf-8")


def _documents(source: str, text: str) -> tuple[list[_Document], str | None]:
    """The documents of one file (a `kind: List` unpacked), and the YAML error that ended it early."""
    import yaml

    documents: list[_Document] = []
    number = 0
    try:
        for body in yaml.safe_load_all(text):
            if body is None:
                continue
            number += 1
            where = f"{source} document {number}"
            items = body.get("items") if isinstance(body, dict) and body.get("kind") == "List" else None
            if isinstance(items, list):
                documents += [_Document(f"{where}, item {i}", item) for i, item in enumerate(items, start=1)]
            else:
                documents.append(_Document(where, body))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).replace("\n", " ")
        return documents, f"{source}: invalid YAML{at}: {problem}"
    return documents, None


@cli.command()
@click.option("-f", "--filename", "filenames", multiple=True, required=True,
              type=click.Path(exists=True, allow_dash=True), metavar="FILE|DIR|-",
              help="Manifests to apply: a file, a directory of .yaml/.yml/.json files, or - for stdin. Repeatable.")
@click.option("-R", "--recursive", is_flag=True, help="Also read the directories' subdirectories.")
@target_options
@click.pass_context
def apply(ctx: click.Context, filenames: tuple[str, ...], recursive: bool) -> int:
    """Create or update jobs and rules from manifests, as `kubectl apply` does.

    \b
    Kinds: ImagePullJob, ImageListPullJob (apps.kruise.io/v1alpha1 or v1beta1, prewarm.dev/v1alpha1)
    and PrewarmRule (prewarm.dev/v1alpha1); multi-document YAML and `kind: List` are read.
    Valid documents are applied even when others are invalid; invalid ones are reported, each
    naming the file, the document and the field, and the exit code is then 2.
    """
    from prewarm.domain.jobs import JobValidationError
    from prewarm.services.jobs import apply_manifest
    from prewarm.services.ports import StoreError

    invalid = failed = applied = 0
    queues = current_target(ctx).queues()  # a list job that drops an image cancels that image's pulls
    for source, read in _sources(filenames, recursive):
        try:
            text = read()
        except (OSError, UnicodeDecodeError) as e:
            click.echo(f"error: {source}: cannot read: {getattr(e, 'strerror', None) or e}", err=True)
            invalid += 1
            continue
        documents, yaml_error = _documents(source, text)
        for doc in documents:
            try:
                outcome = apply_manifest(current_store(ctx), doc.body, now=time.time(), queues=queues)
            except JobValidationError as e:
                subject = f" ({e.subject})" if e.subject else ""
                for problem in e.errors:
                    click.echo(f"error: {doc.where}{subject}: {problem}", err=True)
                invalid += 1
            except StoreError as e:
                click.echo(f"error: {doc.where}: {e}", err=True)
                failed += 1
            else:
                click.echo(outcome.describe())
                applied += 1
        if yaml_error is not None:
            click.echo(f"error: {yaml_error}", err=True)
            invalid += 1
    if not (applied or invalid or failed):
        raise click.UsageError("no objects passed to apply")
    return EXIT_USAGE if invalid else EXIT_FAILURE if failed else EXIT_OK


# --- get -----------------------------------------------------------------------------------------


@cli.command()
@click.argument("resource", metavar="jobs|rules|nodes")
@click.argument("names", nargs=-1)
@_namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@click.option("-o", "--output", type=click.Choice(["wide", "yaml", "json", "name"]),
              help="wide: more columns; yaml/json: the manifests with their status; name: kind/name only.")
@target_options
@click.pass_context
def get(ctx: click.Context, resource: str, names: tuple[str, ...], namespace: str, all_namespaces: bool,
        output: str | None) -> int:
    """List jobs (Kruise's columns), rules or registered nodes; or show the named ones."""
    kind = _resource(resource, ("jobs", "rules", "nodes"), "get")
    if all_namespaces and names:
        raise click.UsageError("a job cannot be retrieved by name across all namespaces: use -n instead of -A")
    from prewarm_local import cli_output

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
        text = cli_output.nodes_table(nodes, now=now, wide=output == "wide")
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


@cli.command()
@click.argument("resource", metavar="job")
@click.argument("name")
@_namespace_option
@target_options
@click.pass_context
def describe(ctx: click.Context, resource: str, name: str, namespace: str) -> int:
    """Show a job: spec, status, each node's pull and the excluded nodes (a list job: its ImagePullJobs)."""
    _resource(resource, ("jobs",), "describe")
    from prewarm.services.jobs import view_job
    from prewarm_local import cli_output

    now = time.time()
    view = view_job(current_store(ctx), namespace, name, now=now, with_tasks=True)
    click.echo(cli_output.describe_job(view, now=now))
    return EXIT_OK


# --- delete --------------------------------------------------------------------------------------


@cli.command()
@click.argument("resource", metavar="job|rule")
@click.argument("names", nargs=-1, required=True)
@_namespace_option
@target_options
@click.pass_context
def delete(ctx: click.Context, resource: str, names: tuple[str, ...], namespace: str) -> int:
    """Delete jobs (in-flight pulls are cancelled on their nodes) or rules."""
    kind = _resource(resource, ("jobs", "rules"), "delete")
    store = current_store(ctx)
    code = EXIT_OK
    if kind == "rules":
        for name in names:
            if store.delete_rule(name):
                click.echo(f'prewarmrule.prewarm.dev "{name}" deleted')
            else:
                click.echo(f'error: rule "{name}" not found', err=True)
                code = EXIT_FAILURE
        return code
    from prewarm.services.jobs import delete_job, job_key

    queues = current_target(ctx).queues()
    for name in names:
        record = store.get_job(job_key(namespace, name))
        if record is None:
            click.echo(f'error: job "{name}" not found in namespace "{namespace}"', err=True)
            code = EXIT_FAILURE
            continue
        cancelled = delete_job(store, queues, namespace, name)
        note = f" ({cancelled} in-flight pull{'s' if cancelled != 1 else ''} cancelled)" if cancelled else ""
        click.echo(f'{record.api_kind.lower()}.apps.kruise.io "{name}" deleted{note}')
    return code


# --- watch ---------------------------------------------------------------------------------------


def _completion_type(view: JobView) -> str:
    return str(view.record.spec.get("spec", {}).get("completionPolicy", {}).get("type", "Always"))


def watch_state(view: JobView) -> WatchState:
    """Node counts and bytes over the job's nodes (a list job's over all its ImagePullJobs)."""
    from prewarm_local.cli_output import WatchState

    parts = view.children if view.record.api_kind == "ImageListPullJob" else [view]
    sized = [t for p in parts for t in p.tasks if t.bytes_total]
    return WatchState(
        desired=sum(p.record.counters.desired for p in parts),
        waiting=sum(p.record.counters.waiting for p in parts),
        active=sum(p.record.counters.active for p in parts),
        succeeded=sum(p.record.counters.succeeded for p in parts),
        failed=sum(p.record.counters.failed for p in parts),
        bytes_done=sum(min(t.bytes_done or 0, t.bytes_total or 0) for t in sized),
        bytes_total=sum(t.bytes_total or 0 for t in sized),
    )


def _finished(view: JobView) -> bool:
    """Whether the job has nothing more to do: completed or failed (`Always`), or its round is done (`Never`)."""
    r = view.record
    if r.api_kind == "ImageListPullJob":
        return bool(view.children) and all(_finished(c) for c in view.children)
    if r.state in ("Completed", "Failed") or view.completion_time is not None:
        return True
    planned = r.planned == r.plan_id
    return _completion_type(view) == "Never" and planned and r.counters.waiting + r.counters.active == 0


def watch_outcome(view: JobView) -> tuple[int, str] | None:
    """The exit code and closing line once the job has finished, else None."""
    if not _finished(view):
        return None
    r = view.record
    state = watch_state(view)
    title = f"{r.api_kind} {r.key}"
    failed_states = [c.record for c in ([view, *view.children])
                     if c.record.state == "Failed" and c.record.message]
    if failed_states:
        return EXIT_FAILURE, f"{title} failed: {failed_states[0].message}"
    verb = "round done" if _completion_type(view) == "Never" else "completed"
    if state.failed:
        listed = ", ".join(view.failed_nodes)
        return EXIT_FAILURE, f"{title} {verb}: {state.failed} of {state.desired} nodes failed: {listed}"
    return EXIT_OK, f"{title} {verb}: {state.succeeded}/{state.desired} nodes succeeded"


@cli.command()
@click.argument("resource", metavar="job")
@click.argument("name")
@_namespace_option
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Give up after this long (exit 1). Default: wait until the job finishes.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="SECONDS",
              help="Time between reads of the job.")
@target_options
@click.pass_context
def watch(ctx: click.Context, resource: str, name: str, namespace: str, timeout: float | None,
          interval: float) -> int:
    """Follow a job until it finishes: exit 0 when every node succeeded, 1 when a node or the job failed.

    A `Never` job is followed until its current round has no pulling or waiting node.
    """
    _resource(resource, ("jobs",), "watch")
    from prewarm.services.jobs import JobNotFoundError, view_job
    from prewarm_local.cli_output import WatchDisplay

    store = current_store(ctx)
    deadline = None if timeout is None else time.monotonic() + timeout
    view = view_job(store, namespace, name, now=time.time(), with_tasks=True)
    with WatchDisplay(f"{view.record.api_kind} {namespace}/{name}") as display:
        while True:
            display.update(watch_state(view))
            outcome = watch_outcome(view)
            if outcome is not None:
                display.finish(outcome[1])
                return outcome[0]
            if deadline is not None and time.monotonic() >= deadline:
                display.finish()
                raise CommandError(f"timed out after {timeout:g}s waiting for job {namespace}/{name} to finish: "
                                   f"{watch_state(view).line()}")
            remaining = interval if deadline is None else min(interval, max(deadline - time.monotonic(), 0))
            time.sleep(remaining)
            try:
                view = view_job(store, namespace, name, now=time.time(), with_tasks=True)
            except JobNotFoundError:
                raise CommandError(f'job "{name}" in namespace "{namespace}" was deleted while watched') from None


# --- local mode ----------------------------------------------------------------------------------


@cli.group("local")
def local_group() -> None:
    """Run the whole of Prewarm on this machine (127.0.0.1 only) for `prewarm --local`.

    \b
    `up` starts a moto server with template.yaml deployed, the embedded Kubernetes API (or a real
    cluster), and one private containerd and agent per node (root, containerd and docker-registry
    needed; --no-agents runs the control plane alone). It records itself in the state file that
    `prewarm --local` reads, and runs until Ctrl-C or `prewarm local down`.
    """


def _running_local_stack() -> LocalState | None:
    """The state of a local stack whose process is alive, None when there is none."""
    path = local_state_path()
    if not path.exists():
        return None
    state = read_local_state(path)
    return state if state.running else None


@local_group.command("up")
@click.option("--nodes", type=click.IntRange(min=1), metavar="N",
              help="N synthetic nodes instead of the sample cluster (samplefiles/cluster.yaml).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Use this real cluster instead of the embedded Kubernetes API.")
@click.option("--no-agents", is_flag=True, help="Only the control plane: no containerd, registry or agents.")
@click.option("--stack-name", default="prewarm-local", show_default=True, help="Names the table and queues.")
def local_up(nodes: int | None, kubeconfig: str | None, no_agents: bool, stack_name: str) -> int:
    """Start a local stack and keep it running until Ctrl-C or `prewarm local down`."""
    from prewarm_local.local_mode import LocalMode, LocalModeUnavailableError

    running = _running_local_stack()
    if running is not None:
        raise CommandError(f"a local stack is already running (pid {running.pid}, {running.endpoint_url}); "
                           "stop it with `prewarm local down`")
    mode = LocalMode(nodes=nodes, kubeconfig=kubeconfig, agents=not no_agents, stack_name=stack_name)
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        try:
            mode.start()
        except LocalModeUnavailableError as e:
            raise CommandError(str(e)) from e
        assert mode.stack is not None
        env = mode.stack.env()
        click.echo(f"local stack up (pid {os.getpid()}): AWS at {mode.stack.endpoint_url}, "
                   f"table {env.get('TABLE_NAME')}")
        if mode.kube is not None:
            click.echo(f"Kubernetes API at {mode.kube.url}")
        click.echo(f"nodes with an agent: {', '.join(sorted(mode.nodes)) or 'none'}")
        click.echo(f"state in {local_state_path()}; try `prewarm --local get jobs`; Ctrl-C or "
                   "`prewarm local down` stops it")
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        click.echo("", err=True)  # after the terminal's ^C
    finally:
        mode.stop()
        signal.signal(signal.SIGTERM, previous)
    click.echo("local stack stopped")
    return EXIT_OK


@local_group.command("down")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the stack to stop.")
def local_down(timeout: float) -> int:
    """Stop the running local stack (SIGTERM to its process, then wait for it)."""
    path = local_state_path()
    state = read_local_state(path)
    if state.pid is None or not process_alive(state.pid):
        clear_local_state(path)
        click.echo(f"no local stack was running; removed its stale state {path}")
        return EXIT_OK
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(state.pid) and path.exists():
        if time.monotonic() >= deadline:
            raise CommandError(f"the local stack (pid {state.pid}) did not stop within {timeout:g}s")
        time.sleep(0.1)
    click.echo(f"local stack (pid {state.pid}) stopped")
    return EXIT_OK


@local_group.command("status")
def local_status() -> int:
    """Say whether a local stack is running, where, and what it is made of (exit 1 when none is)."""
    path = local_state_path()
    state = read_local_state(path)
    alive = state.running
    pairs = [("state", str(path)), ("running", "yes" if alive else f"no (pid {state.pid} has exited)"),
             ("pid", str(state.pid or "<unknown>")), ("endpoint", state.endpoint_url), ("region", state.region)]
    pairs += [(k, state.env[k]) for k in ("TABLE_NAME", "STATUS_QUEUE_URL", "NODE_QUEUE_PREFIX") if k in state.env]
    width = max(len(k) for k, _ in pairs) + 2
    click.echo("\n".join(f"{(k + ':').ljust(width)}{v}" for k, v in pairs))
    return EXIT_OK if alive else EXIT_FAILURE


@local_group.command("push")
@click.argument("image", metavar="REPOSITORY[:TAG]")
@click.option("--size-mb", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Size of the image's layer (random, incompressible data).")
def local_push(image: str, size_mb: float) -> int:
    """Build a test image, push it to the local registry that plays ECR, and emit ECR's PUSH event.

    \b
    REPOSITORY is an ECR repository name (`platform/web`), or the full local ECR reference
    (`123456789012.dkr.ecr.us-west-2.amazonaws.com/platform/web:v2`). Without TAG the push is
    untagged, as a digest-only push to ECR is. Rules that match create their jobs in the running stack.
    """
    from prewarm_local.local_mode import ecr_host, push_to_local_ecr

    state = _running_local_stack()
    if state is None:
        raise CommandError("no local stack is running: start one with `prewarm local up`")
    registry, bus = state.env.get("LOCAL_REGISTRY_URL"), state.env.get("LOCAL_EVENT_BUS_URL")
    if not registry or not bus:
        raise CommandError("the running local stack has no registry (started with --no-agents?): nothing to push to")
    repository, _, tag = image.removeprefix(ecr_host() + "/").partition(":")
    if not repository or "@" in image:
        raise click.UsageError(f"IMAGE {image!r}: give REPOSITORY[:TAG], e.g. platform/web:v2")
    target = local_target(state)
    pushed, event = push_to_local_ecr(registry, target.client("ecr"), repository, tag or None, size_mb=size_mb)
    target.client("sqs").send_message(QueueUrl=bus, MessageBody=json.dumps(event))
    click.echo(f"pushed {pushed.reference} ({pushed.size_bytes:,} bytes); ECR PUSH event sent")
    return EXIT_OK


@cli.command()
@click.option("--nodes", type=click.IntRange(min=0), default=3, show_default=True, metavar="N",
              help="Synthetic nodes, each with its own containerd and agent (0: the sample cluster).")
@click.option("--image-mb", type=click.FloatRange(min=0, min_open=True), default=50.0, show_default=True,
              help="Size of the pushed demo image.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: the last line on stdout is one JSON report.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="SECONDS",
              help="How long the pre-warm may take.")
@click.option("--keep", is_flag=True, help="Leave local mode running afterwards (Ctrl-C stops it).")
def demo(nodes: int, image_mb: float, output: str, timeout: float, keep: bool) -> int:
    """Local mode end to end: rules, a push to the local ECR, live progress, pulls verified through CRI.

    Exit 0 only when every eligible node has the image.
    """
    from prewarm_local.demo import DemoFailedError, run_demo
    from prewarm_local.local_mode import LocalModeUnavailableError

    try:
        result = run_demo(nodes=nodes or None, image_mb=image_mb, output=output, keep=keep, timeout=timeout)
    except (LocalModeUnavailableError, DemoFailedError) as e:
        raise CommandError(str(e)) from e
    return EXIT_OK if result.ok else EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> None:
    """The `prewarm` console script."""
    cli.main(args=argv, prog_name="prewarm")
