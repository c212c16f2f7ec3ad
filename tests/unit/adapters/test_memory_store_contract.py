"""What keeps the services' in-memory fakes honest: the same scenarios on `DynamoJobStore` over moto and on
`MemoryJobStore`, and on `NodeQueues` over moto's SQS and on `MemoryTaskQueues`, with the same observable
results, refusals included. Every method the fakes implement has a scenario here (`test_every_method...`
checks that list against the ports)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters import dynamodb
from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues, ProbeQueue, QueueError, QueueRetryableError, StatusQueue
from prewarm.domain.clusters import ClusterSetup, RegisteredCluster
from prewarm.domain.job import ApiKind, EarlierImage, JobRound, StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.keys import JobKey
from prewarm.domain.messages import CancelTask, ClusterProbe, NodePhase, PullTask, RequiredImage, RequiredImages
from prewarm.domain.node_queues import attribute_drift, foreign_principals
from prewarm.domain.nodes import NodeBoot, NodeFootprint, NodeWarm, RegisteredNode
from prewarm.domain.placement import ExcludedNode
from prewarm.domain.registry_budget import BudgetState, RegistryBudget
from prewarm.domain.schedules import ScheduleRun
from prewarm.domain.status import Counters, NodeTaskRecord, NodeUpdate
from prewarm.domain.warm_budgets import BudgetPolicy, WarmBudget
from prewarm.services import ports
from prewarm.services.ports import StoreError
from prewarm_devtools.sam.template import create_table, load_template
from tests.support import memory_store
from tests.support.control_plane import Store, take_node_messages
from tests.support.manifests import job_doc
from tests.support.memory_queues import MemoryProbeQueue, MemorySqs, MemoryStatusQueue, MemoryTaskQueues
from tests.support.memory_store import MemoryJobStore

REGION = "us-west-2"
KEY = "default/warm"
_tables = itertools.count()


@pytest.fixture(scope="module")
def aws() -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """moto in-process for the module: DynamoDB and SQS clients, and the template (loaded once)."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            env.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            env.delenv(name, raising=False)
        with mock_aws():
            yield boto3.client("dynamodb", region_name=REGION), boto3.client("sqs", region_name=REGION), load_template()


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest) -> Store:
    """An empty job table: on moto through the adapter, or in memory."""
    if request.param == "memory":
        return MemoryJobStore()
    ddb, _, template = request.getfixturevalue("aws")
    name = f"jobs-{next(_tables)}"
    create_table(ddb, template, name)
    return DynamoJobStore(name, client=ddb)


def job(name: str = "warm", **fields: Any) -> StoredJob:
    values: dict[str, Any] = {
        "namespace": "default", "name": name, "uid": "u1", "api_kind": ApiKind.IMAGE_PULL_JOB,
        "manifest": job_doc(name, parallelism=2), "spec_hash": "h1",
        "created_at": 100.0, "start_time": 100.5, "platforms": [{"os": "linux", "architecture": "amd64"}],
    }
    return StoredJob(**{**values, **fields})


def refusal(call: Callable[[], Any]) -> str:
    """The error type a call raises ("" when it returns)."""
    try:
        call()
    except StoreError as e:
        return type(e).__name__
    return ""


def planned(store: Store, nodes: list[str], *, shards: int = 1, parallelism: int = 10) -> JobRound:
    """A job whose round 0 is planned over `nodes`, all waiting."""
    store.create_job(job(shards=shards))
    store.commit_plan(KEY, plan_id="1.0", expected_version=0, counters=Counters(desired=len(nodes), waiting=len(nodes)),
                      extra={})
    store.put_tasks(KEY, [NodeTaskRecord(node=n, round=0) for n in nodes], shards=shards)
    return JobRound(KEY, "u1", 0, shards)


def counters(store: Store) -> tuple[int, ...]:
    record = store.get_job(KEY)
    assert record is not None
    c = record.counters
    return (c.desired, c.waiting, c.active, c.succeeded, c.failed, record.version)


# --- job items -------------------------------------------------------------------------------


def test_a_job_reads_back_as_written_in_new_objects_numbers_as_dynamodb_hands_them(store: Store) -> None:
    written = job(children=["a", "b"], owner="list", cluster="")
    store.create_job(written)
    got = store.get_job(KEY, consistent=False)
    assert got is not None and got == written and got is not written
    assert type(got.created_at) is int and type(got.start_time) is float
    got.manifest["spec"]["parallelism"] = 9
    assert store.get_job(KEY) == written and store.get_job("default/none") is None


def test_a_jobs_warm_budget_facts_read_back_and_are_replaced_with_its_spec(store: Store) -> None:
    store.create_job(job(warm_digest="sha256:1", warm_bytes=3 * 2**30, budget_note="size unknown"))
    got = store.get_job(KEY)
    assert got is not None and (got.warm_digest, got.warm_bytes, got.budget_note) == (
        "sha256:1", 3 * 2**30, "size unknown")
    store.replace_job_spec(replace(got, spec_hash="h2", warm_digest="", warm_bytes=None, budget_note=""),
                           expected_hash=got.spec_hash)
    got = store.get_job(KEY)
    assert got is not None and (got.warm_digest, got.warm_bytes, got.budget_note) == ("", None, "")


def test_namespaces_warm_budgets_are_kept_per_cluster_and_rewritten_only_when_changed(store: Store) -> None:
    budgets = {"team-a": WarmBudget("team-a", 2**30), "team-b": WarmBudget("team-b", 5, BudgetPolicy.TRIM),
               "bad": WarmBudget("bad", problem="namespace bad: annotation ...")}
    assert store.get_warm_budgets() == {}
    assert store.put_warm_budgets(budgets) is True
    assert store.put_warm_budgets(budgets) is False
    assert store.get_warm_budgets() == budgets and store.get_warm_budgets("prod-eu") == {}
    assert store.put_warm_budgets({}, "prod-eu") is False
    assert store.put_warm_budgets({"team-a": WarmBudget("team-a", 1)}) is True
    assert store.get_warm_budgets() == {"team-a": WarmBudget("team-a", 1)}


def test_a_job_created_twice_is_refused(store: Store) -> None:
    store.create_job(job())
    assert refusal(lambda: store.create_job(job(uid="u2"))) == "StoreConflictError"
    assert store.get_job(KEY).uid == "u1"  # type: ignore[union-attr]


def test_a_spec_is_replaced_only_over_the_hash_expected(store: Store) -> None:
    store.create_job(job())
    new = job(manifest={"spec": {"image": "r.example/app:v2"}}, spec_hash="h2", generation=2, round=1,
              state=JobState.RUNNING, message="", earlier=EarlierImage(0, "r.example/app:v1", pinned=True),
              pinned_until=0)
    assert refusal(lambda: store.replace_job_spec(new, expected_hash="stale")) == "StoreConflictError"
    store.replace_job_spec(new, expected_hash="h1")
    got = store.get_job(KEY)
    assert got is not None and (got.spec_hash, got.generation, got.round, got.manifest, got.earlier,
                                got.pinned_until) == ("h2", 2, 1, {"spec": {"image": "r.example/app:v2"}},
                                                      new.earlier, 0)
    assert refusal(lambda: store.replace_job_spec(job("other"), expected_hash="h1")) == "StoreConflictError"


