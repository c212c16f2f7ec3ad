"""What a status batch costs in DynamoDB calls, counted on the adapter's client (moto in-process): a batch
of hellos shares its reads and writes, a hello reads the running `Never` jobs only, not every job ever
stored, and the `running` index follows each job. The batches' behaviour: tests/unit/services/test_status_batches.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import Hello
from prewarm.services.jobs import apply_manifest
from prewarm.services.status_batches import record_status
from prewarm_devtools.sam.template import create_table, load_template
from tests.support.aws import mocked_aws
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, memory_plane
from tests.support.manifests import job_doc
from tests.unit.services.test_status_batches import GPU, nodes_of, planned

REGION = "us-west-2"


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    """The services' control plane with its store on DynamoDB (moto), its queues in memory."""
    with mocked_aws(monkeypatch, REGION):
        ddb = boto3.client("dynamodb", region_name=REGION)
        create_table(ddb, load_template(), "jobs")
        plane = memory_plane()
        plane.store = DynamoJobStore("jobs", client=ddb)
        yield plane


def dynamo(plane: ControlPlane) -> DynamoJobStore:
    assert isinstance(plane.store, DynamoJobStore)
    return plane.store


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
    calls = Calls(dynamo(plane).client)
    # When another new node says hello (in a fresh invocation: a new store, as a new Lambda container has)
    store = DynamoJobStore(dynamo(plane).table_name, client=dynamo(plane).client)
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
    calls = Calls(dynamo(plane).client)
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
    client = dynamo(plane).client
    client.update_item(TableName=dynamo(plane).table_name, Key={"pk": {"S": f"JOB#{again}"}, "sk": {"S": "JOB"}},
                       UpdateExpression=f"REMOVE {RUNNING}")
    client.delete_item(TableName=dynamo(plane).table_name, Key={"pk": {"S": "INDEX#running"},
                                                              "sk": {"S": "INDEX"}})
    assert listed() == [always]  # this reader indexed the table once already
    fresh = DynamoJobStore(dynamo(plane).table_name, client=client)
    assert [r.key for r in fresh.list_running_jobs()] == sorted([again, always])


def test_the_flight_index_holds_the_nodes_in_flight_and_indexes_each_older_job_once(plane: ControlPlane) -> None:
    from prewarm.adapters.dynamodb.tasks import FLIGHT_KEY

    # Given a job whose 3 nodes were all dispatched by its plan, one of them finished since
    nodes = nodes_of(plane, 3)
    key = planned(plane, "pulling", completionPolicy={"type": "Never"}, parallelism=3)
    record = plane.store.get_job(key)
    assert record is not None
    plane.report("pulling", nodes[0], "Pulling")
    plane.report("pulling", nodes[1], "Pulling")
    plane.report("pulling", nodes[1], "Succeeded")
    assert [t.node for t in plane.store.in_flight_tasks(record.ref)] == [nodes[0], nodes[2]]
    # A job whose node items a version before the index wrote: its nodes in flight are indexed by the first
    # reader that finds no marker of the job, once
    client, table = dynamo(plane).client, dynamo(plane).table_name
    for task in plane.store.get_tasks(key):
        client.update_item(TableName=table, Key={"pk": {"S": f"JOB#{key}#0"}, "sk": {"S": f"NODE#{task.node}"}},
                           UpdateExpression=f"REMOVE {FLIGHT_KEY}")
    client.delete_item(TableName=table, Key={"pk": {"S": "INDEX#flight"}, "sk": {"S": key}})
    assert plane.store.in_flight_tasks(record.ref) == []  # this reader indexed the job already
    fresh = DynamoJobStore(table, client=client)
    assert [t.node for t in fresh.in_flight_tasks(record.ref)] == [nodes[0], nodes[2]]
    assert "Item" in client.get_item(TableName=table, Key={"pk": {"S": "INDEX#flight"}, "sk": {"S": key}})
