"""Letting go of what an ended job put on its nodes: its nodes are sent `ReleaseImage` (unpin, remove after
the grace period) where no other live job wants the same image (the rules are `prewarm.domain.lifecycle`'s).

Run where a job's node items are about to go and are still there to say which nodes have its image:
`complete_deletion` (the stream's delete, and the sweep's for deletions the stream left), the sweep's expiry
of a finished job past its TTL, the plan of a new round whose image changed (`release_earlier_round`),
whose node items replace the earlier round's, a plan whose selection dropped nodes
(`release_dropped_nodes`), a new spec that no longer pins its image (`release_pin`: unpin only), and the
reports of pulls that pinned after that (`unpin_late_pulls`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence

from prewarm.domain.images import parse_image
from prewarm.domain.job import StoredJob
from prewarm.domain.lifecycle import NodeImage, earlier_round_releases, images_on_nodes, releases, wants_images
from prewarm.domain.messages import Footprint, NodePhase, ReleaseImage
from prewarm.domain.nodes import NodeFootprint
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.ports import NodeItems, PlanItems, StoreConflictError, TaskQueues, TaskSendError

log = logging.getLogger(__name__)
# BatchGetItem reads at most 100 items a call: fewer nodes than that are read by key, more by their pages.
_BATCH_READ = 100


def release_images(store: PlanItems, queues: TaskQueues, record: StoredJob, *, remove_after: int | None) -> int:
    """Sends the nodes of `record` (a job ending) a `ReleaseImage` where no other live job of its cluster
    wants its image as it did (`remove_after`: the stack's grace period, None: nothing is removed); returns
    how many. `TaskSendError` when a send failed (the caller keeps the job's items, so that a retry knows
    the nodes again)."""
    if not record.is_pull_job or not record.shards or (remove_after is None and not _pins(record)):
        return 0
    tasks = store.get_tasks(record.key, shards=record.ref.shards)
    sent = _release_on(store, queues, record, tasks,
                       lambda wanted: releases(record, tasks, wanted, remove_after=remove_after))
    if sent:
        log.info("job %s: %s released on %d nodes", record.key, record.pull_reference, sent)
    return sent


def release_earlier_round(store: PlanItems, queues: TaskQueues, record: StoredJob, tasks: Iterable[NodeTaskRecord],
                          selected: Iterable[str], *, remove_after: int | None) -> int:
    """At the plan of a round whose image changed (`record.earlier`), before its node items replace the
    earlier round's `tasks`: sends the nodes where the earlier image was pulled a `ReleaseImage`, as at a
    deletion, where neither another live job nor this job's new image on its `selected` nodes wants it.
    Returns how many; `TaskSendError` when a send failed (the plan stops, its earlier items kept)."""
    earlier = record.earlier
    if earlier is None or (remove_after is None and not earlier.pinned):
        return 0
    tasks = [t for t in tasks if t.round <= earlier.round]
    sent = _release_on(store, queues, record, tasks, lambda wanted: earlier_round_releases(
        record, tasks, selected, wanted, remove_after=remove_after))
    if sent:
        log.info("job %s's image changed: %s released on %d nodes", record.key, earlier.reference, sent)
    return sent


def release_dropped_nodes(store: PlanItems, queues: TaskQueues, record: StoredJob, dropped: Iterable[NodeTaskRecord],
                          *, remove_after: int | None) -> int:
    """At a plan whose selection no longer holds some nodes of `record` (a changed selector or node names),
    before their node items go: sends the `dropped` nodes where its image was pulled a `ReleaseImage`, as
    at a deletion, where no other live job wants it. Returns how many; `TaskSendError` when a send failed
    (the plan stops, the dropped items kept for the retry)."""
    if remove_after is None and not _pins(record):
        return 0
    dropped = list(dropped)
    sent = _release_on(store, queues, record, dropped,
                       lambda wanted: releases(record, dropped, wanted, remove_after=remove_after))
    if sent:
        log.info("job %s no longer selects some nodes: its image released on %d", record.key, sent)
    return sent


def release_pin(store: PlanItems, queues: TaskQueues, before: StoredJob) -> int:
    """When a job's new spec stopped pinning its image (`domain.lifecycle.pin_dropped`; `before`: the job as it
    pinned): its nodes where the pull succeeded are told to unpin it, unless another live pinned job wants the
    image there, and to keep it (the job still wants it): `release_images` with nothing removed."""
    return release_images(store, queues, before, remove_after=None)


def unpin_late_pulls(store: PlanItems, queues: TaskQueues, record: StoredJob, nodes: Collection[str]) -> int:
    """`nodes` just reported `Succeeded` for a round of `record` whose tasks went out pinned before its pin
    was dropped (`pinned_until`): each pinned the image as its pull ended, so it is told to unpin it unless
    another live pinned job wants it there, and to keep it (the job still wants it). How many were told."""
    if record.pinned_until is None or not record.is_pull_job or record.pull_job.pin or not nodes:
        return 0
    tasks = [t for t in store.get_tasks_of(record.ref, nodes).values() if t.round <= record.pinned_until]
    sent = _release_on(store, queues, record, tasks, lambda wanted: releases(record, tasks, wanted))
    if sent:
        log.info("job %s: %s unpinned on %d nodes whose pinned pull ended after the pin was dropped",
                 record.key, record.pull_reference, sent)
    return sent


def _release_on(store: PlanItems, queues: TaskQueues, record: StoredJob, tasks: Sequence[NodeTaskRecord],
                messages_for: Callable[[dict[str, list[NodeImage]]], list[ReleaseImage]]) -> int:
    """Sends `messages_for(what the other live jobs want on the nodes of `tasks` where the pull succeeded)`;
    how many. Nothing is read when no pull succeeded."""
    nodes = {t.node for t in tasks if t.phase is NodePhase.SUCCEEDED}
    if not nodes:
        return 0
    messages = messages_for(_still_wanted(store, record, nodes))
    _send(queues, messages)
    return len(messages)


def _pins(record: StoredJob) -> bool:
    return record.pull_job.pin or record.pinned_until is not None or (
        record.earlier is not None and record.earlier.pinned)


def _send(queues: TaskQueues, messages: Sequence[ReleaseImage]) -> None:
    failures = queues.send_many(messages) if messages else []
    if failures:
        raise TaskSendError(failures)


def _still_wanted(store: PlanItems, record: StoredJob, nodes: Collection[str]) -> dict[str, list[NodeImage]]:
    """The images the other live jobs of `record`'s cluster want on `nodes`: the jobs of its repository,
    through the table's `images` index (not every job stored), and of each only its node items on `nodes`
    when they fit one batch read, else all of them in pages. The same image under the name of another
    repository is not looked for (the agent still never removes an image with a name it did not pull)."""
    references = [record.pull_reference] + ([record.earlier.reference] if record.earlier is not None else [])
    still_wanted: dict[str, list[NodeImage]] = defaultdict(list)
    for repository in sorted({parse_image(reference).name for reference in references}):
        for other in store.list_image_jobs(record.cluster, repository):
            if other.key == record.key or not wants_images(other) or not other.shards:
                continue
            if len(nodes) <= _BATCH_READ:
                tasks: Iterable[NodeTaskRecord] = store.get_tasks_of(other.ref, nodes).values()
            else:
                tasks = store.get_tasks(other.key, shards=other.ref.shards)
            for image in images_on_nodes(other, tasks):
                if image.node in nodes:
                    still_wanted[image.node].append(image)
    return still_wanted


def record_footprint(store: NodeItems, footprint: Footprint) -> bool:
    """Stores a node's `Footprint` (`prewarm describe node` shows it) and logs its removals; False when it
    changed nothing: older than the one stored (SQS keeps no order), or its node not registered (the agent's
    next footprint carries the same totals)."""
    for removed in footprint.removed:
        log.info("node %s removed %s (%s): %d bytes freed", footprint.node, removed.image, removed.image_id,
                 removed.bytes_freed)
    node = store.get_node(footprint.node, footprint.cluster)
    if node is None or (node.footprint is not None and node.footprint.at >= footprint.at):
        return False
    value = NodeFootprint(images=footprint.images, bytes=footprint.bytes, freed_bytes=footprint.freed_bytes,
                          at=footprint.at)
    try:
        store.record_footprint(footprint.node, value, footprint.cluster)
    except StoreConflictError:  # forgotten meanwhile: the node left
        return False
    return True
