"""Pull starts paced by each registry's budget: the node queues as every sender of tasks sees them.

`PacedQueues` wraps the node queues. Each call that sends `PullTask`s reserves their starts in their
registries' budgets (`prewarm.domain.registry_budget`), one write per registry however many tasks, and
gives each task the delay to its start, counted from the reservation and rounded down to whole seconds
(`send_delay`): the queue holds it back that long (SQS DelaySeconds, 15 minutes at most). A task whose
start would be further away than that is not reserved and not sent: its node stays claimed, and the
sweep's send of tasks never picked up (`TASK_RESEND_SECONDS` after the claim) tries it again, when the
budget may have a start for it within 15 minutes. Each start, or hold, is written on its node item
(`NodeTaskRecord.starts_at`, `held_at`; one transaction per 99 nodes): the sweep takes a task for not
picked up only `TASK_RESEND_SECONDS` after its start, and for silent counting from its start or last
hold; a task sent again (`StoredJob.resend_tasks`) keeps its start, held back to it and never reserved
twice. Rounded down,
the starts of a second come together at its beginning, so no instant starts more than one second of the
budget (and one pull), and a start less than a second away costs no latency; counted from the
reservation, a slow send only makes a start later. The slot stays claimed meanwhile, so `parallelism`
still bounds what a job has in flight, and every job and cluster of the stack draws on the same budget.
A pull's bytes are its task's `size_bytes`: one of unknown size takes none of a byte budget, so under a
byte budget alone (no request rate) it is sent at once, unreserved, with a warning. Other messages pass
through unchanged.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.job import JobRound
from prewarm.domain.messages import NodeBound, PullTask
from prewarm.domain.node_queues import ProvidedQueue
from prewarm.domain.registry_budget import MAX_SEND_DELAY_SECONDS, RegistryBudgets, budget_key, send_delay
from prewarm.services.dispatch import retry_refused_write
from prewarm.services.ports import BudgetItems, StoreError, TaskQueues

log = logging.getLogger(__name__)

Message = NodeBound


class PacedQueues:
    """`TaskQueues` whose pull tasks start no faster than their registry's budget allows."""

    def __init__(self, queues: TaskQueues, budgets: BudgetItems, settings: RegistryBudgets, *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.queues = queues
        self.budgets = budgets
        self.settings = settings
        self.clock = clock
        self.sleep = sleep

    def send(self, message: Message) -> bool:
        paced = self.paced([message])
        return self.queues.send(paced[0]) if paced else True  # held back: sent again later

    def send_many(self, messages: Sequence[Message]) -> list[tuple[str, str]]:
        return self.queues.send_many(self.paced(messages))

    def paced(self, messages: Sequence[Message]) -> list[Message]:
        """`messages` with each pull task's start reserved in its registry's budget, less the tasks the
        budget has no start for within SQS's longest delay (held back, logged). A budget that cannot be
        written leaves its tasks unpaced (logged): agents back off from a registry's 429 on their own. A
        task that costs none of its budget (a byte budget alone, the task's `size_bytes` unknown) is not
        reserved: it starts at once (logged)."""
        by_key: dict[str, list[tuple[int, PullTask]]] = {}
        unsized: dict[str, int] = {}
        paced: list[Message | None] = list(messages)
        now = self.clock()
        for i, message in enumerate(messages):
            if isinstance(message, PullTask) and message.reserved_start is not None:
                paced[i] = message.model_copy(update={"delay_seconds": send_delay(message.reserved_start - now)})
            elif isinstance(message, PullTask):
                try:
                    host = parse_image(message.image).registry
                except InvalidImageReference:
                    continue  # the agent fails it with the reason
                budget = self.settings.of(key := budget_key(host))
                if budget.pull_seconds(message.layers, message.size_bytes) > 0:
                    by_key.setdefault(key, []).append((i, message))
                elif budget.paces:  # a byte budget alone, and the task's size unknown
                    unsized[key] = unsized.get(key, 0) + 1
        for key, count in unsized.items():
            log.warning("registry budget of %s counts bytes only: %d pulls of unknown size start unpaced", key, count)
        for key, tasks in by_key.items():
            budget = self.settings.of(key)
            costs = [budget.pull_seconds(t.layers, t.size_bytes) for _, t in tasks]
            try:
                starts = self.budgets.reserve_pull_starts(key, costs, now=now, burst_seconds=budget.burst_seconds,
                                                          horizon=MAX_SEND_DELAY_SECONDS, budget=budget)
            except StoreError as e:
                log.warning("registry budget of %s not reserved, %d pulls start unpaced: %s", key, len(costs), e)
                continue
            for (i, task), start in zip(tasks, starts, strict=False):
                if delay := send_delay(start - now):
                    paced[i] = task.model_copy(update={"delay_seconds": delay})
            self._record_starts([(task, start) for (_, task), start in zip(tasks, starts, strict=False)]
                                + [(task, None) for _, task in tasks[len(starts):]], now=now)
            for i, _ in tasks[len(starts):]:
                paced[i] = None
            if starts:
                log.info("registry budget of %s: %d pulls start by %.1f s from now", key, len(starts), starts[-1] - now)
            if held := len(tasks) - len(starts):
                log.info("registry budget of %s: %d pulls held back, no start for them within %d s: sent again "
                         "by the sweep", key, held, MAX_SEND_DELAY_SECONDS)
        return [m for m in paced if m is not None]

    def _record_starts(self, reserved: Sequence[tuple[PullTask, float | None]], *, now: float) -> None:
        """Writes the starts (None: held back) on the tasks' node items, again after a backoff while the
        table refuses them for now (throttled); one still refused is logged: the sweep may then send its
        task again before its start, which reserves it again."""
        by_round: dict[JobRound, tuple[dict[str, float], list[str]]] = {}
        for task, start in reserved:
            starts, held = by_round.setdefault(JobRound(task.job, task.job_uid, task.round, task.shards), ({}, []))
            if start is None:
                held.append(task.node)
            else:
                starts[task.node] = start
        for ref, (starts, held) in by_round.items():
            try:
                retry_refused_write(functools.partial(self.budgets.record_pull_starts, ref, starts, held=held,
                                                      now=now), sleep=self.sleep)
            except StoreError as e:
                log.warning("pull starts of %d nodes of %s not recorded: %s", len(starts) + len(held), ref.key, e)

    # --- the rest of `TaskQueues`, unchanged ---------------------------------------------------

    def list_node_queues(self, cluster: str = DEFAULT_CLUSTER) -> dict[str, str]:
        return self.queues.list_node_queues(cluster)

    def owns_queue(self, url: str) -> bool:
        return self.queues.owns_queue(url)

    def queue_node(self, url: str) -> str | None:
        return self.queues.queue_node(url)

    def delete_queue(self, url: str) -> None:
        self.queues.delete_queue(url)

    def provide_queue(self, node: str, cluster: str | None = None) -> ProvidedQueue:
        return self.queues.provide_queue(node, cluster)

    def repair_queue(self, url: str) -> tuple[str, ...] | None:
        return self.queues.repair_queue(url)
