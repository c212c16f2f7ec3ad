"""`MemoryJobStore`: the job store in memory, for the services' unit tests (no moto, no boto3).

Every method of `prewarm.adapters.dynamodb.DynamoJobStore` (`JobStore` and `ScheduleRuns`), with the same
names and signatures and the adapter's semantics, not a loose fake: the items are those the adapter
writes (`MemoryTable`, by pk and sk), under the same conditions, so the same writes are refused with
`StoreConflictError`; counters move inside the same all-or-nothing transactions; node items are spread
over the same shards; reads hand back new domain objects in the adapter's order. DynamoDB's own
behaviour shows as the services see it: sort key order, 400 KB items, a key named twice in a batch or a
transaction refused (`StoreError`). Consistent and eventually consistent reads are the same here.

`tests/unit/adapters/test_memory_store_contract.py` runs the same scenarios on both stores.
Not modelled: throttling and `TransactionConflict` (tests inject `StoreRetryableError`), tables written
before the `running` or `flight` index existed (tests/unit/adapters/test_dynamodb_status_batches.py), and DynamoDB's
TTL deletions (the sweep deletes expired jobs itself).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped
from prewarm.domain.job import ApiKind, EarlierImage, JobRound, StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.lifecycle import wanted_repository
from prewarm.domain.messages import NodePhase
from prewarm.domain.placement import ExcludedNode
from prewarm.domain.status import Counters, NodeTaskRecord, NodeUpdate, removal_deltas
from prewarm.services.ports import StoreConflictError
from tests.support.memory_items import (
    MemoryBudgetItems,
    MemoryClusterItems,
    MemoryCronJobItems,
    MemoryNodeItems,
    MemoryRuleItems,
    MemoryScheduleRunItems,
    MemoryWarmBudgetItems,
    MemoryWarmSnapshotItems,
    TableItems,
)
from tests.support.memory_table import (
    Action,
    Condition,
    Delete,
    Item,
    MemoryTable,
    Put,
    Update,
    at_most,
    below,
    equal,
    has,
)

__all__ = ["MAX_NODES_PER_TRANSACTION", "MAX_SHARDS", "NODES_PER_SHARD", "MemoryJobStore", "MemoryTable",
           "shard_of"]

_COUNTERS = ("desired", "waiting", "active", "succeeded", "failed", "done")
NODES_PER_SHARD = 100
MAX_SHARDS = 64
MAX_NODES_PER_TRANSACTION = 99
RUNNING = "running"
# The adapter's marker that every job item is indexed (its first `list_running_jobs` writes it): no job
# item here predates the index, so only the marker is written.
_INDEXED = ("INDEX#running", "INDEX")
IMAGES_KEY = "ipk"
_IMAGES_INDEXED = ("INDEX#images", "INDEX")


def job_pk(key: str) -> str:
    return f"JOB#{key}"


def task_pk(key: str, shard: int) -> str:
    return f"JOB#{key}#{shard}"


def node_sk(node: str) -> str:
    return f"NODE#{node}"


def excluded_sk(node: str) -> str:
    return f"EXCL#{node}"


def shard_of(node: str, shards: int) -> int:
    """The shard a node's items live in (the adapter's `shard_of`: the contract test holds them equal)."""
    if shards <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:4], "big") % shards


def _running(cluster: str) -> str:
    return scoped(cluster, "job")


def _runs(job: StoredJob) -> bool:
    return job.state is JobState.RUNNING


def _images(job: StoredJob) -> str | None:
    repository = wanted_repository(job)
    return None if repository is None else scoped(job.cluster, repository)


def _job_item(job: StoredJob) -> dict[str, Any]:
    c = job.counters
    return {
        "pk": job_pk(job.key), "sk": "JOB", "kind": "job", "namespace": job.namespace, "name": job.name,
        "uid": job.uid, "api_kind": job.api_kind, "spec": json.dumps(job.manifest, sort_keys=True),
        "spec_hash": job.spec_hash, "generation": job.generation, "round": job.round, "planned": job.planned,
        "state": job.state, "version": job.version, "desired": c.desired, "waiting": c.waiting,
        "active": c.active, "succeeded": c.succeeded, "failed": c.failed, "done": c.done,
        "shards": job.shards or None, "platforms": json.dumps(job.platforms), "layers": job.layers,
        "image_bytes": job.image_bytes,
        "start_time": job.start_time, "completion_time": job.completion_time, "message": job.message, "ttl": job.ttl,
        "created_at": job.created_at, "owner": job.owner or None, "children": job.children or None,
        "pull_secret_arns": job.pull_secret_arns or None, "placement_note": job.placement_note or None,
        "seeds": job.seeds or None, "first_estimate": job.first_estimate or None, "parked": job.parked or None,
        "awaits_replica": job.awaits_replica or None,
        "warm_digest": job.warm_digest or None, "warm_bytes": job.warm_bytes,
        "budget_note": job.budget_note or None,
        "earlier": job.earlier.to_json() if job.earlier else None, "pinned_until": job.pinned_until,
        RUNNING: _running(job.cluster) if _runs(job) else None, IMAGES_KEY: _images(job),
        "cluster": job.cluster or None,
    }


def _job(values: Mapping[str, Any]) -> StoredJob:
    return StoredJob(
        namespace=values["namespace"],
        name=values["name"],
        uid=values["uid"],
        api_kind=ApiKind(values["api_kind"]),
        manifest=json.loads(values["spec"]),
        spec_hash=values["spec_hash"],
        generation=values.get("generation", 1),
        round=values.get("round", 0),
        planned=values.get("planned", ""),
        state=JobState(values.get("state", JobState.RUNNING)),
        version=values.get("version", 0),
        counters=Counters(**{k: values.get(k, 0) for k in _COUNTERS if k != "done"}),
        shards=values.get("shards", 0),
        deleting_since=values.get("deleting_since"),
        platforms=json.loads(values.get("platforms", "[]")),
        layers=values.get("layers"),
        image_bytes=int(values["image_bytes"]) if values.get("image_bytes") is not None else None,
        start_time=values.get("start_time"),
        completion_time=values.get("completion_time"),
        message=values.get("message", ""),
        ttl=values.get("ttl"),
        created_at=values.get("created_at"),
        owner=values.get("owner", ""),
        children=list(values.get("children", [])),
        pull_secret_arns=list(values.get("pull_secret_arns", [])),
        placement_note=values.get("placement_note", ""),
        seeds=list(values.get("seeds", [])), first_estimate=values.get("first_estimate", ""),
        parked=values.get("parked", ""), awaits_replica=values.get("awaits_replica", ""),
            warm_digest=values.get("warm_digest", ""), warm_bytes=values.get("warm_bytes"),
            budget_note=values.get("budget_note", ""),
        earlier=EarlierImage.from_json(values.get("earlier")),
        pinned_until=int(values["pinned_until"]) if values.get("pinned_until") is not None else None,
        cluster=values.get("cluster", DEFAULT_CLUSTER),
    )


def _task_item(key: str, task: NodeTaskRecord, shards: int) -> dict[str, Any]:
    pk = task_pk(key, shard_of(task.node, shards))
    waiting = task.phase is NodePhase.WAITING and task.dispatched_at is None
    return {
        "pk": pk, "sk": node_sk(task.node), "node": task.node, "round": task.round, "phase": task.phase.value,
        "dispatched_at": task.dispatched_at, "attempt": task.attempt, "seq": task.seq, "version": task.version,
        "bytes_done": task.bytes_done, "bytes_total": task.bytes_total, "image_id": task.image_id,
        "message": task.message, "started_at": task.started_at, "finished_at": task.finished_at,
        "updated_at": task.updated_at, "starts_at": task.starts_at, "held_at": task.held_at,
        "wpk": pk if waiting else None,
        "fpk": pk if task.dispatched_at is not None and not task.phase.is_terminal else None,
    }


def _task(values: Mapping[str, Any]) -> NodeTaskRecord:
    return NodeTaskRecord(
        node=values["node"], round=values["round"], phase=NodePhase(values["phase"]),
        dispatched_at=values.get("dispatched_at"), attempt=values.get("attempt", 0), seq=values.get("seq", 0),
        version=values.get("version", 0), bytes_done=values.get("bytes_done"),
        bytes_total=values.get("bytes_total"), image_id=values.get("image_id"), message=values.get("message", ""),
        started_at=values.get("started_at"), finished_at=values.get("finished_at"),
        updated_at=values.get("updated_at"), starts_at=values.get("starts_at"),
        held_at=values.get("held_at"),
    )


def _slots_free(ref: JobRound, most: int) -> Condition:
    """`#active <= :most AND #round = :r AND #state = :running`: the job has room for the claims."""
    return lambda i: at_most(i, "active", most) and equal(i, "round", ref.round) and equal(i, "state", JobState.RUNNING)


class MemoryJobItems(TableItems):
    """`JobItems`: one item per job (`JOB#<key>`, sort key `JOB`)."""

    def get_job(self, key: str, *, consistent: bool = True) -> StoredJob | None:
        item = self.table.get(job_pk(key), "JOB")
        return _job(item) if item is not None else None

    def create_job(self, job: StoredJob) -> None:
        self.table.put(f"create job {job.key}", _job_item(job), condition=lambda i: not has(i, "pk"))

    def replace_job_spec(self, job: StoredJob, *, expected_hash: str) -> None:
        fields = {
            "spec": json.dumps(job.manifest, sort_keys=True), "spec_hash": job.spec_hash,
            "generation": job.generation, "round": job.round, "api_kind": job.api_kind,
            "platforms": json.dumps(job.platforms), "layers": job.layers, "image_bytes": job.image_bytes,
            "state": job.state,
            "start_time": job.start_time,
            "completion_time": job.completion_time, "message": job.message, "ttl": job.ttl,
            "warm_digest": job.warm_digest or None, "warm_bytes": job.warm_bytes,
            "budget_note": job.budget_note or None,
            "earlier": job.earlier.to_json() if job.earlier else None, "pinned_until": job.pinned_until,
            RUNNING: _running(job.cluster) if _runs(job) else None, IMAGES_KEY: _images(job),
        }
        self.table.update(f"update job {job.key}", job_pk(job.key), "JOB", fields,
                          condition=lambda i: equal(i, "spec_hash", expected_hash))

    def set_job_fields(self, key: str, fields: Mapping[str, Any], *, condition_state: JobState | None = None) -> None:
        if "platforms" in fields:
            fields = {k: json.dumps(v) if k == "platforms" else v for k, v in fields.items()}
        if "state" in fields and fields["state"] != JobState.RUNNING:
            fields = {**fields, RUNNING: None}
        if fields.get("state") == JobState.DELETING:
            fields = {**fields, IMAGES_KEY: None}
        self.table.update(f"update job {key}", job_pk(key), "JOB", fields, condition=lambda i: has(i, "pk") and (
            condition_state is None or equal(i, "state", condition_state)))

    def list_jobs(self) -> list[StoredJob]:
        return sorted((_job(v) for v in self._list_kind("job")), key=lambda r: r.key)

    def list_running_jobs(self, cluster: str = DEFAULT_CLUSTER) -> list[StoredJob]:
        if self.table.get(*_INDEXED) is None:  # the adapter marks the table indexed on its first read
            self.table.put("write the index marker", {"pk": _INDEXED[0], "sk": _INDEXED[1]})
        items = self.table.index(RUNNING, _running(cluster))
        return sorted((_job(v) for v in items if v.get("sk") == "JOB"), key=lambda r: r.key)

    def list_image_jobs(self, cluster: str, repository: str) -> list[StoredJob]:
        if self.table.get(*_IMAGES_INDEXED) is None:
            self.table.put("write the index marker", {"pk": _IMAGES_INDEXED[0], "sk": _IMAGES_INDEXED[1]})
        items = self.table.index(IMAGES_KEY, scoped(cluster, repository))
        return sorted((_job(v) for v in items if v.get("sk") == "JOB"), key=lambda r: r.key)

    def delete_job(self, key: str) -> None:
        deletes: list[Put | Delete] = [
            Delete(v["pk"], v["sk"]) for pk in self._shard_pks(key, self._shards(key, None))
            for v in self.table.query(pk)
        ]
        self.table.batch_write(f"delete job {key}", deletes)
        self.table.delete(f"delete job {key}", job_pk(key), "JOB")

    def reserve_shards(self, key: str, nodes: int) -> int:
        wanted = max(1, min(MAX_SHARDS, -(-nodes // NODES_PER_SHARD)))
        try:
            self.table.update(f"fix the shards of {key}", job_pk(key), "JOB", {"shards": wanted},
                              condition=lambda i: has(i, "pk") and not has(i, "shards"))
        except StoreConflictError:
            record = self.get_job(key)
            return record.shards if record is not None and record.shards else wanted
        return wanted

    def _shards(self, key: str, shards: int | None) -> int:
        if shards is not None:
            return max(1, shards)
        record = self.get_job(key)
        return max(1, record.shards) if record is not None else 1

    @staticmethod
    def _shard_pks(key: str, shards: int) -> list[str]:
        return [task_pk(key, i) for i in range(shards)]

    def commit_plan(self, key: str, *, plan_id: str, expected_version: int, counters: Counters,
                    extra: Mapping[str, Any]) -> None:
        fields: dict[str, Any] = {
            "planned": plan_id, "desired": counters.desired, "waiting": counters.waiting, "active": counters.active,
            "succeeded": counters.succeeded, "failed": counters.failed, "done": counters.done, **extra,
        }
        self.table.update(f"commit plan of {key}", job_pk(key), "JOB", fields,
                          condition=lambda i: equal(i, "version", expected_version), add={"version": 1})

    def finish_job(self, key: str, fields: Mapping[str, Any], *, require_done: bool = True) -> bool:
        def holds(i: Item | None) -> bool:
            if not equal(i, "state", JobState.RUNNING):
                return False
            return not require_done or (i is not None and "desired" in i and equal(i, "done", i["desired"]))

        try:
            self.table.update(f"finish job {key}", job_pk(key), "JOB", {**fields, RUNNING: None}, condition=holds,
                              add={"version": 1})
        except StoreConflictError:
            return False
        return True


class MemoryNodeTaskItems(MemoryJobItems):
    """`NodeTaskItems`: each job round's node items (`JOB#<key>#<shard>`, `NODE#<node>`) and excluded nodes
    (`EXCL#<node>`); the writes that count change the job item in the same transaction."""

    def get_tasks(self, key: str, *, shards: int | None = None) -> list[NodeTaskRecord]:
        pks = self._shard_pks(key, self._shards(key, shards))
        return sorted((_task(v) for pk in pks for v in self.table.query(pk, "NODE#")), key=lambda t: t.node)

    def get_task(self, key: str, node: str, *, shards: int | None = None) -> NodeTaskRecord | None:
        item = self.table.get(task_pk(key, shard_of(node, self._shards(key, shards))), node_sk(node))
        return _task(item) if item is not None else None

    def get_tasks_of(self, ref: JobRound, nodes: Iterable[str]) -> dict[str, NodeTaskRecord]:
        keys = [(task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n)) for n in sorted(set(nodes))]
        return {t.node: t for t in (_task(v) for v in self.table.batch_get(keys))}

    def in_flight_tasks(self, ref: JobRound) -> list[NodeTaskRecord]:
        items = [v for pk in self._shard_pks(ref.key, ref.shards) for v in self.table.index("fpk", pk, order="sk")]
        tasks = (_task(v) for v in items)
        return sorted((t for t in tasks if t.dispatched_at is not None and not t.phase.is_terminal
                       and t.round == ref.round), key=lambda t: t.node)

    def failed_nodes(self, key: str, *, shards: int | None = None) -> list[str]:
        return [t.node for t in self.get_tasks(key, shards=shards) if t.failed]

    def waiting_nodes(self, key: str, limit: int, *, shards: int | None = None, start: int = 0) -> list[str]:
        nodes: list[str] = []
        pks = self._shard_pks(key, self._shards(key, shards))
        first = start % len(pks)
        for pk in pks[first:] + pks[:first]:
            if len(nodes) >= limit:
                break
            items = self.table.index("wpk", pk, order="sk")[: limit - len(nodes)]
            nodes += [item["sk"].removeprefix("NODE#") for item in items]
        return nodes

    def put_tasks(self, key: str, tasks: Sequence[NodeTaskRecord], *, shards: int) -> None:
        self.table.batch_write(f"write tasks of {key}", [Put(_task_item(key, t, shards)) for t in tasks])
        self.table.put("write the index marker", {"pk": "INDEX#flight", "sk": key})  # the adapter's: job indexed

    def delete_tasks(self, key: str, nodes: Sequence[str], *, shards: int) -> None:
        self.table.batch_write(f"delete tasks of {key}",
                               [Delete(task_pk(key, shard_of(n, shards)), node_sk(n)) for n in nodes])

    def get_excluded(self, key: str, *, shards: int | None = None) -> list[ExcludedNode]:
        pks = self._shard_pks(key, self._shards(key, shards))
        items = [v for pk in pks for v in self.table.query(pk, "EXCL#")]
        return sorted((ExcludedNode(v["node"], v.get("reason", "")) for v in items), key=lambda e: e.name)

    def put_excluded(self, key: str, excluded: Sequence[ExcludedNode], *, shards: int) -> None:
        wanted = {e.name: e for e in excluded}
        stale = [e.name for e in self.get_excluded(key, shards=shards) if e.name not in wanted]
        requests: list[Put | Delete] = [
            Put({"pk": task_pk(key, shard_of(e.name, shards)), "sk": excluded_sk(e.name), "node": e.name,
                 "reason": e.reason})
            for e in wanted.values()
        ]
        requests += [Delete(task_pk(key, shard_of(n, shards)), excluded_sk(n)) for n in stale]
        self.table.batch_write(f"write excluded nodes of {key}", requests)

    @staticmethod
    def _node_update(ref: JobRound, update: NodeUpdate) -> Update:
        pk = task_pk(ref.key, shard_of(update.node, ref.shards))
        fields = dict(update.fields)
        phase = fields.get("phase")
        if phase is not None and phase != NodePhase.WAITING.value:
            fields["wpk"] = None
        if phase is not None and NodePhase(phase).is_terminal:
            fields["fpk"] = None
        elif phase == NodePhase.PULLING.value or fields.get("dispatched_at") is not None:
            fields["fpk"] = pk
        return Update(pk, node_sk(update.node), fields,
                      {"version": 1}, lambda i: equal(i, "version", update.expected_version)
                      and equal(i, "round", ref.round))

    def update_task(self, ref: JobRound, update: NodeUpdate) -> None:
        self.table.write(f"record {update.node} in {ref.key}", self._node_update(ref, update))

    def apply_updates(self, ref: JobRound, updates: Sequence[NodeUpdate], deltas: Mapping[str, int]) -> None:
        if len(updates) > MAX_NODES_PER_TRANSACTION:
            raise ValueError(f"{len(updates)} node updates in one transaction; at most {MAX_NODES_PER_TRANSACTION}")
        items: list[Action] = [self._node_update(ref, u) for u in updates]
        adds: dict[str, Any] = {k: v for k, v in deltas.items() if v}
        if adds:
            adds["version"] = 1
            items.append(Update(job_pk(ref.key), "JOB", {}, adds,
                                lambda i: equal(i, "uid", ref.uid) and equal(i, "round", ref.round)))
        self.table.transact(f"record {len(updates)} nodes in {ref.key}", items)

    @staticmethod
    def _add_actions(ref: JobRound, tasks: Sequence[NodeTaskRecord], plan_id: str) -> list[Action]:
        puts: list[Action] = [
            Put(_task_item(ref.key, task, ref.shards), lambda i: not has(i, "pk") or below(i, "round", ref.round))
            for task in tasks
        ]
        job = Update(job_pk(ref.key), "JOB", {}, {"desired": len(tasks), "waiting": len(tasks), "version": 1},
                     lambda i: equal(i, "uid", ref.uid) and equal(i, "round", ref.round)
                     and equal(i, "planned", plan_id))
        return [*puts, job]

    def add_task(self, ref: JobRound, task: NodeTaskRecord, *, plan_id: str) -> None:
        self.table.transact(f"add {task.node} to {ref.key}", self._add_actions(ref, [task], plan_id))

    def add_tasks(self, ref: JobRound, tasks: Sequence[NodeTaskRecord], *, plan_id: str) -> list[str]:
        pending = list({t.node: t for t in tasks}.values())
        added: list[str] = []
        while pending:
            chunk = pending[:MAX_NODES_PER_TRANSACTION]
            reasons = self.table.transact_or_reasons(f"add {len(chunk)} nodes to {ref.key}",
                                                     self._add_actions(ref, chunk, plan_id))
            if reasons is not None:
                if len(reasons) > len(chunk) and reasons[len(chunk)] == "ConditionalCheckFailed":
                    return added
                present = {t.node for t, r in zip(chunk, reasons, strict=False) if r == "ConditionalCheckFailed"}
                pending = [t for t in pending if t.node not in present]
                continue
            added += [t.node for t in chunk]
            pending = pending[len(chunk):]
        return added

    def remove_task(self, ref: JobRound, task: NodeTaskRecord) -> None:
        delete = Delete(task_pk(ref.key, shard_of(task.node, ref.shards)), node_sk(task.node),
                        lambda i: equal(i, "version", task.version))
        job = Update(job_pk(ref.key), "JOB", {}, {**removal_deltas(task), "version": 1},
                     lambda i: equal(i, "uid", ref.uid) and equal(i, "round", task.round))
        self.table.transact(f"remove {task.node} from {ref.key}", [delete, job])

    def claim_tasks(self, ref: JobRound, nodes: Sequence[str], *, parallelism: int, now: float) -> list[str]:
        pending = list(dict.fromkeys(nodes))[:MAX_NODES_PER_TRANSACTION]
        while pending:
            claims: list[Action] = [
                Update(task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n),
                       {"dispatched_at": now, "starts_at": None, "held_at": None, "wpk": None,
                        "fpk": task_pk(ref.key, shard_of(n, ref.shards))},
                       {"version": 1}, lambda i: not has(i, "dispatched_at") and equal(i, "round", ref.round)
                       and equal(i, "phase", NodePhase.WAITING.value))
                for n in pending
            ]
            job = Update(job_pk(ref.key), "JOB", {}, {"active": len(pending), "waiting": -len(pending), "version": 1},
                         _slots_free(ref, parallelism - len(pending)))
            reasons = self.table.transact_or_reasons(f"claim {len(pending)} nodes in {ref.key}", [*claims, job])
            if reasons is not None:
                if len(reasons) > len(pending) and reasons[len(pending)] == "ConditionalCheckFailed":
                    pending = pending[:-1]
                    continue
                taken = {n for n, r in zip(pending, reasons, strict=False) if r == "ConditionalCheckFailed"}
                pending = [n for n in pending if n not in taken]
                continue
            return pending
        return []

    def record_pull_starts(self, ref: JobRound, starts: Mapping[str, float], *, held: Sequence[str] = (),
                           now: float) -> None:
        pending: dict[str, dict[str, float]] = {**{n: {"held_at": now} for n in held},
                                                **{n: {"starts_at": at} for n, at in starts.items()}}
        while pending:
            chunk = list(pending)[:MAX_NODES_PER_TRANSACTION]
            updates: list[Action] = [
                Update(task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n), pending[n], {},
                       lambda i: has(i, "dispatched_at") and equal(i, "round", ref.round))
                for n in chunk
            ]
            reasons = self.table.transact_or_reasons(f"record {len(chunk)} pull starts in {ref.key}", updates)
            refused = {n for n, r in zip(chunk, reasons or [], strict=False) if r == "ConditionalCheckFailed"}
            for node in chunk if reasons is None or not refused else refused:
                pending.pop(node)


class MemoryJobStore(MemoryNodeTaskItems, MemoryNodeItems, MemoryRuleItems, MemoryScheduleRunItems, MemoryCronJobItems,
                     MemoryClusterItems, MemoryWarmSnapshotItems, MemoryBudgetItems, MemoryWarmBudgetItems):
    """`JobStore` and `ScheduleRuns` in memory, as `DynamoJobStore` keeps them on the JobsTable. Stores
    given the same `MemoryTable` share it, as two Lambda containers share the table."""

    def __init__(self, table: MemoryTable | None = None) -> None:
        super().__init__(table)

    def item_keys(self) -> list[tuple[str, str]]:
        """Every item's (pk, sk): what a scan of the table finds."""
        return self.table.keys()
