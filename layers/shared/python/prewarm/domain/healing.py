"""Garbage-collection heal: what the control plane does when an agent says an image it pulled is gone.

kubelet's image garbage collection deletes unused images once the disk passes its high threshold
(85% by default); prewarmed images have no pods yet, so they go first. An agent that notices one of
its succeeded pulls missing sends `ImageGone`. Only a running `Never` job keeps its images on its
nodes, and only a node counted `Succeeded` in the job's current round holds one: such a node is
pulled again, unless its agent's disk guard says there is no room, in which case the node is marked
with why it was not (pulling again would only feed the garbage collector).

The node stays counted `Succeeded` for the round (the round did put the image there; the next daily
round pulls every node again) and its message says what happened. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prewarm.domain.kubernetes import format_time
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord


class HealAction(StrEnum):
    REPULL = "repull"  # write the node's message, send the task again
    MARK = "mark"  # write the node's message only: no room on the node
    IGNORE = "ignore"  # nothing holds this image on this node any more


@dataclass(frozen=True)
class Heal:
    action: HealAction
    reason: str
    fields: Mapping[str, Any] = field(default_factory=dict)  # node item fields to write


def gone_message(seen_at: float) -> str:
    return f"image removed from the node at {format_time(seen_at)} (image garbage collection?)"


def heal_decision(
    task: NodeTaskRecord | None, *, never_running: bool, job_round: int, gone_round: int, disk: str, seen_at: float
) -> Heal:
    """What to do about an image gone from `task`'s node (`task` None: the node is not in the job)."""
    if not never_running:
        return Heal(HealAction.IGNORE, "the job is not a running Never job: nothing keeps its image on nodes")
    if gone_round != job_round:
        return Heal(HealAction.IGNORE, f"round {gone_round} is over: round {job_round} pulls every node again")
    if task is None:
        return Heal(HealAction.IGNORE, "the node is not in the job any more")
    if task.round != gone_round or task.phase is not NodePhase.SUCCEEDED:
        return Heal(HealAction.IGNORE, f"the node is {task.phase} in round {task.round}: not counted as holding it")
    if disk:
        return Heal(HealAction.MARK, disk, {"message": f"{gone_message(seen_at)}; not pulled again: {disk}"})
    return Heal(HealAction.REPULL, "pulled again", {"message": f"{gone_message(seen_at)}; pulling it again"})
