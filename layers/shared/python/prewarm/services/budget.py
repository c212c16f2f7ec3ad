"""A scheduled run's time: work the next run can do is not started when too little of this one is left.

The sweep runs every minute with a 55 s timeout (template.yaml). A Lambda function stopped at its timeout
is killed mid-call and its run is not recorded, so the sweep stops starting deletions and reads while
`reserve_seconds` remain, lets those in flight finish, records its run, and leaves the rest to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

# What a started task (one or two API calls of a few ms, their timeouts aside) and the run's last steps
# (pull secret clean-up, recording the run) need.
DEFAULT_RESERVE_SECONDS = 10.0
# Threads working on one run's tasks: the SQS client keeps 32 connections, the Kubernetes client 16.
DEFAULT_WORKERS = 16


@dataclass(frozen=True)
class TimeBudget:
    """`time_left()` is the seconds the run has left (Lambda's `get_remaining_time_in_millis` / 1000);
    None: no limit (tests, local runs)."""

    time_left: Callable[[], float] | None = None
    reserve_seconds: float = DEFAULT_RESERVE_SECONDS

    def has_time(self) -> bool:
        return self.time_left is None or self.time_left() > self.reserve_seconds


UNLIMITED = TimeBudget()


def run_within(budget: TimeBudget, tasks: Iterable[Callable[[], None]], *, workers: int = DEFAULT_WORKERS) -> int:
    """Runs `tasks`, at most `workers` at a time, starting each only while `budget` has time; returns how
    many were not started.

    A task that raises stops new ones from starting; the first error is raised once those in flight end.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    pending: set[Future[None]] = set()
    done: list[Future[None]] = []
    not_started = 0
    failed = False
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="budgeted") as pool:
        for task in tasks:
            if len(pending) >= workers:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                done += finished
                failed = failed or any(f.exception() is not None for f in finished)
            if not_started or failed or not budget.has_time():
                not_started += 1
                continue
            pending.add(pool.submit(task))
    for future in [*done, *pending]:
        future.result()  # the first error, now that nothing runs
    return not_started
