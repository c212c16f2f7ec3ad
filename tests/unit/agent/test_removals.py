"""The agent's record of what it pulled survives a restart, and its removal loop removes only what it pulled,
that no container uses and no job wants, reporting the bytes freed and Prewarm's footprint."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from prewarm.domain.messages import Footprint, FromAgent, PullTask
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.logs import NodeLogger
from prewarm_agent.pulled import RECORD_FILE, PullRecord
from prewarm_agent.removals import Removals
from prewarm_agent.settings import AgentSettings
from prewarm_agent.tasks import NodeTasks
from tests.support.clock import T0, Clock

APP = ImageInfo(id="sha256:" + "a" * 64, repo_tags=("reg.io/app:v1",), repo_digests=("reg.io/app@sha256:1",),
                size=3_000)
OTHER = ImageInfo(id="sha256:" + "b" * 64, repo_tags=("reg.io/other:v1",), repo_digests=(), size=5_000)


class Runtime:
    """containerd as the removal loop sees it: its images, its containers' images, and removals."""

    def __init__(self, *images: ImageInfo) -> None:
        self.images = {i.id: i for i in images}
        self.in_use: set[str] = set()
        self.removed: list[str] = []
        self.listed = 0

    def list_images(self) -> list[ImageInfo]:
        self.listed += 1
        return list(self.images.values())

    def images_in_use(self) -> set[str]:
        return set(self.in_use)

    def remove_image(self, image: str) -> None:
        self.removed.append(image)
        self.images.pop(image, None)


class Status:
    def __init__(self) -> None:
        self.sent: list[FromAgent] = []

    def send(self, message: FromAgent) -> None:
        self.sent.append(message)


def removals(runtime: Runtime, record: PullRecord, clock: Clock, status: Status,
             tasks: NodeTasks | None = None) -> Removals:
    settings = AgentSettings.from_env({"NODE_NAME": "node-a", "NODE_QUEUE_PREFIX": "pw", "AWS_REGION": "us-west-2",
                                       "STATUS_QUEUE_URL": "http://sqs/q/status"})
    return Removals(runtime, record, settings, tasks=tasks or NodeTasks(), status=status, clock=clock,
                    stop=threading.Event(), logger=NodeLogger(logging.getLogger("test"), {}))


def pulled_app(record: PullRecord) -> None:
    record.pulled(APP.id, ("reg.io/app:v1", "reg.io/app@sha256:1"), APP.size, T0)


def test_the_record_survives_a_restart_and_an_unreadable_one_starts_afresh(tmp_path: Path) -> None:
    record = PullRecord(tmp_path)
    pulled_app(record)
    assert record.release("reg.io/app:v1", T0 + 60) is not None
    assert record.release("reg.io/other:v1", T0 + 60) is None  # not pulled by the agent: stays

    again = PullRecord(tmp_path)
    assert [(i.image_id, i.remove_at) for i in again.images()] == [(APP.id, T0 + 60)]
    assert again.totals().bytes == APP.size

    (tmp_path / RECORD_FILE).write_text("{not json", encoding="utf-8")
    assert PullRecord(tmp_path).images() == []


def test_a_released_image_is_removed_once_due_with_its_bytes_freed_reported() -> None:
    runtime, record, clock, status = Runtime(APP, OTHER), PullRecord(None), Clock(T0), Status()
    pulled_app(record)
    loop = removals(runtime, record, clock, status)
    record.release("reg.io/app:v1", T0 + 60)

    # Before its time nothing goes; the footprint says what Prewarm holds
    assert loop.run_once() == [] and runtime.removed == []
    (first,) = status.sent
    assert isinstance(first, Footprint) and (first.images, first.bytes, first.freed_bytes) == (1, APP.size, 0)

    clock.advance(61)
    (removed,) = loop.run_once()
    assert runtime.removed == [APP.id] and removed.bytes_freed == APP.size
    footprint = status.sent[-1]
    assert isinstance(footprint, Footprint) and footprint.removed == [removed]
    assert (footprint.images, footprint.bytes, footprint.freed_bytes) == (0, 0, APP.size)
    # ... and an unchanged record sends nothing more
    loop.run_once()
    assert len(status.sent) == 2


def test_an_image_a_container_uses_stays_until_the_container_is_gone() -> None:
    runtime, record, clock, status = Runtime(APP), PullRecord(None), Clock(T0), Status()
    pulled_app(record)
    record.release("reg.io/app:v1", T0)
    runtime.in_use = {APP.id}
    loop = removals(runtime, record, clock, status)

    assert loop.run_once() == [] and runtime.removed == []
    runtime.in_use = {"reg.io/app:v1"}  # named by the container's image spec rather than its id: the same
    assert loop.run_once() == []
    runtime.in_use = set()
    assert [r.image_id for r in loop.run_once()] == [APP.id]


def test_an_image_with_a_name_the_agent_did_not_pull_is_never_removed() -> None:
    tagged = ImageInfo(id=APP.id, repo_tags=(*APP.repo_tags, "reg.io/app:latest"), repo_digests=APP.repo_digests,
                       size=APP.size)
    runtime, record, clock, status = Runtime(tagged), PullRecord(None), Clock(T0), Status()
    pulled_app(record)
    record.release("reg.io/app:v1", T0)

    assert removals(runtime, record, clock, status).run_once() == []
    assert runtime.removed == [] and record.images() == []  # no longer counted as Prewarm's


def test_an_image_a_kept_task_still_wants_is_not_removed_and_its_removal_is_called_off() -> None:
    runtime, record, clock, status = Runtime(APP), PullRecord(None), Clock(T0), Status()
    pulled_app(record)
    record.release("reg.io/app:v1", T0)
    tasks = NodeTasks()
    tasks.keep(("uid", 0), PullTask(job="default/other", job_uid="uid", round=0, node="node-a",
                                     image="reg.io/app@sha256:1"))

    assert removals(runtime, record, clock, status, tasks).run_once() == []
    assert runtime.removed == [] and [i.remove_at for i in record.images()] == [None]


def test_an_image_gone_meanwhile_leaves_the_record() -> None:
    runtime, record, clock, status = Runtime(), PullRecord(None), Clock(T0), Status()
    pulled_app(record)
    removals(runtime, record, clock, status).run_once()
    assert record.images() == [] and record.totals().freed_bytes == 0


def test_a_pass_that_changes_nothing_does_not_rewrite_the_record(tmp_path: Path) -> None:
    runtime, record, clock, status = Runtime(APP), PullRecord(tmp_path), Clock(T0), Status()
    pulled_app(record)
    (tmp_path / RECORD_FILE).unlink()
    removals(runtime, record, clock, status).run_once()
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_node_with_nothing_of_prewarms_is_not_listed_each_pass() -> None:
    runtime, record, clock, status = Runtime(APP), PullRecord(None), Clock(T0), Status()
    loop = removals(runtime, record, clock, status)
    assert loop.run_once() == [] and runtime.listed == 0 and status.sent == []
    pulled_app(record)
    loop.run_once()
    assert runtime.listed == 1
