"""The consumer: long-polls the node's queue and handles each message.

A task starts a run on a thread of its own, joins the run already going, or is answered from the
outcome remembered; a cancel stops a run (or records one that has not come yet); a list of required
images goes to the startup taint's hold; a release unpins an image no job pins any more; anything
unreadable is left for the dead-letter queue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prewarm.adapters.sqs import QueueError, QueueGoneError
from prewarm.domain.messages import (
    CancelTask,
    MessageError,
    NodePhase,
    PullTask,
    ReleaseImage,
    RequiredImages,
    StatusReport,
    parse_node_message,
)
from prewarm_agent.clock import Clock
from prewarm_agent.cri.errors import CriError
from prewarm_agent.cri.pinning import ImageNotFoundError, ImagePins
from prewarm_agent.logs import NodeLogger
from prewarm_agent.metrics import AgentMetrics
from prewarm_agent.pulled import PullRecord
from prewarm_agent.pulls import Delivery, TaskRun
from prewarm_agent.queue import Received, TaskQueue
from prewarm_agent.reporting import Reports
from prewarm_agent.running import TaskRuns
from prewarm_agent.settings import AgentSettings
from prewarm_agent.tasks import NodeTasks, Spawn
from prewarm_agent.warming import StartupTaintHold


class Receiver:
    """Receives from the node queue until `stopping` is set, and dispatches each message."""

    def __init__(
        self,
        queue: TaskQueue,
        settings: AgentSettings,
        *,
        stopping: threading.Event,
        tasks: NodeTasks,
        task_runs: TaskRuns,
        reports: Reports,
        hold: Callable[[], StartupTaintHold | None],
        metrics: AgentMetrics,
        clock: Clock,
        spawn: Spawn,
        recreate: Callable[[], str | None],
        logger: NodeLogger,
        record: PullRecord,
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.stopping = stopping
        self.tasks = tasks
        self.task_runs = task_runs
        self.reports = reports
        self.hold = hold
        self.metrics = metrics
        self.clock = clock
        self.spawn = spawn
        # Waits for the control plane to make the node queue again (saying hello); None when stopping.
        self.recreate = recreate
        self.log = logger
        self.record = record

    def consume(self) -> None:
        pause = 1.0
        while not self.stopping.is_set():
            try:
                received = self.queue.receive(
                    wait_seconds=self.settings.receive_wait_seconds,
                    visibility_seconds=self.settings.node_queue_visibility_seconds,
                )
            except QueueGoneError as e:
                # Deleted under the agent (by hand, or a sweep that took the node for departed): without
                # its queue the node gets no task; the agent says hello, and the control plane makes it again.
                self.log.warning("the node queue is gone (%s); waiting for the control plane to make it again", e)
                if (url := self.recreate()) is None:
                    return  # stopping
                self.queue.url = url
                self.log.info("node queue made again: %s", url, extra={"queue_url": url})
                continue
            except QueueError as e:
                self.log.warning("receiving from the node queue failed, retrying in %gs: %s", pause, e)
                self.stopping.wait(pause)
                pause = min(pause * 2, 30.0)
                continue
            pause = 1.0
            for message in received:
                if self.stopping.is_set():
                    self.reports.release([message.delivery])
                    continue
                try:
                    self._handle(message)
                except Exception:
                    # One bad message must not stop the node; it comes back after its visibility timeout.
                    self.log.exception("message %s could not be handled", message.delivery.message_id,
                                       extra={"message_id": message.delivery.message_id})

    def _handle(self, message: Received) -> None:
        delivery = message.delivery
        try:
            parsed = parse_node_message(message.body)
        except MessageError as e:
            self._poison(message, str(e))
            return
        if parsed.node != self.settings.node_name:
            self._poison(message, f"message for node {parsed.node!r} on the queue of {self.settings.node_name!r}")
            return
        if isinstance(parsed, CancelTask):
            self._cancel(parsed, delivery)
        elif isinstance(parsed, RequiredImages):
            self._required(parsed, delivery)
        elif isinstance(parsed, ReleaseImage):
            self._release(parsed, delivery)
        else:
            self._task(parsed, delivery)

    def _required(self, required: RequiredImages, delivery: Delivery) -> None:
        self.metrics.messages.labels("required").inc()
        hold = self.hold()
        if hold is None or hold.done.is_set():
            self.log.info("list of %d required images ignored: the node holds no startup taint",
                          len(required.images))
        elif hold.offer(required):
            self.log.info("node must have %d images before its startup taint comes off: %s", len(required.images),
                          ", ".join(sorted({i.image for i in required.images})) or "none")
        else:
            self.log.info("an older list of required images ignored")
        self.reports.delete([delivery])

    def _release(self, release: ReleaseImage, delivery: Delivery) -> None:
        """No live job wants the image as the released job did: its pin comes off, and it is due for removal
        when the message says (the removal loop, `removals`, removes it if the agent pulled it). containerd
        unreachable: the message stays, and comes back after its visibility timeout."""
        self.metrics.messages.labels("release").inc()
        context = {"job": release.job, "image": release.image}
        with self.tasks.lock:  # no longer watched for garbage collection: its job is gone
            for key in [k for k, t in self.tasks.kept.items() if t.job == release.job and t.image == release.image]:
                self.tasks.kept.pop(key)
        if release.unpin:
            try:
                with ImagePins(self.settings.cri_socket) as pins:
                    records = pins.unpin(release.image)
            except ImageNotFoundError:
                self.log.info("image released by the job is no longer on the node", extra=context)
            except CriError as e:
                self.log.warning("image released by the job not unpinned yet: %s", e, extra=context)
                return
            else:
                self.log.info("image unpinned (%d records): no live job pins it here", len(records), extra=context)
        if release.remove_after is not None:
            due = self.record.release(release.image, self.clock.time() + release.remove_after)
            if due is None:
                self.log.info("image released by the job stays: the agent did not pull it", extra=context)
            else:
                self.log.info("image due for removal in %ds unless wanted again", release.remove_after, extra=context)
        self.reports.delete([delivery])

    def _poison(self, message: Received, reason: str) -> None:
        # Never deleted: after maxReceiveCount receives SQS moves it to the dead-letter queue.
        self.metrics.messages.labels("poison").inc()
        self.log.error(
            "poison message %s (received %d times) left for the dead-letter queue: %s",
            message.delivery.message_id, message.receive_count, reason,
            extra={"message_id": message.delivery.message_id},
        )

    def _first_seq(self) -> int:
        """Milliseconds since the epoch: above every `seq` an earlier agent on this node sent."""
        return int(self.clock.time() * 1000)

    def _task(self, task: PullTask, delivery: Delivery) -> None:
        key = (task.job_uid, task.round)
        context = {"job": task.job, "image": task.image, "round": task.round}
        finished: StatusReport | None = None
        tasks = self.tasks
        with tasks.lock:
            run = tasks.runs.get(key)
            if self.stopping.is_set() and run is None:
                # Checked under the lock `stop()` takes to list the runs, so no run starts unseen.
                kind = "released"
            elif run is not None:
                run.deliveries.append(delivery)
                kind = "duplicate"
            elif key in tasks.reported_gone:
                tasks.reported_gone.discard(key)
                again = TaskRun(task, delivery, after=tasks.outcomes.pop(key, None), first_seq=self._first_seq())
                tasks.runs[key] = again
                tasks.threads[key] = self.spawn(lambda: self.task_runs.run(again), f"pull-{task.job_uid[:8]}")
                kind = "again"
            elif key in tasks.outcomes:
                finished = tasks.outcomes[key]
                kind = "finished"
            else:
                run = TaskRun(task, delivery, first_seq=self._first_seq())
                tasks.runs[key] = run
                tasks.threads[key] = self.spawn(lambda: self.task_runs.run(run), f"pull-{task.job_uid[:8]}")
                kind = "task"
        if kind == "released":
            self.reports.release([delivery])
            return
        self.metrics.messages.labels(kind).inc()
        if kind == "duplicate":
            self.log.info("task already running here; the duplicate joins it", extra=context)
        elif finished is not None:
            self.log.info("task already finished here (%s); reporting it again", finished.phase, extra=context)
            if self.reports.send(finished):
                self.reports.delete([delivery])
        elif kind == "again":
            self.log.info("task received again after its image was removed: pulling it again", extra=context)
        else:
            self.log.info("task received (%s)", task.image_pull_policy, extra=context)

    def _cancel(self, cancel: CancelTask, delivery: Delivery) -> None:
        key = (cancel.job_uid, cancel.round)
        reason = cancel.reason or "cancelled by the control plane"
        context = {"job": cancel.job, "round": cancel.round}
        unknown: StatusReport | None = None
        tasks = self.tasks
        with tasks.lock:
            tasks.kept.pop(key, None)
            tasks.reported_gone.discard(key)
            run = tasks.runs.get(key)
            mismatched = run is not None and run.task.job != cancel.job
            if mismatched:
                run = None
            elif run is None and key not in tasks.outcomes:
                # The task may still be on its way (SQS does not keep order): it will not run.
                unknown = StatusReport(job=cancel.job, job_uid=cancel.job_uid, round=cancel.round, node=cancel.node,
                                       phase=NodePhase.CANCELLED, attempt=0, seq=1, message=reason,
                                       finished_at=self.clock.time())
                tasks.remember(key, unknown)
        self.metrics.messages.labels("cancel").inc()
        if mismatched:
            self.log.warning("cancel names job %s but uid %s runs another job here; ignored", cancel.job,
                             cancel.job_uid, extra=context)
        elif run is not None:
            self.log.info("cancelling the pull: %s", reason, extra=context)
            run.cancel(reason)
        elif unknown is not None:
            self.log.info("cancel for a task not seen here; it is recorded as Cancelled", extra=context)
            self.reports.send(unknown)
        self.reports.delete([delivery])