def test_fields_are_set_on_an_existing_job_in_the_state_asked(store: Store) -> None:
    assert refusal(lambda: store.set_job_fields(KEY, {"message": "x"})) == "StoreConflictError"
    store.create_job(job())
    store.set_job_fields(KEY, {"platforms": [{"os": "linux"}], "placement_note": "n", "children": ["c"],
                               "parked": "1.0", "seeds": ["n1", "n2"]})
    assert refusal(lambda: store.set_job_fields(KEY, {"round": 1}, condition_state=JobState.COMPLETED)) == (
        "StoreConflictError")
    store.set_job_fields(KEY, {"round": 1, "deleting_since": 7.0}, condition_state=JobState.RUNNING)
    store.set_job_fields(KEY, {"message": None})
    got = store.get_job(KEY)
    assert got is not None and (got.platforms, got.placement_note, got.children, got.round, got.deleting_since,
                                got.message, got.parked, got.seeds) == ([{"os": "linux"}], "n", ["c"], 1, 7, "", "1.0",
                                                                        ["n1", "n2"])


def test_jobs_are_listed_by_key_and_running_ones_per_cluster(store: Store) -> None:
    for name in ("b", "a", "c"):
        store.create_job(job(name))
    store.create_job(job("a", cluster="prod-eu"))
    store.set_job_fields("default/b", {"state": JobState.DELETING})
    store.record_run(ScheduleRun("sweep", 1.0, 2.0))
    store.put_rule("r", {"spec": {}}, "h")
    assert [j.key for j in store.list_jobs()] == ["default/a", "default/b", "default/c", "prod-eu:default/a"]
    assert [j.key for j in store.list_running_jobs()] == ["default/a", "default/c"]
    assert [j.key for j in store.list_running_jobs("prod-eu")] == ["prod-eu:default/a"]
    record = store.get_job("default/c")
    assert record is not None
    assert store.finish_job("default/c", record.finish_fields(JobState.COMPLETED, at=5.0), require_done=False)
    assert [j.key for j in store.list_running_jobs()] == ["default/a"]


def test_the_live_pull_jobs_of_a_repository_are_listed_per_cluster(store: Store) -> None:
    def pull_job(name: str, image: str, **fields: Any) -> StoredJob:
        return job(name, manifest=job_doc(name, image=image), **fields)

    store.create_job(pull_job("a", "r.example/app:v1"))
    store.create_job(pull_job("b", "r.example/app:v2"))
    store.create_job(pull_job("other", "r.example/other:v1"))
    store.create_job(pull_job("a", "r.example/app:v1", cluster="prod-eu"))
    store.create_job(pull_job("gone", "r.example/app:v1"))
    store.set_job_fields("default/gone", {"state": JobState.DELETING})  # its deletion started: it wants nothing
    store.create_job(job("list", api_kind=ApiKind.IMAGE_LIST_PULL_JOB,
                         manifest={"spec": {"images": ["r.example/app:v1"]}}))
    assert [j.key for j in store.list_image_jobs("", "r.example/app")] == ["default/a", "default/b"]
    assert [j.key for j in store.list_image_jobs("prod-eu", "r.example/app")] == ["prod-eu:default/a"]
    # a finished job still wants its image; one whose new spec pulls another repository moves
    record = store.get_job("default/a")
    assert record is not None
    store.finish_job("default/a", record.finish_fields(JobState.COMPLETED, at=5.0), require_done=False)
    store.replace_job_spec(pull_job("b", "r.example/other:v2", spec_hash="h2"), expected_hash="h1")
    assert [j.key for j in store.list_image_jobs("", "r.example/app")] == ["default/a"]
    assert [j.key for j in store.list_image_jobs("", "r.example/other")] == ["default/b", "default/other"]
    if isinstance(store, DynamoJobStore):  # a table written before the index: indexed by its first reader
        client, table = store.client, store.table_name
        client.update_item(TableName=table, Key={"pk": {"S": "JOB#default/other"}, "sk": {"S": "JOB"}},
                           UpdateExpression="REMOVE ipk")
        client.delete_item(TableName=table, Key={"pk": {"S": "INDEX#images"}, "sk": {"S": "INDEX"}})
        fresh = DynamoJobStore(table, client=client)
        assert [j.key for j in fresh.list_image_jobs("", "r.example/other")] == ["default/b", "default/other"]


def test_shards_are_fixed_once(store: Store) -> None:
    assert store.reserve_shards("default/none", 1_000) == 10
    store.create_job(job())
    assert (store.reserve_shards(KEY, 250), store.reserve_shards(KEY, 10_000)) == (3, 3)
    store.create_job(job("big"))
    assert store.reserve_shards("default/big", 100_000) == dynamodb.MAX_SHARDS == memory_store.MAX_SHARDS


def test_a_plan_commits_over_the_version_read_and_moves_it(store: Store) -> None:
    assert refusal(lambda: store.commit_plan(KEY, plan_id="1.0", expected_version=0, counters=Counters(),
                                             extra={})) == "StoreConflictError"
    store.create_job(job(earlier=EarlierImage(0, "r.example/app:v0")))
    store.commit_plan(KEY, plan_id="1.0", expected_version=0, counters=Counters(desired=3, waiting=2, succeeded=1),
                      extra={"pull_secret_arns": ["arn:1"], "start_time": 9.0, "earlier": None})
    assert refusal(lambda: store.commit_plan(KEY, plan_id="1.0", expected_version=0, counters=Counters(),
                                             extra={})) == "StoreConflictError"
    got = store.get_job(KEY)
    assert got is not None and (got.planned, got.pull_secret_arns, got.start_time, got.earlier) == (
        "1.0", ["arn:1"], 9, None)
    assert counters(store) == (3, 2, 0, 1, 0, 1)


def test_a_job_finishes_once_running_and_done(store: Store) -> None:
    assert not store.finish_job(KEY, {"state": JobState.COMPLETED})
    planned(store, ["n1"])
    assert not store.finish_job(KEY, {"state": JobState.COMPLETED, "completion_time": 5.0})  # 0 done of 1
    assert store.finish_job(KEY, {"state": JobState.FAILED, "message": "m", "ttl": 60}, require_done=False)
    assert not store.finish_job(KEY, {"state": JobState.COMPLETED}, require_done=False)  # not running
    got = store.get_job(KEY)
    assert got is not None and (got.state, got.message, got.ttl, got.version) == (JobState.FAILED, "m", 60, 2)


def test_deleting_a_job_deletes_its_node_and_excluded_items_in_every_shard(store: Store) -> None:
    planned(store, [f"n{i}" for i in range(30)], shards=3)
    store.put_excluded(KEY, [ExcludedNode("x1", "not Ready")], shards=3)
    store.create_job(job("kept"))
    store.delete_job(KEY)
    store.delete_job("default/none")
    assert store.get_job(KEY) is None and store.get_tasks(KEY, shards=3) == [] and store.get_excluded(KEY) == []
    assert [j.key for j in store.list_jobs()] == ["default/kept"]


# --- node items ------------------------------------------------------------------------------


def test_tasks_are_read_by_node_across_shards_alone_or_in_batches(store: Store) -> None:
    nodes = [f"n{i:02d}" for i in range(12)]
    ref = planned(store, list(reversed(nodes)), shards=3)
    assert [t.node for t in store.get_tasks(KEY)] == nodes == [t.node for t in store.get_tasks(KEY, shards=3)]
    assert store.get_task(KEY, "n03") == NodeTaskRecord(node="n03", round=0)
    assert store.get_task(KEY, "n03", shards=3) is not None and store.get_task(KEY, "gone") is None
    got = store.get_tasks_of(ref, ["n01", "n05", "n01", "gone"])
    assert sorted(got) == ["n01", "n05"] and got["n05"] == NodeTaskRecord(node="n05", round=0)
    assert store.get_tasks_of(ref, []) == {}


