"""Removing the images Prewarm pulled once no job wants them, and saying what Prewarm keeps on the node.

Every `interval` seconds, while the record (`pulled`) holds any image: one ListImages drops from it what is no
longer there (kubelet's garbage collection took it); each image due for removal (a `ReleaseImage` said when) is
checked just before (CRI `ListContainers`, then `prewarm.domain.lifecycle.removal_refusal`) and removed by its
id. And when the totals changed, a `Footprint` goes to the status queue with the removals and the bytes each
freed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from prewarm.adapters.sqs import QueueError
from prewarm.domain.lifecycle import RefusalKind, RemovalRefusal, removal_refusal
from prewarm.domain.messages import FOOTPRINT_REMOVED_MAX, Footprint, RemovedImage
from prewarm_agent.clock import Clock
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import CriError
from prewarm_agent.logs import NodeLogger
from prewarm_agent.pulled import PullRecord, RecordTotals
from prewarm_agent.reporting import StatusSink
from prewarm_agent.settings import AgentSettings
from prewarm_agent.tasks import NodeTasks


class NodeRuntime(Protocol):
    """The CRI calls removals need (`CriImageClient` has them)."""

    def list_images(self) -> Sequence[ImageInfo]: ...

    def images_in_use(self) -> set[str]: ...

    def remove_image(self, image: str) -> None: ...


class Removals:
    """The removal loop (`watch`), one pass of it (`run_once`)."""

    def __init__(self, runtime: NodeRuntime, record: PullRecord, settings: AgentSettings, *, tasks: NodeTasks,
                 status: StatusSink, clock: Clock, stop: threading.Event, logger: NodeLogger) -> None:
        self.runtime = runtime
        self.record = record
        self.settings = settings
        self.tasks = tasks
        self.status = status
        self.clock = clock
        self._stop = stop
        self.log = logger
        # An empty record says nothing: an idle node with nothing of Prewarm's sends no footprint.
        self._sent = RecordTotals(0, 0, 0)
        self._unsent: list[RemovedImage] = []
        self._refused: dict[str, str] = {}  # image id -> the refusal last logged, so each is logged once

    def watch(self) -> None:
        while not self._stop.wait(self.settings.removal_check_interval_seconds):
            try:
                self.run_once()
            except Exception:
                self.log.exception("image removal pass failed")

    def run_once(self) -> list[RemovedImage]:
        """One pass; returns the images it removed."""
        held = self.record.images()
        removed: list[RemovedImage] = []
        if held:  # a node with nothing of Prewarm's is not listed every pass
            try:
                present = {image.id: image for image in self.runtime.list_images()}
            except CriError as e:
                self.log.warning("image removals skipped: containerd did not list its images: %s", e)
                return []
            self.record.forget([i.image_id for i in held if i.image_id not in present])
            removed = self._remove_due(present)
            self._unsent += removed
        self._send_footprint()
        return removed

    def _remove_due(self, present: dict[str, ImageInfo]) -> list[RemovedImage]:
        due = self.record.due(self.clock.time())
        if not due:
            return []
        try:
            in_use = self.runtime.images_in_use()
        except CriError as e:  # never remove blind
            self.log.warning("image removals skipped: containerd did not list its containers: %s", e)
            return []
        with self.tasks.lock:
            wanted = {task.image for task in self.tasks.kept.values()}
        wanted |= {name for i in self.record.images() if i.remove_at is None for name in i.names}
        removed = []
        for entry in due:
            image = present[entry.image_id]
            names = (*image.repo_tags, *image.repo_digests)
            refusal = removal_refusal(names, image.id, pulled=entry.names, wanted=wanted, in_use=in_use)
            if refusal is not None:
                self._refuse(entry.image_id, names, refusal)
                continue
            try:
                self.runtime.remove_image(image.id)
            except CriError as e:
                self.log.warning("image %s not removed, tried again next pass: %s", image.id, e)
                continue
            self.record.forget([image.id], freed=image.size)
            self._refused.pop(image.id, None)
            removed.append(RemovedImage(image=names[0] if names else image.id, image_id=image.id,
                                        bytes_freed=image.size, removed_at=self.clock.time()))
            self.log.info("image removed: no job wants it (%d bytes freed)", image.size,
                          extra={"image": ", ".join(names) or image.id})
        return removed

    def _refuse(self, image_id: str, names: Sequence[str], refusal: RemovalRefusal) -> None:
        if self._refused.get(image_id) != refusal.reason:
            self.log.info("image due for removal kept: %s", refusal.reason,
                          extra={"image": ", ".join(names) or image_id})
            self._refused[image_id] = refusal.reason
        # In use: tried again each pass (the container may go). Someone else's too: no longer counted as
        # Prewarm's, never removed. Wanted again: its removal called off.
        if refusal.kind is RefusalKind.NOT_PULLED:
            self.record.forget([image_id])
        elif refusal.kind is RefusalKind.WANTED:
            self.record.wanted(tuple(names))

    def _send_footprint(self) -> None:
        totals = self.record.totals()
        if totals == self._sent and not self._unsent:
            return
        message = Footprint(node=self.settings.node_name, cluster=self.settings.cluster, at=self.clock.time(),
                            images=totals.images, bytes=totals.bytes, freed_bytes=totals.freed_bytes,
                            removed=self._unsent[:FOOTPRINT_REMOVED_MAX])
        try:
            self.status.send(message)
        except QueueError as e:
            self.log.warning("footprint not sent, trying again next pass: %s", e)
            return
        self._sent = totals
        del self._unsent[:FOOTPRINT_REMOVED_MAX]
