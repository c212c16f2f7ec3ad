"""Letting go of what an ended job pinned: its nodes are sent `ReleaseImage` where no other live job
pins the same image (the rules are `prewarm.domain.lifecycle`'s).

Run where a job's items are about to go and its node items are still there to say which nodes have its
image: `complete_deletion` (the stream's delete, and the sweep's for deletions the stream left) and the
sweep's expiry of a finished job past its TTL.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from prewarm.domain.job import StoredJob
from prewarm.domain.lifecycle import NodeImage, holds_pin, images_on_nodes, releases
from prewarm.domain.messages import NodePhase
from prewarm.services.ports import PlanItems, TaskQueues, TaskSendError

log = logging.getLogger(__name__)


def release_pins(store: PlanItems, queues: TaskQueues, record: StoredJob) -> int:
    """Sends the nodes of `record` (a job ending) a `ReleaseImage` for its pinned image, where no other
    live pinned job of its cluster wants that image; returns how many. `TaskSendError` when a send failed
    (the caller keeps the job's items, so that a retry knows the nodes again)."""
    if not record.is_pull_job or not record.pull_job.pin or not record.shards:
        return 0
    tasks = store.get_tasks(record.key, shards=record.ref.shards)
    nodes = {t.node for t in tasks if t.phase is NodePhase.SUCCEEDED}
    if not nodes:
        return 0
    still_pinned: dict[str, list[NodeImage]] = defaultdict(list)
    for other in store.list_jobs():
        if other.key == record.key or other.cluster != record.cluster or not holds_pin(other) or not other.shards:
            continue
        for image in images_on_nodes(other, store.get_tasks(other.key, shards=other.ref.shards)):
            if image.node in nodes:
                still_pinned[image.node].append(image)
    messages = releases(record, tasks, still_pinned)
    failures = queues.send_many(messages) if messages else []
    if failures:
        raise TaskSendError(failures)
    if messages:
        log.info("job %s ended: %s released on %d of its %d nodes", record.key, record.pull_reference,
                 len(messages), len(nodes))
    return len(messages)
