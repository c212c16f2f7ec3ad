"""`prewarm local ...` and `prewarm demo`: local mode's commands, added to the `prewarm` CLI as a plugin."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import click

from prewarm_cli.targets import (
    LocalState,
    clear_local_state,
    local_state_path,
    local_target,
    process_alive,
    read_local_state,
)

if TYPE_CHECKING:
    pass

from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK, CommandError


@click.group("local")
def local() -> None:
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


@local.command("up")
@click.option("--nodes", type=click.IntRange(min=1), metavar="N",
              help="N synthetic nodes instead of the sample cluster (samplefiles/cluster.yaml).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Use this real cluster instead of the embedded Kubernetes API.")
@click.option("--no-agents", is_flag=True, help="Only the control plane: no containerd, registry or agents.")
@click.option("--stack-name", default="prewarm-local", show_default=True, help="Names the table and queues.")
def local_up(nodes: int | None, kubeconfig: str | None, no_agents: bool, stack_name: str) -> int:
    """Start a local stack and keep it running until Ctrl-C or `prewarm local down`."""
    from prewarm_devtools.localmode import LocalMode, LocalModeUnavailableError

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


@local.command("down")
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


@local.command("status")
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


@local.command("push")
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
    from prewarm_devtools.localmode import ecr_host, push_to_local_ecr

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


@click.command()
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
    from prewarm_devtools.demo import DemoFailedError, run_demo
    from prewarm_devtools.localmode import LocalModeUnavailableError

    try:
        result = run_demo(nodes=nodes or None, image_mb=image_mb, output=output, keep=keep, timeout=timeout)
    except (LocalModeUnavailableError, DemoFailedError) as e:
        raise CommandError(str(e)) from e
    return EXIT_OK if result.ok else EXIT_FAILURE

