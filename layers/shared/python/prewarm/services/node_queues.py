"""Node queues are the control plane's: made on a hello its cluster's API vouches for, and set back to the
stack's attributes wherever they are found otherwise.

No agent may create or change a queue (docs/operations.md, "Trust boundaries"): an agent that starts says
hello and waits for its queue. `provide_queues` makes it (or sets a queue found there back to the stack's
policy, attributes and tags) for each node of a hello batch that its cluster's API shows; `repair_queues`
is the sweep's step that sets back any queue of the stack whose policy is not the stack's (a queue made by
hand, by an agent of an older version, or whose policy names the roles of a stack since recreated: every
send to such a queue is denied).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from prewarm.domain.clusters import scoped
from prewarm.services.budget import DEFAULT_WORKERS, UNLIMITED, TimeBudget, run_within
from prewarm.services.ports import NodeQueueError, TaskQueues

log = logging.getLogger(__name__)

# The sweep checks each queue once in this many runs (every queue every 10 minutes at one run a minute):
# reading 5,000 queues' attributes every minute would cost more than the departed nodes' clean-up.
REPAIR_SLOTS = 10


def provide_queues(queues: TaskQueues, nodes: Sequence[str], cluster: str, *,
                   workers: int = DEFAULT_WORKERS) -> tuple[set[str], dict[str, NodeQueueError]]:
    """Makes, or sets back to the stack's, the queue of each of `nodes` (of `cluster`, each shown by its
    API): (the nodes whose queue was just made or set back, so messages sent before may be lost; the
    nodes whose queue failed, with why)."""
    changed: set[str] = set()
    failed: dict[str, NodeQueueError] = {}
    lock = threading.Lock()

    def provide(node: str) -> None:
        try:
            queue = queues.provide_queue(node, cluster)
        except NodeQueueError as e:
            log.warning("the queue of node %s not made yet: %s", scoped(cluster, node), e)
            with lock:
                failed[node] = e
            return
        if queue.changed:
            with lock:
                changed.add(node)

    run_within(UNLIMITED, [partial(provide, n) for n in nodes], workers=workers)
    return changed, failed


@dataclass
class Repairs:
    """What the sweep's queue check did: the queues set back (name → what), those it could not read or set."""

    repaired: dict[str, tuple[str, ...]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    checked: int = 0


def due_this_run(name: str, run: int, slots: int = REPAIR_SLOTS) -> bool:
    """Whether the queue `name` is checked in run number `run` (each queue once in `slots` runs)."""
    return zlib.crc32(name.encode()) % slots == run % slots


def repair_queues(queues: TaskQueues, listed: Mapping[str, str], *, run: int, budget: TimeBudget = UNLIMITED,
                  slots: int = REPAIR_SLOTS, workers: int = DEFAULT_WORKERS,
                  due: Callable[[str, int, int], bool] = due_this_run) -> Repairs:
    """The sweep's step: of the listed node queues (name → URL) due in run `run`, sets back to the stack's
    attributes each one of this stack (by its tags) whose policy or attributes are not the stack's."""
    done = Repairs()
    lock = threading.Lock()

    def repair(name: str, url: str) -> None:
        try:
            what = queues.repair_queue(url)
        except NodeQueueError as e:
            log.warning("node queue %s not checked: %s", name, e)
            with lock:
                done.failed[name] = str(e)
            return
        with lock:
            done.checked += 1
            if what:
                done.repaired[name] = what

    chosen = sorted((n, u) for n, u in listed.items() if due(n, run, slots))
    not_started = run_within(budget, [partial(repair, n, u) for n, u in chosen], workers=workers)
    if not_started:
        log.info("%d node queues left unchecked: the run is short of time", not_started)
    return done