def test_a_batch_naming_a_node_twice_is_refused(store: Store) -> None:
    store.create_job(job())
    twice = [NodeTaskRecord(node="n1", round=0), NodeTaskRecord(node="n1", round=0)]
    assert refusal(lambda: store.put_tasks(KEY, twice, shards=1)) == "StoreError"
    assert refusal(lambda: store.delete_tasks(KEY, ["n1", "n1"], shards=1)) == "StoreError"


def test_waiting_nodes_come_from_the_start_shard_on_in_node_order(store: Store) -> None:
    nodes = [f"n{i:02d}" for i in range(20)]
    planned(store, nodes, shards=3)
    by_shard = {s: [n for n in nodes if dynamodb.shard_of(n, 3) == s] for s in range(3)}
    assert all(memory_store.shard_of(n, 3) == dynamodb.shard_of(n, 3) for n in nodes)
    assert store.waiting_nodes(KEY, 2, start=1) == by_shard[1][:2]
    assert store.waiting_nodes(KEY, 100, shards=3, start=2) == by_shard[2] + by_shard[0] + by_shard[1]
    store.claim_tasks(JobRound(KEY, "u1", 0, 3), by_shard[0][:1], parallelism=5, now=1.0)
    assert store.waiting_nodes(KEY, 100) == [n for n in by_shard[0] + by_shard[1] + by_shard[2]
                                             if n != by_shard[0][0]]


def test_only_the_nodes_in_flight_are_read_as_in_flight(store: Store) -> None:
    nodes = [f"n{i:02d}" for i in range(12)]
    ref = planned(store, nodes, shards=3)
    assert store.in_flight_tasks(ref) == []  # waiting for a slot: not in flight
    assert store.claim_tasks(ref, nodes[:4], parallelism=10, now=5.0) == nodes[:4]
    store.update_task(ref, NodeUpdate("n00", 1, {"phase": NodePhase.PULLING.value, "seq": 1, "updated_at": 6.0}))
    store.apply_updates(ref, [NodeUpdate("n01", 1, {"phase": NodePhase.SUCCEEDED.value})],
                        {"active": -1, "succeeded": 1, "done": 1})
    store.update_task(ref, NodeUpdate("n02", 1, {"phase": NodePhase.FAILED.value}))
    # A report of a node never claimed (its task sent by a plan) dispatches it: it is in flight as well
    store.update_task(ref, NodeUpdate("n05", 0, {"phase": NodePhase.PULLING.value, "dispatched_at": 7.0}))
    flight = store.in_flight_tasks(ref)
    assert [(t.node, t.phase, t.dispatched_at) for t in flight] == [
        ("n00", NodePhase.PULLING, 5.0), ("n03", NodePhase.WAITING, 5.0), ("n05", NodePhase.PULLING, 7.0)]
    # A plan's node items dispatched in its batch write are in flight; a new round's replace the old ones
    store.put_tasks(KEY, [NodeTaskRecord(node="n00", round=1, dispatched_at=9.0),
                          NodeTaskRecord(node="n03", round=1, phase=NodePhase.SUCCEEDED, dispatched_at=9.0),
                          NodeTaskRecord(node="n05", round=1)], shards=3)
    assert [t.node for t in store.in_flight_tasks(JobRound(KEY, "u1", 1, 3))] == ["n00"]
    assert store.in_flight_tasks(ref) == []  # round 0's are gone


def test_failed_nodes_and_deleted_tasks(store: Store) -> None:
    ref = planned(store, ["a", "b", "c"])
    store.apply_updates(ref, [NodeUpdate("b", 0, {"phase": NodePhase.FAILED.value, "message": "401"}),
                              NodeUpdate("c", 0, {"phase": NodePhase.CANCELLED.value})],
                        {"waiting": -2, "failed": 2, "done": 2})
    assert store.failed_nodes(KEY) == ["b", "c"] == store.failed_nodes(KEY, shards=1)
    store.delete_tasks(KEY, ["a", "b", "gone"], shards=1)
    assert [t.node for t in store.get_tasks(KEY)] == ["c"]


def test_excluded_nodes_are_replaced_whole(store: Store) -> None:
    store.create_job(job(shards=2))
    store.put_excluded(KEY, [ExcludedNode("x2", "virtual-kubelet node"), ExcludedNode("x1", "not Ready")], shards=2)
    store.put_excluded(KEY, [ExcludedNode("x3", "no agent"), ExcludedNode("x1", "still not Ready")], shards=2)
    assert store.get_excluded(KEY) == [ExcludedNode("x1", "still not Ready"), ExcludedNode("x3", "no agent")]
    assert store.get_excluded(KEY, shards=2) == store.get_excluded(KEY) and store.get_tasks(KEY) == []


def test_a_node_update_needs_the_version_and_round_it_read(store: Store) -> None:
    ref = planned(store, ["a"])
    store.update_task(ref, NodeUpdate("a", 0, {"phase": NodePhase.PULLING.value, "bytes_done": 5, "seq": 1}))
    assert refusal(lambda: store.update_task(ref, NodeUpdate("a", 0, {"bytes_done": 6}))) == "StoreConflictError"
    assert refusal(lambda: store.update_task(JobRound(KEY, "u1", 1), NodeUpdate("a", 1, {"bytes_done": 6}))) == (
        "StoreConflictError")
    assert refusal(lambda: store.update_task(ref, NodeUpdate("gone", 0, {"seq": 1}))) == "StoreConflictError"
    task = store.get_task(KEY, "a")
    assert task is not None and (task.phase, task.bytes_done, task.version) == (NodePhase.PULLING, 5, 1)
    assert store.waiting_nodes(KEY, 10) == []  # no longer waiting
    assert counters(store)[-1] == 1  # the job item is not written


def test_node_updates_and_counters_commit_together_or_not_at_all(store: Store) -> None:
    ref = planned(store, ["a", "b"])
    store.apply_updates(ref, [NodeUpdate("a", 0, {"phase": NodePhase.SUCCEEDED.value})],
                        {"waiting": -1, "succeeded": 1, "done": 1})
    stale = [NodeUpdate("b", 0, {"phase": NodePhase.SUCCEEDED.value}), NodeUpdate("a", 0, {"seq": 9})]
    assert refusal(lambda: store.apply_updates(ref, stale, {"waiting": -1, "succeeded": 1})) == "StoreConflictError"
    other = JobRound(KEY, "u2", 0)
    assert refusal(lambda: store.apply_updates(other, [NodeUpdate("b", 0, {"seq": 1})], {"failed": 1})) == (
        "StoreConflictError")
    assert counters(store) == (2, 1, 0, 1, 0, 2) and store.get_task(KEY, "b").version == 0  # type: ignore[union-attr]
    store.apply_updates(ref, [NodeUpdate("b", 0, {"seq": 1})], {"waiting": 0})  # no counter moves: node only
    assert counters(store)[-1] == 2 and store.get_task(KEY, "b").seq == 1  # type: ignore[union-attr]
    twice = [NodeUpdate("b", 1, {"seq": 2}), NodeUpdate("b", 1, {"seq": 3})]
    assert refusal(lambda: store.apply_updates(ref, twice, {"waiting": -1})) == "StoreError"
    with pytest.raises(ValueError, match="at most 99"):
        store.apply_updates(ref, [NodeUpdate(f"n{i}", 0, {}) for i in range(100)], {})


