"""What the agent knows of its node's tasks, under one lock.

The consumer starts runs and answers redeliveries from it, each run's thread records its outcome, the
heartbeat keeps the runs' messages invisible, the image check watches what succeeded, and `stop()`
lists what still runs. The lock is the one `stop()` takes, so no run starts unseen while it drains.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from prewarm.domain.messages import PullTask, StatusReport
from prewarm_agent.pulls import TaskRun

# Outcomes remembered per (job_uid, round), so a redelivered task is answered without a second pull.
OUTCOMES_KEPT = 4096
# Succeeded pulls watched for garbage collection (the newest; a node holds far fewer images).
KEPT_IMAGES = 1024

TaskKey = tuple[str, int]
# Starts a daemon thread named for the agent's node (`Agent._spawn`).
Spawn = Callable[[Callable[[], None], str], threading.Thread]


class NodeTasks:
    """The runs in flight and their threads, the outcomes of finished tasks, and the succeeded ones watched.

    Read and change the collections with `lock` held.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[TaskKey, TaskRun] = {}
        self.threads: dict[TaskKey, threading.Thread] = {}
        self.outcomes: OrderedDict[TaskKey, StatusReport] = OrderedDict()
        # Tasks whose pull succeeded, watched in case the image disappears (docs/agent.md, "Garbage
        # collection"); and those reported gone, whose task, when it comes again, pulls again.
        self.kept: OrderedDict[TaskKey, PullTask] = OrderedDict()
        self.reported_gone: set[TaskKey] = set()

    def remember(self, key: TaskKey, report: StatusReport) -> None:
        """Records a task's outcome (with `lock` held), forgetting the oldest beyond `OUTCOMES_KEPT`."""
        self.outcomes[key] = report
        self.outcomes.move_to_end(key)
        while len(self.outcomes) > OUTCOMES_KEPT:
            self.outcomes.popitem(last=False)

    def keep(self, key: TaskKey, task: PullTask) -> None:
        """Watches a succeeded task's image (with `lock` held), forgetting the oldest beyond `KEPT_IMAGES`."""
        self.kept[key] = task
        self.kept.move_to_end(key)
        while len(self.kept) > KEPT_IMAGES:
            self.kept.popitem(last=False)

    def current_runs(self) -> list[TaskRun]:
        with self.lock:
            return list(self.runs.values())

    def current_threads(self) -> list[threading.Thread]:
        with self.lock:
            return list(self.threads.values())
