"""A status batch in AWS's time: a batch's progress writes run concurrently, and a hello whose job write is
refused goes back alone. What a batch costs in DynamoDB calls (a batch of hellos shares its reads and
writes, a hello reads the running `Never` jobs only): tests/unit/adapters/test_dynamodb_status_batches.py."""

from __future__ import annotations

import threading
import time
from typing import Any

from prewarm.domain.messages import Hello, StatusReport
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.reports import WRITERS, record_reports
from prewarm.services.status_batches import record_status
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

GPU = {"matchLabels": {"pool": "gpu"}}


def nodes_of(plane: ControlPlane, n: int, prefix: str = "node") -> list[str]:
    names = [f"{prefix}-{i:02d}" for i in range(n)]
    plane.cluster.nodes += [make_node(name, pool="gpu") for name in names]
    return names


def planned(plane: ControlPlane, name: str, **spec: Any) -> str:
    apply_manifest(plane.store, job_doc(name, selector=GPU, **spec), now=plane.now())
    plan_job(plane.store, plane.cluster, plane.queues, f"default/{name}", now=plane.now())
    return f"default/{name}"


def test_a_hello_whose_job_write_is_refused_goes_back_alone(plane: ControlPlane, monkeypatch: Any) -> None:
    from prewarm.services.ports import StoreRetryableError

    # Given one running Never job selecting only the first new node, and a second one selecting both
    nodes_of(plane, 1)
    planned(plane, "never-a", completionPolicy={"type": "Never"}, parallelism=5)
    apply_manifest(plane.store, job_doc("never-b", selector={"matchLabels": {"zone": "b"}},
                                        completionPolicy={"type": "Never"}, parallelism=5), now=plane.now())
    plane.cluster.nodes += [make_node("b-node", zone="b")]
    plan_job(plane.store, plane.cluster, plane.queues, "default/never-b", now=plane.now())
    plane.cluster.nodes += [make_node("new-a", pool="gpu"), make_node("new-b", zone="b")]
    real = plane.store.add_tasks

    def throttled(ref: Any, tasks: Any, *, plan_id: str) -> list[str]:
        if ref.key == "default/never-a":
            raise StoreRetryableError("add nodes: ThrottlingException")
        return real(ref, tasks, plan_id=plan_id)

    monkeypatch.setattr(plane.store, "add_tasks", throttled)
    # When both say hello in one batch and the first job's write is throttled
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                            [("a", Hello(node="new-a", labels={"pool": "gpu"})),
                             ("b", Hello(node="new-b", labels={"zone": "b"}))], now=plane.now())
    # Then only the hello of the node that job selects goes back to the queue
    assert outcome.retry_ids == ["a"]
    assert [(h.node, h.added_to) for h in outcome.hellos] == [("new-b", ["default/never-b"])]


def test_a_batch_writes_its_progress_reports_concurrently(plane: ControlPlane, monkeypatch: Any) -> None:
    # Given 40 pulling nodes of one job
    nodes = nodes_of(plane, 40)
    key = planned(plane, "warm", parallelism=40)
    record = plane.store.get_job(key)
    assert record is not None

    def reports(seq: int) -> list[StatusReport]:
        return [StatusReport(job=key, job_uid=record.uid, round=record.round, node=n, phase="Pulling", seq=seq,
                             bytes_done=seq, bytes_total=100) for n in nodes]

    assert all(o.applied for o in record_reports(plane.store, plane.queues, reports(1), now=plane.now()).outcomes)
    real, lock = plane.store.update_task, threading.Lock()
    flight = {"now": 0, "most": 0}

    def slow_write(*args: Any, **kwargs: Any) -> None:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        try:
            time.sleep(0.02)  # a DynamoDB round trip
            real(*args, **kwargs)
        finally:
            with lock:
                flight["now"] -= 1

    monkeypatch.setattr(plane.store, "update_task", slow_write)
    # When a batch of 40 progress reports is applied
    outcome = record_reports(plane.store, plane.queues, reports(2), now=plane.now())
    # Then the node writes ran up to WRITERS at a time, each exactly once, and every node holds its report
    assert all(o.applied for o in outcome.outcomes) and outcome.node_writes == 40
    assert 1 < flight["most"] <= WRITERS
    assert {t.node: t.bytes_done for t in plane.store.get_tasks(key)} == dict.fromkeys(nodes, 2)
    after = plane.store.get_job(key)
    assert after is not None and after.counters == record.counters.__class__(
        desired=40, waiting=0, active=40, succeeded=0, failed=0)