def test_nodes_join_a_planned_round_counted_once(store: Store) -> None:
    ref = planned(store, ["a"])
    store.add_task(ref, NodeTaskRecord(node="b", round=0), plan_id="1.0")
    assert refusal(lambda: store.add_task(ref, NodeTaskRecord(node="b", round=0), plan_id="1.0")) == (
        "StoreConflictError")
    assert refusal(lambda: store.add_task(ref, NodeTaskRecord(node="c", round=0), plan_id="0.9")) == (
        "StoreConflictError")
    new = [NodeTaskRecord(node=n, round=0) for n in ("a", "c", "d", "c")]
    assert store.add_tasks(ref, new, plan_id="1.0") == ["c", "d"]
    assert store.add_tasks(ref, [NodeTaskRecord(node="e", round=0)], plan_id="2.0") == []
    assert store.add_tasks(ref, [], plan_id="1.0") == []
    assert counters(store) == (4, 4, 0, 0, 0, 3)
    assert [t.node for t in store.get_tasks(KEY)] == ["a", "b", "c", "d"]


def test_a_later_round_takes_over_a_nodes_item(store: Store) -> None:
    planned(store, ["a", "b"])
    store.set_job_fields(KEY, {"round": 1, "planned": "1.1"})
    store.apply_updates(JobRound(KEY, "u1", 0), [NodeUpdate("a", 0, {"phase": NodePhase.SUCCEEDED.value})], {})
    ref = JobRound(KEY, "u1", 1)
    added = store.add_tasks(ref, [NodeTaskRecord(node=n, round=1) for n in ("a", "b", "c")], plan_id="1.1")
    assert added == ["a", "b", "c"] and {t.node: t.round for t in store.get_tasks(KEY)} == {"a": 1, "b": 1, "c": 1}
    many = [NodeTaskRecord(node=f"m{i:03d}", round=1) for i in range(120)]
    assert len(store.add_tasks(ref, many, plan_id="1.1")) == 120 and counters(store)[0] == 2 + 3 + 120


def test_a_node_leaves_the_round_with_its_counters(store: Store) -> None:
    ref = planned(store, ["a", "b", "c"])
    store.apply_updates(ref, [NodeUpdate("a", 0, {"phase": NodePhase.SUCCEEDED.value})],
                        {"waiting": -1, "succeeded": 1, "done": 1})
    a, b = store.get_task(KEY, "a"), store.get_task(KEY, "b")
    assert a is not None and b is not None
    store.remove_task(ref, a)
    store.remove_task(ref, b)
    assert refusal(lambda: store.remove_task(ref, b)) == "StoreConflictError"
    c = store.get_task(KEY, "c")
    assert c is not None
    assert refusal(lambda: store.remove_task(ref, NodeTaskRecord(node="c", round=0, version=5))) == (
        "StoreConflictError")
    assert counters(store) == (1, 1, 0, 0, 0, 4) and [t.node for t in store.get_tasks(KEY)] == ["c"]
    record = store.get_job(KEY)
    assert record is not None and record.counters.done == 0


def test_claims_stay_within_parallelism_and_skip_nodes_claimed_first(store: Store) -> None:
    ref = planned(store, ["a", "b", "c", "d", "e"])
    assert store.claim_tasks(ref, ["a", "a"], parallelism=2, now=10.0) == ["a"]
    assert store.claim_tasks(ref, ["a", "b"], parallelism=3, now=11.0) == ["b"]
    assert store.claim_tasks(ref, ["c"], parallelism=2, now=12.0) == []
    # more than the free slots: the last ones asked for are left out, one at a time, until the job has room
    assert store.claim_tasks(ref, ["a", "c", "d"], parallelism=3, now=12.0) == []
    assert store.claim_tasks(JobRound(KEY, "u1", 1), ["c"], parallelism=9, now=12.0) == []
    assert store.claim_tasks(ref, ["c", "d", "e"], parallelism=4, now=13.0) == ["c", "d"]
    assert counters(store) == (5, 1, 4, 0, 0, 4)
    task = store.get_task(KEY, "c")
    assert task is not None and (task.dispatched_at, task.version) == (13, 1)
    assert store.waiting_nodes(KEY, 10) == ["e"]
    store.finish_job(KEY, {"state": JobState.FAILED}, require_done=False)
    assert store.claim_tasks(ref, ["e"], parallelism=9, now=14.0) == []


def test_paced_starts_and_holds_are_written_on_the_claimed_nodes_of_the_round_only(store: Store) -> None:
    ref = planned(store, ["a", "b", "c"])
    store.claim_tasks(ref, ["a", "b"], parallelism=3, now=10.0)
    version = store.get_task(KEY, "a").version  # type: ignore[union-attr]

    # c is not claimed, and a node item of another round is left alone: the rest are written
    store.record_pull_starts(ref, {"a": 400.0, "c": 5.0}, held=["b"], now=20.0)
    store.record_pull_starts(JobRound(KEY, "u1", 1), {"a": 9.0}, now=20.0)

    read = {n: store.get_task(KEY, n) for n in ("a", "b", "c")}
    assert {n: (t.starts_at, t.held_at) for n, t in read.items() if t is not None} == {
        "a": (400.0, None), "b": (None, 20.0), "c": (None, None)}
    assert read["a"] is not None and read["a"].version == version  # no report meets this write


# --- nodes, rules, schedule runs, clusters -----------------------------------------------------


def test_nodes_register_per_cluster_and_a_later_hello_keeps_how_the_node_warmed(store: Store) -> None:
    node = RegisteredNode(name="n1", labels={"pool": "gpu"}, architecture="amd64", os="linux", queue_url="q",
                          last_hello=5.0, agent_version="0.1.0")
    warm = NodeWarm(joined_at=1.0, hello_at=2.5, warm_at=3.0, outcome="warm", missing=("img",), missing_total=1)
    assert refusal(lambda: store.record_warm("n1", warm)) == "StoreConflictError"
    store.put_node(node)
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="arm64", os="linux", queue_url="q2",
                                  last_hello=6.0, cluster="prod-eu"))
    store.record_warm("n1", warm)
    store.put_node(RegisteredNode(name="n1", labels={"pool": "gpu"}, architecture="amd64", os="linux",
                                  queue_url="q", last_hello=7.5))
    got = store.get_node("n1")
    assert got is not None and (got.warm, got.agent_version, got.last_hello) == (warm, "", 7.5)
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=8.0, warm_until=600.0))
    assert store.get_node("n1").warm is None  # type: ignore[union-attr]  # a new warm-up
    store.put_node(RegisteredNode(name="n0", labels={}, architecture="", os="", queue_url="", last_hello=0))
    assert [n.name for n in store.list_nodes()] == ["n0", "n1"]
    assert [(n.name, n.cluster, n.architecture) for n in store.list_nodes("prod-eu")] == [("n1", "prod-eu", "arm64")]
    store.delete_node("n1", "prod-eu")
    store.delete_node("gone")
    assert store.get_node("n1", "prod-eu") is None and store.list_nodes("prod-eu") == []


