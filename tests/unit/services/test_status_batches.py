"""A status batch in AWS's time: a batch's progress writes run concurrently, a batch of hellos shares
its reads and writes, and a hello reads the running `Never` jobs only, not every job ever stored."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from prewarm.domain.jobs import JobState
from prewarm.domain.messages import Hello, StatusReport
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.reports import WRITERS, record_reports, record_status
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


class Calls:
    """Every DynamoDB call of the store's client: operations, and the job items each returned."""

    def __init__(self, client: Any) -> None:
        self.ops: Counter[str] = Counter()
        self.job_items_read = 0
        self.node_puts_per_transaction: list[int] = []
        self.node_items_asked: Counter[str] = Counter()  # "job pk|node sk" → times asked by BatchGetItem
        client.meta.events.register("provide-client-params.dynamodb", self._before)
        client.meta.events.register("after-call.dynamodb", self._after)

    def _before(self, event_name: str, params: dict[str, Any], **_: Any) -> None:
        op = event_name.rsplit(".", 1)[1]
        self.ops[op] += 1
        if op == "BatchGetItem":
            for request in params["RequestItems"].values():
                for key in request["Keys"]:
                    if key["sk"]["S"].startswith("NODE#"):
                        self.node_items_asked[f"{key['pk']['S']}|{key['sk']['S']}"] += 1
        if op == "TransactWriteItems":
            puts = [a for a in params["TransactItems"]
                    if "Put" in a and a["Put"]["Item"]["sk"]["S"].startswith("NODE#")]
            if puts:
                self.node_puts_per_transaction.append(len(puts))

    def _after(self, parsed: dict[str, Any], **_: Any) -> None:
        items = [*parsed.get("Items", []), *([parsed["Item"]] if "Item" in parsed else [])]
        items += [i for table in parsed.get("Responses", {}).values() if isinstance(table, list) for i in table]
        self.job_items_read += sum(1 for i in items if i.get("sk", {}).get("S") == "JOB" and "spec" in i)


def test_a_hello_reads_the_running_jobs_not_every_job_stored(plane: ControlPlane) -> None:
    # Given two running Never jobs among 30 finished jobs
    nodes_of(plane, 2)
    for i in range(30):
        key = planned(plane, f"done-{i}")
        record = plane.store.get_job(key)
        assert record is not None
        assert plane.store.finish_job(key, record.finish_fields(JobState.COMPLETED, at=plane.now()),
                                      require_done=False)
    for i in range(2):
        planned(plane, f"never-{i}", completionPolicy={"type": "Never"}, parallelism=10)
    plane.cluster.nodes += [make_node("node-new", pool="gpu"), make_node("node-later", pool="gpu")]
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                  [("m1", Hello(node="node-new", labels={"pool": "gpu"}))], now=plane.now())
    calls = Calls(plane.store.client)
    # When another new node says hello (in a fresh invocation: a new store, as a new Lambda container has)
    store = type(plane.store)(plane.store.table_name, client=plane.store.client)
    outcome = record_status(store, plane.queues, clusters_of(store, plane.cluster),
                            [("m2", Hello(node="node-later", labels={"pool": "gpu"}))], now=plane.now())
    # Then it joins both Never jobs, having read those two job items (and the ones fill_slots reads), not 32
    assert [h.added_to for h in outcome.hellos] == [["default/never-0", "default/never-1"]]
    assert calls.job_items_read <= 2 + 2 * 2, calls.ops


def test_a_batch_of_hellos_adds_its_nodes_to_each_job_in_one_transaction(plane: ControlPlane) -> None:
    # Given two running Never jobs over two nodes
    nodes_of(plane, 2)
    keys = [planned(plane, f"never-{i}", completionPolicy={"type": "Never"}, parallelism=20) for i in range(2)]
    new = nodes_of(plane, 6, "new")
    calls = Calls(plane.store.client)
    # When six new nodes say hello in one batch, one of them twice
    hellos = [(f"m{i}", Hello(node=n, labels={"pool": "gpu"}, warm_until=plane.now() + 600))
              for i, n in enumerate([*new, new[0]])]
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), hellos, now=plane.now())
    # Then each job gets the six nodes in one transaction, counted once, and every node its list
    assert outcome.retry_ids == []
    assert calls.node_puts_per_transaction == [6, 6]
    # having read each job's items of the new nodes once (for the resends and the joins alike)
    assert len(calls.node_items_asked) == 2 * 6 and set(calls.node_items_asked.values()) == {1}, calls.node_items_asked
    for key in keys:
        record = plane.store.get_job(key)
        assert record is not None and record.counters.desired == 8
        assert {t.node for t in plane.store.get_tasks(key)} >= set(new)
    assert all(h.required for h in outcome.hellos)
    assert sorted(h.node for h in outcome.hellos) == sorted([*new, new[0]])
    # And a second delivery of the same hellos adds nothing
    again = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), hellos, now=plane.now())
    assert [h.added_to for h in again.hellos] == [[]] * 7 and again.retry_ids == []
    for key in keys:
        record = plane.store.get_job(key)
        assert record is not None and record.counters.desired == 8


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


def test_the_running_index_follows_each_job_and_indexes_older_tables_once(plane: ControlPlane) -> None:
    from prewarm.adapters.dynamodb.jobs import RUNNING

    nodes_of(plane, 1)
    never = planned(plane, "never", completionPolicy={"type": "Never"})
    always = planned(plane, "always")
    later = planned(plane, "later-always")
    listed = lambda: [r.key for r in plane.store.list_running_jobs()]  # noqa: E731
    # Every running job is listed, whatever its policy; a new spec keeps it there
    assert listed() == sorted([always, later, never])
    apply_manifest(plane.store, job_doc("later-always", selector=GPU, completionPolicy={"type": "Never"}),
                   now=plane.now())
    assert listed() == sorted([always, later, never])
    # A finished or deleting job leaves the index
    record = plane.store.get_job(never)
    assert record is not None
    plane.store.finish_job(never, record.finish_fields(JobState.FAILED, at=plane.now()), require_done=False)
    plane.store.set_job_fields(later, {"state": JobState.DELETING})
    assert listed() == [always]
    # A table written before the index: its running job is indexed by the first reader
    again = planned(plane, "again", completionPolicy={"type": "Never"})
    client = plane.store.client
    client.update_item(TableName=plane.store.table_name, Key={"pk": {"S": f"JOB#{again}"}, "sk": {"S": "JOB"}},
                       UpdateExpression=f"REMOVE {RUNNING}")
    client.delete_item(TableName=plane.store.table_name, Key={"pk": {"S": "INDEX#running"},
                                                              "sk": {"S": "INDEX"}})
    assert listed() == [always]  # this reader indexed the table once already
    fresh = type(plane.store)(plane.store.table_name, client=client)
    assert [r.key for r in fresh.list_running_jobs()] == sorted([again, always])
