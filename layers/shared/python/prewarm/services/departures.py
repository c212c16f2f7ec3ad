"""Nodes that left the cluster: the sweep deletes their queues and forgets their registrations.

What is read, and in which order, is what keeps a node that is joining from losing its queue:

1. the node queues and the registrations are listed first. A node's queue and its agent's hello come
   after its Node object, so one seen here whose node is missing from the list read next is of a node
   that had left;
2. the nodes are listed, as metadata only: 5,000 nodes' metadata is ~10 MB of JSON, their whole
   Nodes with 50 images each ~75 MB, several times that once parsed, every minute;
3. each departed node is read again just before its queue and registration go: EKS names a node by its
   IP, and a new node may take the name of one that left. A node found again keeps both.

Deletions run in a bounded pool and only while the run has time (`budget`); the rest is left to the
next run, which finds the same queues again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER, split_scoped
from prewarm.domain.messages import node_queue_name
from prewarm.services.budget import DEFAULT_WORKERS, UNLIMITED, TimeBudget, run_within
from prewarm.services.ports import ClusterError, NodeInventory, NodeItems, TaskQueues

log = logging.getLogger(__name__)


@dataclass
class Departures:
    queues_deleted: list[str] = field(default_factory=list)
    nodes_forgotten: list[str] = field(default_factory=list)
    # Missing from the list, found by the read before deletion (joined since, under a departed name): kept.
    nodes_returned: list[str] = field(default_factory=list)
    # Departed nodes left for the next run: out of time, or the read again failed.
    deferred: int = 0


@dataclass(frozen=True)
class Listing:
    """What the sweep read, in this order: the node queues (name → URL), the registered nodes (name → its
    agent's last hello), the nodes; and, of the registered nodes, those registered unverified (read with
    them: the sweep reads the registrations once a run)."""

    queues: Mapping[str, str]
    registered: Mapping[str, float]
    nodes: Iterable[Mapping[str, Any]]
    unverified: Sequence[str] = ()


def list_in_order(store: NodeItems, queues: TaskQueues, inventory: NodeInventory,
                  cluster: str = DEFAULT_CLUSTER) -> Listing:
    """The queues and registrations of `cluster` (whose API `inventory` is), then its nodes' metadata: see
    the module's docstring for why."""
    listed_queues = queues.list_node_queues(cluster)
    registrations = store.list_nodes(cluster)
    registered = {n.name: n.last_hello for n in registrations}
    unverified = tuple(n.name for n in registrations if n.unverified)
    return Listing(listed_queues, registered, inventory.list_node_metadata(), unverified)


def node_names(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str(n.get("metadata", {}).get("name") or "") for n in nodes} - {""}


def forget_departed_nodes(
    store: NodeItems,
    queues: TaskQueues,
    inventory: NodeInventory,
    listing: Listing,
    *,
    prefix: str,
    budget: TimeBudget = UNLIMITED,
    workers: int = DEFAULT_WORKERS,
    cluster: str = DEFAULT_CLUSTER,
) -> Departures:
    """Deletes the queue and registration of each node of `cluster` that `listing` shows gone, once a
    read of the node confirms it; returns what was done, sorted."""
    present = node_names(listing.nodes)
    wanted = {node_queue_name(prefix, n, cluster) for n in present}
    departed = sorted(set(listing.registered) - present)
    departed_set = set(departed)
    registered_by_queue = {node_queue_name(prefix, n, cluster): n for n in departed}
    candidates = sorted((name, url) for name, url in listing.queues.items() if name not in wanted)
    done = Departures()
    lock = threading.Lock()

    def record(kind: list[str], name: str) -> None:
        with lock:
            kind.append(name)

    def still_gone(node: str) -> bool:
        try:
            found = inventory.get_node_metadata(node)
        except ClusterError as e:
            log.warning("node %s looks departed but cannot be read again; kept for the next sweep: %s", node, e)
            with lock:
                done.deferred += 1
            return False
        if found is not None:
            log.info("node %s joined again since the node list was read: its queue and registration stay", node)
            record(done.nodes_returned, node)
        return found is None

    def forget_queue(name: str, url: str) -> None:
        tagged = queues.queue_node(url)
        if tagged is None:
            return  # another stack's queue under a longer prefix, or gone already
        owner, node = split_scoped(tagged)
        if node and owner != cluster:
            return  # another cluster's (its name only looks like this cluster's)
        node = node or registered_by_queue.get(name, "")
        if node and not still_gone(node):
            return
        queues.delete_queue(url)
        record(done.queues_deleted, name)
        if node in departed_set:
            store.delete_node(node, cluster)
            record(done.nodes_forgotten, node)

    def forget_registration(node: str) -> None:
        if still_gone(node):
            store.delete_node(node, cluster)
            record(done.nodes_forgotten, node)

    with_queue = {registered_by_queue[name] for name, _ in candidates if name in registered_by_queue}
    tasks: list[Callable[[], None]] = [partial(forget_queue, name, url) for name, url in candidates]
    tasks += [partial(forget_registration, node) for node in departed if node not in with_queue]
    not_started = run_within(budget, tasks, workers=workers)
    done.deferred += not_started
    if not_started:
        log.warning("%d departed nodes left to the next sweep: the run is short of time", not_started)
    for names in (done.queues_deleted, done.nodes_forgotten, done.nodes_returned):
        names.sort()
    return done