def test_a_nodes_images_at_boot_are_kept_across_hellos_and_warm_ups_per_cluster(store: Store) -> None:
    boot = NodeBoot(required=("a@sha256:1", "b@sha256:2"), present=("a@sha256:1",), at=4.5)
    assert refusal(lambda: store.record_boot("n1", boot)) == "StoreConflictError"
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=5.0, warm_until=600.0))
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=5.0, cluster="prod-eu"))
    store.record_boot("n1", boot)
    warm = NodeWarm(joined_at=1.0, hello_at=2.5, warm_at=3.0, outcome="warm")
    # The warm-up's write returns the registration it left: its images at boot with it, no read after
    assert store.record_warm("n1", warm) == store.get_node("n1")
    assert store.record_warm("n1", warm).boot == boot
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=9.0, warm_until=600.0))
    got = store.get_node("n1")
    assert got is not None and got.boot == boot and got.boot.all_present is False
    assert [n.boot for n in store.list_nodes()] == [boot]
    assert store.get_node("n1", "prod-eu").boot is None  # type: ignore[union-attr]  # another cluster's node
    store.record_boot("n1", NodeBoot(required=(), present=(), at=9.5), "prod-eu")
    assert store.get_node("n1", "prod-eu").boot == NodeBoot(required=(), present=(), at=9.5)  # type: ignore[union-attr]


def test_a_nodes_footprint_is_kept_across_hellos_per_cluster_and_refused_before_its_hello(store: Store) -> None:
    footprint = NodeFootprint(images=2, bytes=4_096, freed_bytes=1_024, at=7.5)
    assert refusal(lambda: store.record_footprint("n1", footprint)) == "StoreConflictError"
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=5.0))
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=5.0, cluster="prod-eu"))
    store.record_footprint("n1", footprint)
    store.put_node(RegisteredNode(name="n1", labels={}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=9.0, warm_until=600.0))
    assert store.get_node("n1").footprint == footprint  # type: ignore[union-attr]  # a later hello keeps it
    assert [n.footprint for n in store.list_nodes()] == [footprint]
    assert store.get_node("n1", "prod-eu").footprint is None  # type: ignore[union-attr]  # another cluster's node
    later = NodeFootprint(images=0, bytes=0, freed_bytes=5_120, at=9.25)
    store.record_footprint("n1", later, "prod-eu")
    assert store.get_node("n1", "prod-eu").footprint == later  # type: ignore[union-attr]


def test_a_node_registered_unverified_is_marked_verified_keeping_how_it_warmed(store: Store) -> None:
    warm = NodeWarm(joined_at=1.0, hello_at=2.5, warm_at=3.0, outcome="warm")
    store.put_node(RegisteredNode(name="n1", labels={"pool": "gpu"}, architecture="amd64", os="linux", queue_url="q",
                                  last_hello=5.0, warm_until=600.0, cluster="prod-eu", unverified=True))
    store.record_warm("n1", warm, "prod-eu")
    assert [(n.name, n.unverified) for n in store.list_nodes("prod-eu")] == [("n1", True)]
    store.mark_node_verified("n1", "prod-eu")
    store.mark_node_verified("gone", "prod-eu")  # forgotten meanwhile: nothing to mark, nothing created
    got = store.get_node("n1", "prod-eu")
    assert got is not None and (got.unverified, got.warm, got.last_hello) == (False, warm, 5.0)
    assert store.get_node("gone", "prod-eu") is None


def test_rules_say_what_a_write_did(store: Store) -> None:
    spec = {"metadata": {"name": "r"}, "spec": {"repositories": ["ml/*"]}}
    assert [store.put_rule("r", spec, "h1"), store.put_rule("r", spec, "h1"), store.put_rule("r", spec, "h2")] == [
        "created", "unchanged", "configured"]
    store.put_rule("a", {"spec": {}}, "h")
    assert store.list_rules() == [{"spec": {}}, spec]
    assert (store.delete_rule("r"), store.delete_rule("r")) == (True, False)


def test_warm_snapshots_keep_their_state_through_a_new_spec_and_write_it_over_the_version_read(
        store: Store) -> None:
    manifest = {"metadata": {"name": "gpu"}, "spec": {"keep": 2}}
    assert [store.put_warm_snapshot("gpu", manifest, "h1"), store.put_warm_snapshot("gpu", manifest, "h1")] == [
        "created", "unchanged"]
    assert store.get_warm_snapshot("gpu") == (manifest, {}, 0)
    assert store.save_snapshot_state("gpu", {"bakes": 1}, 0) == 1
    assert refusal(lambda: store.save_snapshot_state("gpu", {"bakes": 2}, 0)) == "StoreConflictError"
    assert refusal(lambda: store.save_snapshot_state("absent", {"bakes": 1}, 0)) == "StoreConflictError"
    changed = {"metadata": {"name": "gpu"}, "spec": {"keep": 3}}
    assert store.put_warm_snapshot("gpu", changed, "h2") == "configured"
    store.put_warm_snapshot("a", manifest, "h")
    assert store.list_warm_snapshots() == [(manifest, {}, 0), (changed, {"bakes": 1}, 1)]
    assert (store.delete_warm_snapshot("gpu"), store.delete_warm_snapshot("gpu")) == (True, False)
    assert store.get_warm_snapshot("gpu") is None


def test_cron_jobs_say_what_a_write_did_and_read_back_by_key(store: Store) -> None:
    key, other = JobKey("ml", "nightly"), JobKey("ml", "nightly", "prod-eu")
    manifest = {"kind": "AdvancedCronJob", "metadata": {"name": "nightly"}, "spec": {"schedule": "0 2 * * *"}}
    assert store.put_cron_job(key, manifest, "h1") == "created"
    uid = store.get_cron_job(key).uid  # type: ignore[union-attr]
    assert [store.put_cron_job(key, manifest, "h1"), store.put_cron_job(key, manifest, "h2")] == [
        "unchanged", "configured"]
    assert uid and store.get_cron_job(key).uid == uid  # type: ignore[union-attr]  # its own, kept while applied
    store.put_cron_job(other, {"spec": {}}, "h")
    got = store.get_cron_job(other)
    assert got is not None and (got.key, got.key.cluster, got.manifest, got.spec_hash) == (
        "prod-eu:ml/nightly", "prod-eu", {"spec": {}}, "h")
    assert [(c.key, c.spec_hash) for c in store.list_cron_jobs()] == [("ml/nightly", "h2"), ("prod-eu:ml/nightly", "h")]
    assert (store.delete_cron_job(key), store.delete_cron_job(key)) == (True, False)
    assert store.get_cron_job(key) is None and store.list_jobs() == [] and store.list_rules() == []
    store.put_cron_job(key, manifest, "h2")  # applied again under its name: another cron job
    assert store.get_cron_job(key).uid not in {"", uid}  # type: ignore[union-attr]


def test_a_schedule_keeps_its_last_run(store: Store) -> None:
    store.record_run(ScheduleRun("sweep", started_at=1.0, finished_at=2.5))
    store.record_run(ScheduleRun("sweep", started_at=61.0, finished_at=62.0))
    assert store.last_runs(["sweep", "daily-round", "sweep"]) == {"sweep": ScheduleRun("sweep", 61.0, 62.0)}
    assert store.list_jobs() == [] and store.list_nodes() == [] and store.list_rules() == []


