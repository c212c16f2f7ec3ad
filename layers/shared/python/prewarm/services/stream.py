"""The table stream's use cases, one per event: a job to plan, a job whose deletion was asked.

Each tells the warming nodes of its job's cluster what they must have now (a `Never` job's plan or
deletion changes it), so the dispatch function calls one use case per record and nothing more.
"""

from __future__ import annotations

import contextlib

from prewarm.domain.keys import JobKey
from prewarm.services.clusters import api_or_none
from prewarm.services.dispatch import PlanResult, plan_job
from prewarm.services.jobs import complete_deletion
from prewarm.services.ports import (
    AgentItems,
    ClusterConfigError,
    ClusterDirectory,
    ClusterError,
    PullSecretMirror,
    StoreError,
    TaskQueues,
    TaskSendError,
)
from prewarm.services.warming import send_required_images


def plan(store: AgentItems, queues: TaskQueues, clusters: ClusterDirectory, key: JobKey, *, now: float,
         secrets: PullSecretMirror | None = None) -> PlanResult:
    """Selects the nodes of job `key` in its cluster and sends the first tasks; after a `Never` job's
    plan, sends the warming nodes of its cluster their lists again. `TaskSendError` when a send failed.

    A registered cluster that cannot be reached does not fail the plan: the job says why it waits, and
    the sweep asks for its plan again once the cluster answers (a retry would hold up every later record
    of the stream's shard). The stack's own cluster failing raises: the stream retries the record.
    """
    try:
        api = clusters.api(key.cluster)
        result = plan_job(store, api, queues, key, now=now, secrets=secrets)
    except ClusterError as e:
        if not key.cluster:
            raise
        # plan_job says so on the job when the cluster did not answer; here too when it was not reached at all.
        if isinstance(e, ClusterConfigError):
            with contextlib.suppress(StoreError):
                store.set_job_fields(key, {"placement_note": f"cluster {key.cluster} cannot be reached: {e}"})
        return PlanResult(key, f"waiting for cluster {key.cluster}: {e}")
    if result.changes_warming:
        result.send_failures += send_required_images(store, queues, api, now=now, cluster_name=key.cluster)
    result.raise_for_send_failures()
    return result


def delete(store: AgentItems, queues: TaskQueues, clusters: ClusterDirectory, key: JobKey, *, now: float) -> int:
    """Cancels a deleted job's in-flight pulls and removes its items, then sends the warming nodes of its
    cluster their lists again (they no longer wait for its image). Returns the cancels sent;
    `TaskSendError` when a send failed (the stream retries the record, the items still there)."""
    cancels = complete_deletion(store, queues, key)
    failures = send_required_images(store, queues, api_or_none(clusters, key.cluster), now=now,
                                    cluster_name=key.cluster)
    if failures:
        raise TaskSendError(failures)
    return cancels
