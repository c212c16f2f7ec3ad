"""Telling warming nodes which images they must have before their startup taint comes off.

A node whose agent said hello with `warm_until` holds the startup taint (docs/agent.md, "Startup
taint"). It gets a `RequiredImages` after that hello, and again whenever the set of `Never` jobs
changes while it warms (a job planned, re-planned or deleted), so a job applied meanwhile is waited
for and a deleted one is not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.job import StoredJob
from prewarm.domain.messages import Hello, RequiredImage, RequiredImages
from prewarm.domain.warming import NeverJob, required_images
from prewarm.services.ports import Cluster, ClusterError, TaskQueues, WarmingItems

log = logging.getLogger(__name__)


def running_never_jobs(store: WarmingItems, cluster: str = DEFAULT_CLUSTER) -> list[StoredJob]:
    """A cluster's running `Never` jobs: what a new node is added to and must be warm for (read through
    the store's index of them, not from every job stored)."""
    return [r for r in store.list_running_jobs(cluster) if r.is_running_never]


def agent_view(hello: Hello) -> dict[str, Any]:
    """The Node as its agent's hello tells of it (its labels, Ready), for when the cluster cannot say."""
    return {"metadata": {"name": hello.node, "labels": dict(hello.labels)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def jobs_selecting(
    records: Sequence[StoredJob], cluster: Cluster | None, node: Mapping[str, Any], *,
    pods_unread: dict[str, str] | None = None,
) -> tuple[list[StoredJob], list[RequiredImage]]:
    """Of the running `Never` jobs `records`, those that select `node` (a Node object), and the images
    they want there.

    Jobs with a `podSelector` need the cluster to see the node's pods: without one they select nothing.
    Given `pods_unread`, a cluster that fails to list them is written there (node → why) and its jobs with
    a `podSelector` select nothing; else its `ClusterError` is raised.
    """
    name = str(node.get("metadata", {}).get("name", ""))
    never: list[NeverJob] = []
    pods: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        job = record.pull_job
        if job.spec.pod_selector is not None:
            if cluster is None or name in (pods_unread or {}):
                continue
            try:
                pods[record.key] = cluster.list_pods(
                    record.namespace, label_selector=job.spec.pod_selector.to_query() or None,
                    field_selector=f"spec.nodeName={name}",
                )
            except ClusterError as e:
                if pods_unread is None:
                    raise
                log.warning("pods on node %s not read: its jobs that select by pods wait for a check: %s", name, e)
                pods_unread[name] = str(e)
                continue
        platforms = record.image_platforms()
        never.append(NeverJob(record.key, record.pull_reference, job.placement,
                              tuple(platforms) if platforms is not None else None))
    wanted = required_images(never, node, pods)
    keys = {w.job for w in wanted}
    return [r for r in records if r.key in keys], wanted


def warming_nodes(store: WarmingItems, *, now: float, cluster: str = DEFAULT_CLUSTER) -> list[str]:
    """A cluster's registered nodes whose agents hold the startup taint now (by their last hello)."""
    return [n.name for n in store.list_nodes(cluster) if n.warm_until is not None and n.warm_until > now]


def send_required_images(
    store: WarmingItems,
    queues: TaskQueues,
    cluster: Cluster | None,
    *,
    now: float,
    nodes: Iterable[str] | None = None,
    clock: Callable[[], float] = time.time,
    cluster_name: str = DEFAULT_CLUSTER,
) -> list[tuple[str, str]]:
    """Sends each warming node (of `nodes`, or all) of the cluster `cluster_name` (whose API `cluster` is)
    its list again; returns the (node, error) of failed sends.

    Called after the set of that cluster's `Never` jobs changed. A node the cluster no longer has is skipped.
    """
    names = warming_nodes(store, now=now, cluster=cluster_name)
    if nodes is not None:
        wanted = set(nodes)
        names = [n for n in names if n in wanted]
    if not names or cluster is None:
        return []
    messages = []
    # Read before the jobs are: a list computed from older jobs never replaces a newer one.
    as_of = clock()
    records = running_never_jobs(store, cluster_name)
    for name in names:
        node = cluster.get_node(name)
        if node is None:
            continue
        _, images = jobs_selecting(records, cluster, node)
        messages.append(RequiredImages(node=name, as_of=as_of, images=images, cluster=cluster_name))
    failures = queues.send_many(messages) if messages else []
    log.info("sent %d warming nodes their required images", len(messages) - len(failures))
    return failures
