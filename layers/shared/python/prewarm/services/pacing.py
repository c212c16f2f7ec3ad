"""Pull starts paced by each registry's budget: the node queues as every sender of tasks sees them.

`PacedQueues` wraps the node queues. Each call that sends `PullTask`s reserves their starts in their
registries' budgets (`prewarm.domain.registry_budget`), one write per registry however many tasks, and
gives each task the delay to its start, counted from the reservation and rounded down to whole seconds
(`send_delay`): the queue holds it back that long (SQS DelaySeconds, 15 minutes at most). Rounded down,
the starts of a second come together at its beginning, so no instant starts more than one second of the
budget (and one pull), and a start less than a second away costs no latency; counted from the
reservation, a slow send only makes a start later. The slot stays claimed meanwhile, so `parallelism`
still bounds what a job has in flight, and every job and cluster of the stack draws on the same budget.
Other messages pass through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.images import InvalidImageReference, parse_image
from prewarm.domain.messages import NodeBound, PullTask
from prewarm.domain.node_queues import ProvidedQueue
from prewarm.domain.registry_budget import RegistryBudgets, budget_key, send_delay
from prewarm.services.ports import BudgetItems, StoreError, TaskQueues

log = logging.getLogger(__name__)

Message = NodeBound


class PacedQueues:
    """`TaskQueues` whose pull tasks start no faster than their registry's budget allows."""

    def __init__(self, queues: TaskQueues, budgets: BudgetItems, settings: RegistryBudgets, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.queues = queues
        self.budgets = budgets
        self.settings = settings
        self.clock = clock

    def send(self, message: Message) -> bool:
        return self.queues.send(self.paced([message])[0])

    def send_many(self, messages: Sequence[Message]) -> list[tuple[str, str]]:
        return self.queues.send_many(self.paced(messages))

    def paced(self, messages: Sequence[Message]) -> list[Message]:
        """`messages` with each pull task's start reserved in its registry's budget. A budget that cannot
        be written leaves its tasks unpaced (logged): agents back off from a registry's 429 on their own."""
        by_key: dict[str, list[tuple[int, PullTask]]] = {}
        for i, message in enumerate(messages):
            if isinstance(message, PullTask):
                try:
                    host = parse_image(message.image).registry
                except InvalidImageReference:
                    continue  # the agent fails it with the reason
                if self.settings.of(key := budget_key(host)).enabled:
                    by_key.setdefault(key, []).append((i, message))
        paced = list(messages)
        now = self.clock()
        for key, tasks in by_key.items():
            budget = self.settings.of(key)
            costs = [budget.pull_seconds(t.layers, t.size_bytes) for _, t in tasks]
            try:
                starts = self.budgets.reserve_pull_starts(key, costs, now=now, burst_seconds=budget.burst_seconds)
            except StoreError as e:
                log.warning("registry budget of %s not reserved, %d pulls start unpaced: %s", key, len(costs), e)
                continue
            for (i, task), start in zip(tasks, starts, strict=True):
                if delay := send_delay(start - now):
                    paced[i] = task.model_copy(update={"delay_seconds": delay})
            log.info("registry budget of %s: %d pulls start by %.1f s from now", key, len(costs), starts[-1] - now)
        return paced

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
