"""Garbage-collection heal: an agent says an image it pulled is gone; pull it again or mark the node
(the rule is `prewarm.domain.healing`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prewarm.domain.healing import HealAction, heal_decision
from prewarm.domain.messages import ImageGone
from prewarm.domain.status import NodeUpdate
from prewarm.services.ports import PlanItems, TaskQueues, TaskSendError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GoneOutcome:
    node: str
    job: str
    action: HealAction
    reason: str


def record_gone(store: PlanItems, queues: TaskQueues, gone: ImageGone) -> GoneOutcome:
    """Applies an `ImageGone`: the node's message says what happened and, when its disk has room, its
    task is sent again. A conflicting write raises `StoreConflictError` and a failed send `TaskSendError`,
    so the message is delivered again (writing the same message twice is harmless)."""
    record = store.get_job(gone.job)
    if record is None or record.uid != gone.job_uid:
        return GoneOutcome(gone.node, gone.job, HealAction.IGNORE, "the job is gone or was recreated")
    never = record.is_running_never
    task = store.get_task(record.key, gone.node, shards=record.ref.shards) if never else None
    heal = heal_decision(task, never_running=never, job_round=record.round, gone_round=gone.round, disk=gone.disk,
                         seen_at=gone.seen_at)
    if heal.action is HealAction.IGNORE or task is None:
        return GoneOutcome(gone.node, gone.job, HealAction.IGNORE, heal.reason)
    store.update_task(record.ref, NodeUpdate(gone.node, task.version, heal.fields))
    if heal.action is HealAction.REPULL:
        failures = queues.send_many([record.pull_task(gone.node)])
        if failures:
            raise TaskSendError(failures)
    log.info("%s on %s in %s: %s", gone.image, gone.node, gone.job, heal.fields.get("message", heal.reason))
    return GoneOutcome(gone.node, gone.job, heal.action, heal.reason)
