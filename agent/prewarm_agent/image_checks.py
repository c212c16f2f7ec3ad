"""Images that disappear after their pull succeeded (docs/agent.md, "Garbage collection"): checked every
`image_check_interval_seconds` and reported gone, so the control plane pulls them again or marks the node."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from prewarm.adapters.sqs import QueueError
from prewarm.domain.messages import ImageGone
from prewarm_agent.attempts import DiskCheck
from prewarm_agent.clock import Clock
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import CriError
from prewarm_agent.logs import NodeLogger
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.reporting import StatusSink
from prewarm_agent.tasks import NodeTasks


class NodeImages(Protocol):
    """The CRI calls an image check needs (`CriImageClient` has them)."""

    def list_images(self) -> Sequence[ImageInfo]: ...

    def image_status(self, image: str) -> ImageInfo | None: ...


class ImageChecks:
    """Compares the images of succeeded tasks with what containerd holds."""

    def __init__(self, images: NodeImages, *, interval: float, tasks: NodeTasks, disk: DiskCheck, status: StatusSink,
                 metrics: AgentMetrics, clock: Clock, stop: threading.Event, logger: NodeLogger) -> None:
        self.images = images
        self.interval = interval
        self.tasks = tasks
        self.disk = disk
        self.status = status
        self.metrics = metrics
        self.clock = clock
        self._stop = stop
        self.log = logger

    def watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:
                self.log.exception("image check failed")

    def check(self) -> list[ImageGone]:
        """One ListImages: report each image a task pulled here (Succeeded) that is no longer on the node,
        with the disk guard's verdict, so the control plane pulls it again or marks the node."""
        with self.tasks.lock:
            kept = list(self.tasks.kept.items())
        if not kept:
            return []
        try:
            present = {name for image in self.images.list_images() for name in (*image.repo_tags, *image.repo_digests)}
        except CriError as e:
            self.log.warning("image check skipped: containerd did not list its images: %s", e)
            return []
        gone = []
        for key, task in kept:
            if task.image in present or self._still_there(task.image):
                continue
            disk = self.disk.check(task.size_bytes) or ""
            message = ImageGone(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node,
                                image=task.image, seen_at=self.clock.time(), disk=disk)
            try:
                self.status.send(message)
            except QueueError as e:
                self.log.warning("gone image not reported, trying again at the next check: %s", e)
                continue
            with self.tasks.lock:
                self.tasks.kept.pop(key, None)
                self.tasks.reported_gone.add(key)
            self.metrics.images_gone.inc()
            self.log.warning("image removed from the node since it was pulled (image garbage collection?)%s",
                             f"; not enough room to pull it again: {disk}" if disk else "",
                             extra={"job": task.job, "image": task.image, "round": task.round})
            gone.append(message)
        return gone

    def _still_there(self, image: str) -> bool:
        """ListImages names images as containerd stored them; ask once more by the task's own reference."""
        try:
            return self.images.image_status(image) is not None
        except CriError:
            return True  # unknown: not reported as gone