def test_clusters_register_and_record_how_they_answered(store: Store) -> None:
    prod = RegisteredCluster("prod-eu", endpoint="https://prod.example", ca_data="Q0E=", labels={"env": "prod"},
                             added_at=1.0)
    store.put_cluster(prod)
    store.record_cluster_check("prod-eu", reachable=False, reason="connection refused", checked_at=5.0, agents=3)
    store.record_cluster_check("gone", reachable=True, reason="", checked_at=5.0)
    store.record_cluster_check("home", reachable=True, reason="", checked_at=6.0, synced=True, own=True)
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod2.example", labels={}))
    got = store.get_cluster("prod-eu")
    assert got is not None and (got.endpoint, got.ca_data, got.labels, got.added_at, got.reachable, got.reason,
                                got.agents) == ("https://prod2.example", "", {}, None, False, "connection refused", 3)
    assert store.get_cluster("gone") is None
    home = store.get_cluster("home")
    assert home is not None and (home.reachable, home.reason, home.last_sync) == (True, "", 6)
    assert [c.name for c in store.list_clusters()] == ["home", "prod-eu"]
    assert (store.delete_cluster("prod-eu"), store.delete_cluster("prod-eu")) == (True, False)


def test_one_probe_chain_runs_per_cluster_and_only_its_probe_passes_it_on(store: Store) -> None:
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    # A chain starts once; another start is refused while its probe is due, and taken once it is long overdue
    assert store.probe_due("prod-eu") is None
    assert store.start_probe("prod-eu", "a", due=10.0, lost_before=0.0)
    assert not store.start_probe("prod-eu", "b", due=12.0, lost_before=2.0)
    assert store.probe_due("prod-eu") == 10.0
    assert store.start_probe("prod-eu", "c", due=80.0, lost_before=11.0)
    # Only the chain's probe passes it on, once; then it ends
    assert not store.pass_probe("prod-eu", "a", to="x", due=90.0)
    assert store.pass_probe("prod-eu", "c", to="d", due=90.0)
    assert store.probe_due("prod-eu") == 90.0
    assert not store.pass_probe("prod-eu", "c", to="e", due=90.0)
    assert store.pass_probe("prod-eu", "d", to=None)
    assert store.probe_due("prod-eu") is None
    assert store.probe_due("gone") is None
    assert store.start_probe("prod-eu", "f", due=95.0, lost_before=85.0)
    # A registered cluster no longer stored starts none; the stack's own gets an item for its chain
    assert not store.start_probe("gone", "g", due=10.0, lost_before=0.0)
    assert store.get_cluster("gone") is None
    assert store.start_probe("home", "h", due=10.0, lost_before=0.0, own=True)
    home = store.get_cluster("home")
    assert home is not None and home.name == "home"
    # and the cluster's own fields are untouched by its chain
    got = store.get_cluster("prod-eu")
    assert got is not None and got.endpoint == "https://prod.example"


def test_a_clusters_setup_is_recorded_and_a_cluster_recorded_before_setups_were_counts_as_installed(
        store: Store) -> None:
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example", setup=ClusterSetup.FAILED,
                                        setup_message="cluster prod-eu runs Kubernetes v1.29.8"))
    got = store.get_cluster("prod-eu")
    assert got is not None and (got.setup, got.setup_message) == (ClusterSetup.FAILED,
                                                                  "cluster prod-eu runs Kubernetes v1.29.8")
    # Recorded again, installed: the old message goes
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    got = store.get_cluster("prod-eu")
    assert got is not None and (got.setup, got.setup_message) == (ClusterSetup.INSTALLED, "")
    # An item as this version's stores wrote none: no setup at all (the own cluster's health item too)
    store.record_cluster_check("home", reachable=True, reason="", checked_at=6.0, own=True)
    home = store.get_cluster("home")
    assert home is not None and home.setup is ClusterSetup.INSTALLED


def test_each_write_leaves_the_items_the_adapter_leaves(store: Store) -> None:
    # `MemoryJobStore.item_keys` is what a scan of the adapter's table finds (test_schedule_runs.py counts them)
    planned(store, ["a", "b"], shards=2)
    store.put_excluded(KEY, [ExcludedNode("x", "not Ready")], shards=2)
    store.record_run(ScheduleRun("sweep", 1.0, 2.0))
    store.record_run(ScheduleRun("sweep", 3.0, 4.0))
    store.put_node(RegisteredNode(name="n", labels={}, architecture="", os="", queue_url="", last_hello=0,
                                  cluster="prod-eu"))
    store.put_rule("r", {"spec": {}}, "h")
    store.put_cluster(RegisteredCluster("prod-eu"))
    store.list_running_jobs()  # the first reader marks the table indexed
    if isinstance(store, DynamoJobStore):
        items = store.client.scan(TableName=store.table_name)["Items"]
        keys = sorted((i["pk"]["S"], i["sk"]["S"]) for i in items)
    else:
        assert isinstance(store, MemoryJobStore)
        keys = store.item_keys()
    shard = {n: dynamodb.shard_of(n, 2) for n in ("a", "b", "x")}
    assert keys == sorted([("CLUSTER#prod-eu", "CLUSTER"), (f"JOB#{KEY}", "JOB"), ("NODE#prod-eu:n", "NODE"),
                           ("INDEX#running", "INDEX"), ("INDEX#flight", KEY),
                           ("RULE#r", "RULE"), ("SCHEDULE#sweep", "RUN"), (f"JOB#{KEY}#{shard['a']}", "NODE#a"),
                           (f"JOB#{KEY}#{shard['b']}", "NODE#b"), (f"JOB#{KEY}#{shard['x']}", "EXCL#x")])


def test_a_value_boto3_cannot_write_is_refused_before_any_write(store: Store) -> None:
    store.create_job(job())
    with pytest.raises(TypeError, match="Unsupported type"):
        store.set_job_fields(KEY, {"message": object()})
    assert store.get_job(KEY) == job()


def test_an_item_over_400_kb_is_refused(store: Store) -> None:
    def padded(size: int) -> dict[str, Any]:
        return {"spec": {"image": "r.example/app:v1", "pad": "x" * size}}

    assert refusal(lambda: store.create_job(job(manifest=padded(300_000)))) == ""
    assert refusal(lambda: store.create_job(job("big", manifest=padded(420_000)))) == "StoreError"
    assert refusal(lambda: store.set_job_fields(KEY, {"message": "m" * 150_000})) == "StoreError"
    assert store.get_job("default/big") is None and store.get_job(KEY).message == ""  # type: ignore[union-attr]


def test_a_registry_budget_reserves_each_batch_s_starts_in_one_write_and_continues_from_it(store: Store) -> None:
    assert store.reserve_pull_starts("ecr:1:r", [], now=5.0, burst_seconds=1.0) == ()
    assert store.reserve_pull_starts("ecr:1:r", [0.5, 0.5, 0.5], now=5.0, burst_seconds=1.0) == (5.0, 5.0, 5.5)
    assert store.reserve_pull_starts("ecr:1:r", [0.5], now=5.0, burst_seconds=1.0) == (6.0,)
    assert store.reserve_pull_starts("ghcr.io", [0.5], now=5.0, burst_seconds=1.0) == (5.0,)
    assert store.reserve_pull_starts("ecr:1:r", [0.5], now=60.0, burst_seconds=1.0) == (60.0,)


def test_a_registry_budget_reserves_no_start_beyond_the_horizon(store: Store) -> None:
    assert store.reserve_pull_starts("ecr:1:h", [400.0] * 4, now=0.0, burst_seconds=0.0, horizon=900.0) == (
        0.0, 400.0, 800.0)
    # The pull held back took none of the budget: the next batch starts where the third one ended
    assert store.reserve_pull_starts("ecr:1:h", [400.0] * 2, now=0.0, burst_seconds=0.0, horizon=900.0) == ()
    assert store.reserve_pull_starts("ecr:1:h", [1.0], now=500.0, burst_seconds=0.0, horizon=900.0) == (1200.0,)


