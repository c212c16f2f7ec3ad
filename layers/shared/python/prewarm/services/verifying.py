"""Nodes registered unverified, checked again against their cluster.

A hello whose cluster could not be read (its API down, throttled or denying) is registered from the agent's
own facts (`services.reports.register_nodes`): its labels, taken as Ready, joined to the jobs those labels
select, but not to the jobs that select by pods, which only the cluster can say. The node item says so
(`RegisteredNode.unverified`). Once the cluster answers, the sweep's pass over it (`services.schedules`)
checks each such node: its Node is read, it joins every running `Never` job that selects it, and it is
marked verified, and its `PrewarmWarm` condition, which its hello could not set, is set
(`services.node_facts`). A node the cluster no longer has is left to the departures (`services.departures`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from prewarm.domain.clusters import scoped
from prewarm.services.budget import UNLIMITED, TimeBudget
from prewarm.services.dispatch import add_nodes_to_job, fill_slots
from prewarm.services.node_facts import FactItems, judge_nodes
from prewarm.services.ports import Cluster, NodeWarmWrites, PlanItems, StoreConflictError, TaskQueues, WarmingItems
from prewarm.services.warming import jobs_selecting, running_never_jobs

log = logging.getLogger(__name__)

# Nodes checked per cluster and run (one GET each, and a join when a job selects it); the next run goes on.
CHECKS_PER_RUN = 500


class UnverifiedItems(PlanItems, WarmingItems, FactItems, Protocol):
    """Jobs, their node items and registered nodes."""


class VerifyingCluster(Cluster, NodeWarmWrites, Protocol):
    """A cluster's Nodes and pods, read; its Nodes' condition, written."""


def verify_nodes(store: UnverifiedItems, queues: TaskQueues, cluster: VerifyingCluster, name: str, *, now: float,
                 budget: TimeBudget = UNLIMITED, limit: int = CHECKS_PER_RUN,
                 unverified: Sequence[str] | None = None) -> list[str]:
    """Checks cluster `name`'s unverified nodes against its API `cluster`, up to `limit` of them and while
    `budget` has time: each found joins the running `Never` jobs that select it, and is marked verified.
    Returns the nodes checked. A cluster that fails stops the check (the next pass tries again) and raises
    its `ClusterError`. `unverified`: their names, as the caller read the registrations (the sweep's listing:
    5,000 registrations are not read twice a run); read here when None."""
    if unverified is None:
        unverified = [n.name for n in store.list_nodes(name) if n.unverified]
    if not unverified:
        return []
    records = running_never_jobs(store, name)
    checked: list[str] = []
    for node_name in unverified[:limit]:
        if not budget.has_time():
            break
        seen = cluster.get_node(node_name)
        if seen is None:
            continue  # left the cluster: the departures forget it
        jobs, _ = jobs_selecting(records, cluster, seen)
        for record in jobs:
            try:
                if add_nodes_to_job(store, record, [node_name], now=now):
                    fill_slots(store, queues, record.key, now=now)
            except StoreConflictError as e:
                log.info("node %s not added to %s yet (the next pass tries again): %s", scoped(name, node_name),
                         record.key, e)
                break
        else:
            store.mark_node_verified(node_name, name)
            checked.append(node_name)
    judge_nodes(store, cluster, name, checked, now=now, every=True)
    return checked
