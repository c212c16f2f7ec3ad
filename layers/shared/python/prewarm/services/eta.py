"""A job's ETA (`prewarm.domain.eta`) from its node items and its registry budget's reservations, and the
first one of a round, kept on the job item so that `describe` can set it against the outcome."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

from prewarm.domain.eta import BudgetShare, Estimate, estimate
from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.job import StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.registry_budget import budget_key
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.ports import BudgetItems, JobItems, NodeTaskItems, StoreConflictError

log = logging.getLogger(__name__)


class EtaItems(JobItems, NodeTaskItems, BudgetItems, Protocol):
    """A job, its nodes in flight and its registry's budget."""


def budget_share(store: BudgetItems, record: StoredJob, *, now: float, size_bytes: int | None) -> BudgetShare | None:
    """What the job's registry budget leaves it, from the budget's last reservation; None when its registry
    has no budget (or none was reserved yet: nothing paces it)."""
    try:
        host = parse_image(record.pull_job.spec.image).registry
    except InvalidImageReference:
        return None
    state = store.get_budget(budget_key(host))
    if state is None or not state.budget.paces:
        return None
    size_bytes = record.image_bytes or size_bytes  # the pull's compressed bytes, as the budget counted them
    return BudgetShare(
        pull_seconds=state.budget.pull_seconds(record.layers, size_bytes), backlog=max(0.0, state.tat - now),
        requests_per_second=state.budget.requests_per_second,
        requests=state.budget.pull_requests(record.layers),
        bytes_per_second=state.budget.bytes_per_second, size_bytes=size_bytes)


def job_estimate(store: BudgetItems, record: StoredJob, tasks: Sequence[NodeTaskRecord], *, now: float,
                 waiting: int | None = None) -> Estimate:
    """The ETA of the job's round from its node items `tasks` (`waiting`: how many wait for a slot, when
    `tasks` are only the nodes in flight)."""
    current = [t for t in tasks if t.round == record.round]
    size = max((t.bytes_total or 0 for t in current), default=0) or None
    return estimate(current, parallelism=record.pull_job.spec.parallelism, now=now, waiting=waiting,
                    budget=budget_share(store, record, now=now, size_bytes=size))


def first_estimate(record: StoredJob) -> Estimate | None:
    """The round's first estimate, kept on the job item (None before its first byte progress)."""
    return Estimate.from_item(json.loads(record.first_estimate)) if record.first_estimate else None


def keep_first_estimate(store: EtaItems, record: StoredJob, *, now: float) -> Estimate | None:
    """Once a round's nodes report byte progress: its estimate then, from the nodes in flight (as many as
    `parallelism`, not the whole fleet) and its waiting count, kept on the job item. Nothing when one is
    kept already; a job no longer running keeps none."""
    if record.first_estimate or not record.is_pull_job:
        return None
    flight = store.in_flight_tasks(record.ref)
    if not any(t.bytes_done for t in flight):
        return None
    found = job_estimate(store, record, flight, now=now, waiting=record.counters.waiting)
    if found.seconds is None:  # paused (parallelism 0): the first estimate with a figure is kept once it runs
        return None
    try:
        store.set_job_fields(record.key, {"first_estimate": json.dumps(found.to_item())},
                             condition_state=JobState.RUNNING)
    except StoreConflictError:
        log.info("job %s finished before its first estimate was kept", record.key)
        return None
    return found