def test_a_registry_budget_keeps_the_rates_its_last_reservation_was_made_at(store: Store) -> None:
    assert store.get_budget("ecr:1:r") is None
    store.reserve_pull_starts("ecr:1:r", [0.5, 0.5], now=5.0, burst_seconds=0.0)
    assert store.get_budget("ecr:1:r") == BudgetState(6.0, RegistryBudget(requests_per_second=0.0))
    budget = RegistryBudget(requests_per_second=24.0, bytes_per_second=1e6)
    store.reserve_pull_starts("ecr:1:r", [0.5], now=5.0, burst_seconds=0.0, budget=budget)
    assert store.get_budget("ecr:1:r") == BudgetState(6.5, budget)


def test_every_method_of_the_ports_is_in_the_fake_with_the_adapters_signature() -> None:
    import inspect

    methods = {name for port in (ports.JobStore, ports.ScheduleRuns) for name in dir(port)
               if not name.startswith("_")}
    for name in methods:
        memory, adapter = getattr(MemoryJobStore, name), getattr(DynamoJobStore, name)
        assert inspect.signature(memory) == inspect.signature(adapter), name
    for name in {m for m in dir(ports.TaskQueues) if not m.startswith("_")} | {"ensure_queue", "find_queue",
                                                                                 "queue_url", "queue_name"}:
        assert inspect.signature(getattr(MemoryTaskQueues, name)) == inspect.signature(getattr(NodeQueues, name)), name


# --- node queues -----------------------------------------------------------------------------


@pytest.fixture(params=["sqs", "memory"])
def queues(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """(the stack's node queues, where their messages are taken from): on moto's SQS, or in memory."""
    if request.param == "memory":
        sqs = MemorySqs()
        return MemoryTaskQueues("pw0", sqs.create_queue("prewarm-status"), sqs=sqs), sqs
    client = request.getfixturevalue("aws")[1]
    prefix = f"pw{next(_tables)}"  # queues of their own (SQS refuses a deleted queue's name for 60 s)
    status = client.create_queue(QueueName=f"status-{prefix}")["QueueUrl"]
    return NodeQueues(prefix, status, client=client), client


def pull(node: str, job_key: str = KEY, cluster: str = "") -> PullTask:
    return PullTask(job=job_key, job_uid="u1", round=0, node=node, image="r.example/app:v1", cluster=cluster)


def test_a_task_reaches_the_queue_made_for_its_node_and_waits_for_a_node_without_one(queues: tuple[Any, Any]) -> None:
    q, sqs = queues
    url = q.ensure_queue("n1")
    assert url == q.queue_url("n1") == q.ensure_queue("n1") and url.endswith(f"/{q.prefix}-n1")
    assert q.send(pull("n1")) and not q.send(pull("n2"))
    assert q.send_many([pull("n1", "default/other"), CancelTask(job=KEY, job_uid="u1", round=0, node="n1"),
                        pull("n2")]) == []
    got = take_node_messages(sqs, url)
    # send_many sends side by side, and a standard queue keeps no order: the messages, in any order
    assert sorted((type(m).__name__, getattr(m, "job", "")) for m in got) == sorted([
        ("PullTask", KEY), ("PullTask", "default/other"), ("CancelTask", KEY)])
    assert take_node_messages(sqs, url) == [] and take_node_messages(sqs, q.queue_url("n2")) == []


def test_a_task_with_a_start_later_waits_in_its_queue_until_then(queues: tuple[Any, Any]) -> None:
    q, sqs = queues
    url = q.ensure_queue("n1")
    # A start 60 s away: held back (SendMessage's DelaySeconds); one without a delay: delivered at once
    assert q.send(pull("n1").model_copy(update={"delay_seconds": 60}))
    assert q.send(pull("n1", "default/other"))
    assert [m.job for m in take_node_messages(sqs, url) if isinstance(m, PullTask)] == ["default/other"]


def test_each_cluster_has_its_own_queues_and_a_message_finds_its_clusters(queues: tuple[Any, Any]) -> None:
    q, sqs = queues
    prod = q.for_cluster("prod-eu") if isinstance(q, MemoryTaskQueues) else NodeQueues(
        q.prefix, f"{q.base_url}/prewarm-status", client=sqs, cluster="prod-eu")
    own_url, prod_url = q.ensure_queue("n1"), prod.ensure_queue("n1")
    assert own_url != prod_url and prod_url == q.queue_url("n1", "prod-eu")
    assert q.send(pull("n1", "prod-eu:default/warm", "prod-eu"))
    assert q.send(RequiredImages(node="n1", cluster="prod-eu", as_of=1.0))
    assert [type(m).__name__ for m in take_node_messages(sqs, prod_url)] == ["PullTask", "RequiredImages"]
    assert take_node_messages(sqs, own_url) == []
    assert list(q.list_node_queues()) == [q.queue_name("n1")]
    assert list(q.list_node_queues("prod-eu")) == [prod.queue_name("n1")]
    assert (q.queue_node(own_url), q.queue_node(prod_url)) == ("n1", "prod-eu:n1")


def test_only_the_stacks_own_queues_are_owned_and_deleting_a_missing_one_is_fine(queues: tuple[Any, Any]) -> None:
    q, sqs = queues
    url = q.ensure_queue("n1")
    name = f"{q.prefix}-other-stack"  # another stack's, whose prefix starts with this one's
    other = sqs.create_queue(name) if isinstance(sqs, MemorySqs) else sqs.create_queue(QueueName=name)["QueueUrl"]
    assert sorted(q.list_node_queues()) == [q.queue_name("n1"), name]
    assert (q.owns_queue(url), q.owns_queue(other), q.queue_node(other)) == (True, False, None)
    q.delete_queue(url)
    q.delete_queue(url)
    assert (q.owns_queue(url), q.queue_node(url), q.send(pull("n1"))) == (False, None, False)
    assert list(q.list_node_queues()) == [name]
    with pytest.raises(QueueRetryableError, match="deleted less than 60 s ago"):
        q.ensure_queue("n1")


SENDERS = ["arn:aws:iam::123456789012:role/stack-DispatchJobRole", "arn:aws:iam::123456789012:role/stack-SweepRole"]
OLD_ROLES_POLICY = {"Version": "2012-10-17", "Statement": [{
    "Sid": "OnlyPrewarmSends", "Effect": "Allow", "Principal": {"AWS": ["AROAOLDROLEID1234567"]},
    "Action": "sqs:SendMessage", "Resource": "*"}]}


def stack_queues(q: Any, sqs: Any) -> Any:
    """The same queues as a stack with senders and a DLQ makes them."""
    if isinstance(q, MemoryTaskQueues):
        return MemoryTaskQueues(q.prefix, f"{q.base_url}/status", sqs=sqs, sender_arns=SENDERS,
                                dlq_arn=f"arn:aws:sqs:us-west-2:123456789012:{q.prefix}dlq")
    dlq = sqs.create_queue(QueueName=f"{q.prefix}dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return NodeQueues(q.prefix, f"{q.base_url}/status", client=sqs, dlq_arn=arn, sender_arns=SENDERS)


def attributes(q: Any, sqs: Any, url: str) -> tuple[dict[str, str], dict[str, str]]:
    """(attributes, tags) of a queue, as the stack's attributes name them."""
    if isinstance(sqs, MemorySqs):
        queue = sqs.queue(url)
        return dict(queue.attributes), dict(queue.tags)
    names = [*q._attributes(), "Policy", "RedrivePolicy"]
    return (sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names).get("Attributes", {}),
            sqs.list_queue_tags(QueueUrl=url).get("Tags", {}))


def test_a_queue_is_made_once_with_the_stacks_policy_and_found_by_name(queues: tuple[Any, Any]) -> None:
    q, sqs = stack_queues(*queues), queues[1]
    assert q.find_queue("n1") is None and q.find_queue("n1", "prod-eu") is None
    made = q.provide_queue("n1")
    again = q.provide_queue("n1")
    prod = q.provide_queue("n1", "prod-eu")
    assert (made.created, made.repaired, again.created, again.repaired) == (True, (), False, ())
    assert made.url == again.url == q.find_queue("n1") and prod.url == q.find_queue("n1", "prod-eu") != made.url
    attrs, tags = attributes(q, sqs, made.url)
    assert attribute_drift(attrs, q._attributes()) == {}
    assert foreign_principals(attrs["Policy"], SENDERS) == []
    assert tags == {"prewarm:node-queue-prefix": q.prefix, "prewarm:node": "n1"}
    assert attributes(q, sqs, prod.url)[1]["prewarm:cluster"] == "prod-eu"


def test_a_queue_made_by_someone_else_is_set_back_to_the_stacks_policy_attributes_and_tags(
        queues: tuple[Any, Any]) -> None:
    q, sqs = stack_queues(*queues), queues[1]
    # Given a node's queue made before its hello by someone else: their policy, a delay, no tags
    name, foreign = q.queue_name("n1"), {"Policy": json.dumps(OLD_ROLES_POLICY), "DelaySeconds": "900"}
    if isinstance(sqs, MemorySqs):
        sqs.create_queue(name, {}, foreign)
    else:
        sqs.create_queue(QueueName=name, Attributes=foreign)
    # When the control plane provides the node's queue
    provided = q.provide_queue("n1")
    # Then the same queue is set back: tags first, then every attribute that was not the stack's
    assert (provided.created, provided.url) == (False, q.queue_url("n1"))
    assert provided.repaired == ("tags", "DelaySeconds", "Policy", "ReceiveMessageWaitTimeSeconds", "RedrivePolicy",
                                 "VisibilityTimeout")
    attrs, tags = attributes(q, sqs, provided.url)
    assert tags["prewarm:node"] == "n1"
    assert attribute_drift(attrs, q._attributes()) == {} and q.queue_node(provided.url) == "n1"
    assert q.provide_queue("n1").repaired == () and q.repair_queue(provided.url) == ()


def test_the_sweeps_repair_sets_back_only_this_stacks_queues(queues: tuple[Any, Any]) -> None:
    q, sqs = stack_queues(*queues), queues[1]
    url = q.ensure_queue("n1")
    other = f"{q.prefix}-other-stack"  # another stack's (a longer prefix): untouched
    policy = {"Policy": json.dumps(OLD_ROLES_POLICY)}
    if isinstance(sqs, MemorySqs):
        sqs.queue(url).attributes.update(policy)
        other_url = sqs.create_queue(other, {}, policy)
    else:
        sqs.set_queue_attributes(QueueUrl=url, Attributes=policy)
        other_url = sqs.create_queue(QueueName=other, Attributes=policy)["QueueUrl"]
    # A queue whose policy names a recreated stack's old roles is set back; another stack's is not this one's
    assert q.repair_queue(url) == ("Policy",) and q.repair_queue(url) == ()
    assert q.repair_queue(other_url) is None
    assert foreign_principals(attributes(q, sqs, other_url)[0]["Policy"], SENDERS) == ["AROAOLDROLEID1234567"]
    q.delete_queue(url)
    assert q.repair_queue(url) is None


def test_a_message_over_1_mib_is_not_sent_and_said_so(queues: tuple[Any, Any]) -> None:
    q, _ = queues
    q.ensure_queue("n1")
    images = [RequiredImage(image="r.example/" + "x" * 200 + f"/{i}", job=KEY) for i in range(6_000)]
    big = RequiredImages(node="n1", as_of=1.0, images=images)
    assert len(big.model_dump_json().encode()) > 1_048_576
    (failure,) = q.send_many([big])
    assert failure[0] == "n1" and "InvalidParameterValue" in failure[1]


# --- the status queue's redelivery -----------------------------------------------------------


@pytest.fixture(params=["sqs", "memory"])
def status(request: pytest.FixtureRequest) -> tuple[Any, list[str], Callable[[], int]]:
    """(the status queue as `record_status` hands messages back, the receipt handles of three messages
    received from it, how many of them are back on the queue now)."""
    if request.param == "memory":
        receipts = ["r1", "r2", "r3"]
        memory = MemoryStatusQueue(receipts)
        return memory, receipts, lambda: sum(1 for seconds in memory.hidden.values() if seconds == 0)
    client = request.getfixturevalue("aws")[1]
    url = client.create_queue(QueueName=f"status-{next(_tables)}", Attributes={"VisibilityTimeout": "180"})[
        "QueueUrl"]
    for body in ("a", "b", "c"):
        client.send_message(QueueUrl=url, MessageBody=body)
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(got) == 3
    return (StatusQueue(url, client=client), [m["ReceiptHandle"] for m in got],
            lambda: len(client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])))


