"""`prewarm watch`: live progress of one job until it finishes; the exit code says how it ended."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from prewarm.services.jobs import JobView
    from prewarm_cli.output import WatchState

from prewarm_cli.cluster_choice import chosen, cluster_option
from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK, CommandError
from prewarm_cli.options import current_store, namespace_option, resource_name, target_options


def _image_bytes(view: JobView) -> tuple[int, int]:
    """Bytes pulled and to pull on one image's nodes: a node that has not said how big the image is yet
    (waiting, or just started) counts the size another node reported, so the total is the whole job's
    from the first report on, not the sum of the nodes heard from; failed nodes pull nothing more."""
    from prewarm.domain.messages import NodePhase
    from prewarm.domain.status import job_bytes

    done, total = job_bytes(view.tasks)
    size = max((t.bytes_total for t in view.tasks if t.bytes_total), default=0)
    for task in view.tasks:
        if size and not task.bytes_total and task.phase in (NodePhase.WAITING, NodePhase.PULLING,
                                                            NodePhase.SUCCEEDED):
            total += size
            done += size if task.phase is NodePhase.SUCCEEDED else 0
    return done, total


def watch_state(view: JobView) -> WatchState:
    """Node counts and bytes over the job's nodes (a list job's over all its ImagePullJobs), and how many of
    them wait out a registry's 429."""
    from prewarm.domain.messages import NodePhase
    from prewarm.domain.registry_budget import is_throttled_report
    from prewarm_cli.output import WatchState

    parts = view.children if view.record.is_list_job else [view]
    sizes = [_image_bytes(p) for p in parts]
    bytes_done, bytes_total = sum(d for d, _ in sizes), sum(t for _, t in sizes)
    return WatchState(
        desired=sum(p.record.counters.desired for p in parts),
        waiting=sum(p.record.counters.waiting for p in parts),
        active=sum(p.record.counters.active for p in parts),
        succeeded=sum(p.record.counters.succeeded for p in parts),
        failed=sum(p.record.counters.failed for p in parts),
        bytes_done=bytes_done,
        bytes_total=bytes_total,
        silent_agents=sum(p.silent_agents for p in parts),
        throttled=sum(t.round == p.record.round and t.phase is NodePhase.PULLING and is_throttled_report(t.message)
                      for p in parts for t in p.tasks),
        wave=", ".join(str(p.wave) for p in parts if p.wave),
        eta=_eta(parts),
    )


def _eta(parts: list[JobView]) -> str:
    """The longest time left of the job's images (a list job's), and what bounds it; "" when unknown."""
    known = [p.estimate for p in parts if p.estimate is not None and p.estimate.seconds and p.completion_time is None]
    return f"ETA {max(known, key=lambda e: e.seconds or 0).summary()}" if known else ""



def _finished(view: JobView) -> bool:
    """Whether the job has nothing more to do: completed or failed (`Always`), or its round is done (`Never`)."""
    if view.record.is_list_job:
        return bool(view.children) and all(_finished(c) for c in view.children)
    return view.completion_time is not None or view.record.has_finished_round()


def watch_outcome(view: JobView) -> tuple[int, str] | None:
    """The exit code and closing line once the job has finished, else None."""
    if not _finished(view):
        return None
    from prewarm.domain.jobs import CompletionType, JobState

    r = view.record
    state = watch_state(view)
    title = f"{r.api_kind} {r.key}"
    failed_states = [c.record for c in ([view, *view.children])
                     if c.record.state == JobState.FAILED and c.record.message]
    if failed_states:
        return EXIT_FAILURE, f"{title} failed: {failed_states[0].message}"
    verb = "round done" if r.completion_type is CompletionType.NEVER else "completed"
    if state.failed:
        listed = ", ".join(view.failed_nodes)
        return EXIT_FAILURE, f"{title} {verb}: {state.failed} of {state.desired} nodes failed: {listed}"
    return EXIT_OK, f"{title} {verb}: {state.succeeded}/{state.desired} nodes succeeded"


@click.command()
@click.argument("resource", metavar="job")
@click.argument("name")
@namespace_option
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Give up after this long (exit 1). Default: wait until the job finishes.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="SECONDS",
              help="Time between reads of the job.")
@cluster_option()
@target_options
@click.pass_context
def watch(ctx: click.Context, resource: str, name: str, namespace: str, timeout: float | None,
          interval: float, cluster: str | None) -> int:
    """Follow a job until it finishes: exit 0 when every node succeeded, 1 when a node or the job failed.

    A `Never` job is followed until its current round has no pulling or waiting node.
    """
    resource_name(resource, ("jobs",), "watch")
    from prewarm.services.jobs import JobNotFoundError, view_job
    from prewarm_cli.output import WatchDisplay

    store = current_store(ctx)
    where = chosen(ctx, cluster)
    deadline = None if timeout is None else time.monotonic() + timeout
    view = view_job(store, namespace, name, now=time.time(), with_tasks=True, cluster=where)
    title = f"{view.record.api_kind} {namespace}/{name}" + (f" in cluster {where}" if where else "")
    with WatchDisplay(title) as display:
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
                view = view_job(store, namespace, name, now=time.time(), with_tasks=True, cluster=where)
            except JobNotFoundError:
                raise CommandError(f'job "{name}" in namespace "{namespace}" was deleted while watched') from None


# --- local mode ----------------------------------------------------------------------------------