def test_messages_handed_back_come_again_after_their_delay_and_a_refusal_is_logged_not_raised(
    status: tuple[Any, list[str], Callable[[], int]], caplog: pytest.LogCaptureFixture
) -> None:
    queue, receipts, back_now = status
    queue.deliver_again_after([(receipts[0], 0), (receipts[1], 120), ("not-a-receipt-handle", 0)])
    assert back_now() == 1
    assert "keeps the queue's visibility timeout" in caplog.text


@pytest.fixture(params=["sqs", "memory"])
def probes(request: pytest.FixtureRequest) -> tuple[Any, Callable[[], list[tuple[ClusterProbe, int]]]]:
    """(the probe queue, what it holds now and what is delayed, as (probe, delay) or (probe, -1) once visible)."""
    if request.param == "memory":
        memory = MemoryProbeQueue()
        return memory, lambda: list(memory.probes)
    client = request.getfixturevalue("aws")[1]
    url = client.create_queue(QueueName=f"probes-{next(_tables)}")["QueueUrl"]

    def held() -> list[tuple[ClusterProbe, int]]:
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        delayed = int(client.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]["ApproximateNumberOfMessagesDelayed"])
        return [(ClusterProbe.model_validate_json(m["Body"]), -1) for m in got] + [(PROBE, 900)] * delayed

    return ProbeQueue(url, client=client), held


PROBE = ClusterProbe(cluster="prod-eu", chain="c1")


def test_a_probe_is_sent_with_its_delay_and_a_delay_past_sqs_s_900_s_is_refused(
        probes: tuple[Any, Callable[[], list[tuple[ClusterProbe, int]]]]) -> None:
    queue, held = probes
    queue.send_probe(PROBE, delay=900)
    with pytest.raises(QueueError):
        queue.send_probe(PROBE, delay=901)
    # Held, not received before its delay
    assert held() == [(PROBE, 900)]
