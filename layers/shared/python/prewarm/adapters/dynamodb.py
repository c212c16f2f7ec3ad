"""The job store on one DynamoDB table (key design and capacity model in docs/architecture.md).

Phase changes of a batch of reports and the job counters are written together in `TransactWriteItems`,
each node item guarded by its `version`, so duplicated or reordered reports can never double-count;
progress writes only its node item. Client error codes become the store's error types: a failed
condition is a conflict (re-read, decide again), throttling is retryable.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from prewarm.domain.job import ApiKind, JobRound, StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import NodePhase
from prewarm.domain.nodes import NodeWarm, RegisteredNode
from prewarm.domain.placement import ExcludedNode
from prewarm.domain.schedules import ScheduleRun
from prewarm.domain.status import Counters, NodeTaskRecord, NodeUpdate, removal_deltas
from prewarm.services.ports import StoreConflictError, StoreError, StoreRetryableError

_RETRYABLE = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
}
_COUNTERS = ("desired", "waiting", "active", "succeeded", "failed", "done")
_BATCH = 25
_BATCH_GET = 100
# TransactWriteItems takes at most 100 actions (DynamoDB quotas): 99 node items and the job item.
MAX_NODES_PER_TRANSACTION = 99
NODES_PER_SHARD = 100
MAX_SHARDS = 64

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _plain(value: Any) -> Any:
    """Python value → what TypeSerializer accepts (floats become Decimals)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _ser(value: Any) -> dict[str, Any]:
    return _serializer.serialize(_plain(value))  # type: ignore[no-any-return]


def _item(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _ser(v) for k, v in values.items() if v is not None}


def _python(value: Any) -> Any:
    """A deserialized attribute as the store's records hold it: numbers as int or float, sets sorted."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, set):
        return sorted(value)
    return value


def _unitem(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _python(_deserializer.deserialize(v)) for k, v in item.items()}


def job_pk(key: str) -> str:
    return f"JOB#{key}"


def node_sk(node: str) -> str:
    return f"NODE#{node}"


def excluded_sk(node: str) -> str:
    return f"EXCL#{node}"


def task_pk(key: str, shard: int) -> str:
    """The partition key of a job's node items in one shard."""
    return f"JOB#{key}#{shard}"


def shard_of(node: str, shards: int) -> int:
    """The shard a node's items live in: a stable hash, so every writer finds the same one."""
    if shards <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:4], "big") % shards


def _error(e: ClientError, what: str) -> StoreError:
    code = e.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        return StoreConflictError(f"{what}: the item changed or the condition does not hold")
    if code == "TransactionCanceledException":
        reasons = [r.get("Code", "") for r in e.response.get("CancellationReasons", [])]
        if any(r in _RETRYABLE or r in {"ThrottlingError", "TransactionConflict"} for r in reasons):
            return StoreRetryableError(f"{what}: transaction throttled or in conflict ({', '.join(reasons)})")
        return StoreConflictError(f"{what}: transaction condition failed ({', '.join(r or 'None' for r in reasons)})")
    if code in _RETRYABLE:
        return StoreRetryableError(f"{what}: {code}")
    message = e.response.get("Error", {}).get("Message", "")
    return StoreError(f"{what}: {code}: {message}" if code and message else f"{what}: {code or e}")


def job_of_item(item: Mapping[str, Any] | None) -> StoredJob | None:
    """The job an item of the table holds, as the table stream shows it (plain values); None for any
    other item (node items, rules, nodes, schedule runs)."""
    if not item or item.get("sk") != "JOB":
        return None
    return DynamoJobStore._job({k: _python(v) for k, v in item.items()})


def _registered_node(v: Mapping[str, Any]) -> RegisteredNode:
    return RegisteredNode(name=v["name"], labels=v.get("labels", {}), architecture=v.get("architecture", ""),
                          os=v.get("os", ""), queue_url=v.get("queue_url", ""), last_hello=v.get("last_hello", 0),
                          warm_until=float(v["warm_until"]) if "warm_until" in v else None,
                          warm=_node_warm(v.get("warm")))


def _node_warm(value: Any) -> NodeWarm | None:
    if not isinstance(value, dict):
        return None
    return NodeWarm(joined_at=float(value.get("joined_at", 0)), hello_at=float(value.get("hello_at", 0)),
                    warm_at=float(value.get("warm_at", 0)), outcome=str(value.get("outcome", "")),
                    missing=tuple(str(m) for m in value.get("missing", [])),
                    missing_total=int(value.get("missing_total", 0)))


class DynamoJobStore:
    """`JobStore` on the JobsTable. Give it a boto3 DynamoDB client, or it builds one on first use."""

    def __init__(self, table_name: str, client: Any = None) -> None:
        self.table_name = table_name
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client("dynamodb", config=Config(retries={"mode": "standard", "max_attempts": 8}))
        return self._client

    def _call(self, what: str, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return getattr(self.client, op)(TableName=self.table_name, **kwargs)  # type: ignore[no-any-return]
        except ClientError as e:
            raise _error(e, what) from e

    def _transact(self, what: str, items: list[dict[str, Any]]) -> None:
        for entry in items:
            next(iter(entry.values()))["TableName"] = self.table_name
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as e:
            raise _error(e, what) from e

    def _query(self, what: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        while True:
            page = self._call(what, "query", **kwargs)
            for item in page.get("Items", []):
                yield _unitem(item)
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _batch_write(self, what: str, requests: list[dict[str, Any]]) -> None:
        for start in range(0, len(requests), _BATCH):
            self._until_processed(what, "batch_write_item", "UnprocessedItems",
                                  {self.table_name: requests[start : start + _BATCH]})

    def _until_processed(self, what: str, op: str, unprocessed: str, pending: dict[str, Any]) -> list[dict[str, Any]]:
        """Calls a batch operation again with what it left unprocessed (throttled keys), backing off."""
        responses: list[dict[str, Any]] = []
        delay = 0.05
        for _ in range(10):
            try:
                out = getattr(self.client, op)(RequestItems=pending)
            except ClientError as e:
                raise _error(e, what) from e
            responses += out.get("Responses", {}).get(self.table_name, [])
            pending = out.get(unprocessed) or {}
            if not pending:
                return responses
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise StoreRetryableError(f"{what}: items left unprocessed after retries")

    # -- jobs -------------------------------------------------------------------------------

    @staticmethod
    def _job_item(job: StoredJob) -> dict[str, Any]:
        c = job.counters
        return _item(
            {
                "pk": job_pk(job.key),
                "sk": "JOB",
                "kind": "job",
                "namespace": job.namespace,
                "name": job.name,
                "uid": job.uid,
                "api_kind": job.api_kind,
                # Stored as `spec`, the attribute existing tables already hold.
                "spec": json.dumps(job.manifest, sort_keys=True),
                "spec_hash": job.spec_hash,
                "generation": job.generation,
                "round": job.round,
                "planned": job.planned,
                "state": job.state,
                "version": job.version,
                "desired": c.desired,
                "waiting": c.waiting,
                "active": c.active,
                "succeeded": c.succeeded,
                "failed": c.failed,
                "done": c.done,
                "shards": job.shards or None,
                "platforms": json.dumps(job.platforms),
                "start_time": job.start_time,
                "completion_time": job.completion_time,
                "message": job.message,
                "ttl": job.ttl,
                "created_at": job.created_at,
                "owner": job.owner or None,
                "children": job.children or None,
                "pull_secret_arns": job.pull_secret_arns or None,
            }
        )

    @staticmethod
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
            start_time=values.get("start_time"),
            completion_time=values.get("completion_time"),
            message=values.get("message", ""),
            ttl=values.get("ttl"),
            created_at=values.get("created_at"),
            owner=values.get("owner", ""),
            children=list(values.get("children", [])),
            pull_secret_arns=list(values.get("pull_secret_arns", [])),
        )

    def _key(self, pk: str, sk: str) -> dict[str, Any]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    def get_job(self, key: str, *, consistent: bool = True) -> StoredJob | None:
        out = self._call("get job", "get_item", Key=self._key(job_pk(key), "JOB"), ConsistentRead=consistent)
        return self._job(_unitem(out["Item"])) if "Item" in out else None

    def create_job(self, job: StoredJob) -> None:
        self._call(
            f"create job {job.key}", "put_item", Item=self._job_item(job),
            ConditionExpression="attribute_not_exists(pk)",
        )

    def replace_job_spec(self, job: StoredJob, *, expected_hash: str) -> None:
        fields = {
            "spec": json.dumps(job.manifest, sort_keys=True),
            "spec_hash": job.spec_hash,
            "generation": job.generation,
            "round": job.round,
            "api_kind": job.api_kind,
            "platforms": json.dumps(job.platforms),
            "state": job.state,
            "start_time": job.start_time,
            "completion_time": job.completion_time,
            "message": job.message,
            "ttl": job.ttl,
        }
        self._update(
            f"update job {job.key}", job_pk(job.key), "JOB", fields,
            condition="spec_hash = :expected_hash", values={":expected_hash": expected_hash},
        )

    def _update(
        self,
        what: str,
        pk: str,
        sk: str,
        fields: Mapping[str, Any],
        *,
        condition: str | None = None,
        values: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
    ) -> None:
        self._call(what, "update_item", **self._update_args(pk, sk, fields, condition, values, add))

    def _update_args(
        self,
        pk: str,
        sk: str,
        fields: Mapping[str, Any],
        condition: str | None = None,
        values: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        names: dict[str, str] = {}
        vals: dict[str, Any] = {}
        sets, removes, adds = [], [], []
        for i, (k, v) in enumerate(fields.items()):
            names[f"#f{i}"] = k
            if v is None:
                removes.append(f"#f{i}")
            else:
                sets.append(f"#f{i} = :f{i}")
                vals[f":f{i}"] = _ser(v)
        for i, (k, v) in enumerate((add or {}).items()):
            names[f"#a{i}"] = k
            adds.append(f"#a{i} :a{i}")
            vals[f":a{i}"] = _ser(v)
        expr = " ".join(
            part
            for part in (
                "SET " + ", ".join(sets) if sets else "",
                "REMOVE " + ", ".join(removes) if removes else "",
                "ADD " + ", ".join(adds) if adds else "",
            )
            if part
        )
        args: dict[str, Any] = {"Key": self._key(pk, sk), "UpdateExpression": expr}
        for placeholder in re.findall(r"#\w+", condition or ""):
            names.setdefault(placeholder, placeholder[1:])
        if condition:
            args["ConditionExpression"] = condition
            vals.update({k: _ser(v) for k, v in (values or {}).items()})
        if names:
            args["ExpressionAttributeNames"] = names
        if vals:
            args["ExpressionAttributeValues"] = vals
        return args

    def set_job_fields(self, key: str, fields: Mapping[str, Any], *, condition_state: JobState | None = None) -> None:
        if "platforms" in fields:
            fields = {k: json.dumps(v) if k == "platforms" else v for k, v in fields.items()}
        self._update(
            f"update job {key}", job_pk(key), "JOB", fields,
            condition="attribute_exists(pk)" + (" AND #state = :state" if condition_state else ""),
            values={":state": condition_state} if condition_state else None,
        )

    def _list_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every item of a kind: keys from the keys-only `kinds` index, then the items themselves.

        The index projects keys only, so counter updates on job items never write it: with all
        attributes projected, every report of every job would land on the index key `job`.
        """
        keys = [
            {"pk": {"S": v["pk"]}, "sk": {"S": v["sk"]}}
            for v in self._query(f"list {kind}s", IndexName="kinds", KeyConditionExpression="kind = :k",
                                 ExpressionAttributeValues={":k": {"S": kind}})
        ]
        return self._batch_get(f"read {kind}s", keys)

    def _batch_get(self, what: str, keys: list[dict[str, Any]], *, consistent: bool = True) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for start in range(0, len(keys), _BATCH_GET):
            request = {self.table_name: {"Keys": keys[start : start + _BATCH_GET], "ConsistentRead": consistent}}
            items += [_unitem(i) for i in self._until_processed(what, "batch_get_item", "UnprocessedKeys", request)]
        return items

    def list_jobs(self) -> list[StoredJob]:
        return sorted((self._job(v) for v in self._list_kind("job")), key=lambda r: r.key)

    def delete_job(self, key: str) -> None:
        """Deletes the node and excluded items of every shard, then the job item (a retry finds the rest)."""
        keys = [
            {"DeleteRequest": {"Key": self._key(v["pk"], v["sk"])}}
            for pk in self._shard_pks(key, self._shards(key, None))
            for v in self._query(
                f"read job {key}", KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": pk}},
                ProjectionExpression="pk, sk", ConsistentRead=True,
            )
        ]
        self._batch_write(f"delete job {key}", keys)
        self._call(f"delete job {key}", "delete_item", Key=self._key(job_pk(key), "JOB"))

    # -- node tasks -------------------------------------------------------------------------
    #
    # A job's node items (and its excluded nodes) are spread over `shards` partition keys, each node
    # always in the same one. DynamoDB serves one partition key value at most 1,000 WCU/s
    # (developer guide, "Partitions and data distribution" / "burst and adaptive capacity"); 5,000
    # nodes reporting progress every 5 s write 1,000 node items per second, so one key per job would
    # throttle. `reserve_shards` fixes the count at the first plan: one shard per `NODES_PER_SHARD`
    # nodes considered, at most `MAX_SHARDS`.

    def reserve_shards(self, key: str, nodes: int) -> int:
        wanted = max(1, min(MAX_SHARDS, -(-nodes // NODES_PER_SHARD)))
        try:
            self._update(f"fix the shards of {key}", job_pk(key), "JOB", {"shards": wanted},
                         condition="attribute_exists(pk) AND attribute_not_exists(#shards)")
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

    @staticmethod
    def _task_item(key: str, task: NodeTaskRecord, shards: int) -> dict[str, Any]:
        pk = task_pk(key, shard_of(task.node, shards))
        waiting = task.phase is NodePhase.WAITING and task.dispatched_at is None
        return _item(
            {
                "pk": pk,
                "sk": node_sk(task.node),
                "node": task.node,
                "round": task.round,
                "phase": task.phase.value,
                "dispatched_at": task.dispatched_at,
                "attempt": task.attempt,
                "seq": task.seq,
                "version": task.version,
                "bytes_done": task.bytes_done,
                "bytes_total": task.bytes_total,
                "image_id": task.image_id,
                "message": task.message,
                "started_at": task.started_at,
                "finished_at": task.finished_at,
                "updated_at": task.updated_at,
                # sparse index of the tasks still waiting for a parallelism slot, per shard
                "wpk": pk if waiting else None,
            }
        )

    @staticmethod
    def _task(values: dict[str, Any]) -> NodeTaskRecord:
        return NodeTaskRecord(
            node=values["node"],
            round=values["round"],
            phase=NodePhase(values["phase"]),
            dispatched_at=values.get("dispatched_at"),
            attempt=values.get("attempt", 0),
            seq=values.get("seq", 0),
            version=values.get("version", 0),
            bytes_done=values.get("bytes_done"),
            bytes_total=values.get("bytes_total"),
            image_id=values.get("image_id"),
            message=values.get("message", ""),
            started_at=values.get("started_at"),
            finished_at=values.get("finished_at"),
            updated_at=values.get("updated_at"),
        )

    def _shard_items(self, what: str, key: str, shards: int, prefix: str) -> Iterator[dict[str, Any]]:
        for pk in self._shard_pks(key, shards):
            yield from self._query(
                what, KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues={":pk": {"S": pk}, ":p": {"S": prefix}}, ConsistentRead=True,
            )

    def get_tasks(self, key: str, *, shards: int | None = None) -> list[NodeTaskRecord]:
        items = self._shard_items(f"read tasks of {key}", key, self._shards(key, shards), "NODE#")
        return sorted((self._task(v) for v in items), key=lambda t: t.node)

    def get_task(self, key: str, node: str, *, shards: int | None = None) -> NodeTaskRecord | None:
        pk = task_pk(key, shard_of(node, self._shards(key, shards)))
        out = self._call("get task", "get_item", Key=self._key(pk, node_sk(node)), ConsistentRead=True)
        return self._task(_unitem(out["Item"])) if "Item" in out else None

    def get_tasks_of(self, ref: JobRound, nodes: Iterable[str]) -> dict[str, NodeTaskRecord]:
        keys = [self._key(task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n)) for n in sorted(set(nodes))]
        return {t.node: t for t in (self._task(v) for v in self._batch_get(f"read tasks of {ref.key}", keys))}

    def failed_nodes(self, key: str, *, shards: int | None = None) -> list[str]:
        return [t.node for t in self.get_tasks(key, shards=shards) if t.failed]

    def waiting_nodes(self, key: str, limit: int, *, shards: int | None = None, start: int = 0) -> list[str]:
        """Up to `limit` nodes still waiting for a slot (eventually consistent; claims re-check), read
        from shard `start` on (modulo the shards), then the shards after it in turn."""
        nodes: list[str] = []
        pks = self._shard_pks(key, self._shards(key, shards))  # at least one
        first = start % len(pks)
        for pk in pks[first:] + pks[:first]:
            if len(nodes) >= limit:
                break
            out = self._call(
                "read waiting tasks", "query", IndexName="waiting", KeyConditionExpression="wpk = :pk",
                ExpressionAttributeValues={":pk": {"S": pk}}, Limit=limit - len(nodes),
            )
            nodes += [item["sk"]["S"].removeprefix("NODE#") for item in out.get("Items", [])]
        return nodes

    def put_tasks(self, key: str, tasks: Sequence[NodeTaskRecord], *, shards: int) -> None:
        self._batch_write(f"write tasks of {key}",
                          [{"PutRequest": {"Item": self._task_item(key, t, shards)}} for t in tasks])

    def delete_tasks(self, key: str, nodes: Sequence[str], *, shards: int) -> None:
        self._batch_write(
            f"delete tasks of {key}",
            [{"DeleteRequest": {"Key": self._key(task_pk(key, shard_of(n, shards)), node_sk(n))}} for n in nodes],
        )

    def get_excluded(self, key: str, *, shards: int | None = None) -> list[ExcludedNode]:
        items = self._shard_items(f"read excluded nodes of {key}", key, self._shards(key, shards), "EXCL#")
        return sorted((ExcludedNode(v["node"], v.get("reason", "")) for v in items), key=lambda e: e.name)

    def put_excluded(self, key: str, excluded: Sequence[ExcludedNode], *, shards: int) -> None:
        """Replaces the job's excluded nodes: each is an item of its own, so the job item never grows."""
        wanted = {e.name: e for e in excluded}
        stale = [e.name for e in self.get_excluded(key, shards=shards) if e.name not in wanted]
        requests = [
            {"PutRequest": {"Item": _item({"pk": task_pk(key, shard_of(e.name, shards)), "sk": excluded_sk(e.name),
                                           "node": e.name, "reason": e.reason})}}
            for e in wanted.values()
        ]
        requests += [
            {"DeleteRequest": {"Key": self._key(task_pk(key, shard_of(n, shards)), excluded_sk(n))}} for n in stale
        ]
        self._batch_write(f"write excluded nodes of {key}", requests)

    def commit_plan(
        self,
        key: str,
        *,
        plan_id: str,
        expected_version: int,
        counters: Counters,
        extra: Mapping[str, Any],
    ) -> None:
        fields: dict[str, Any] = {
            "planned": plan_id,
            "desired": counters.desired,
            "waiting": counters.waiting,
            "active": counters.active,
            "succeeded": counters.succeeded,
            "failed": counters.failed,
            "done": counters.done,
            **extra,
        }
        self._update(
            f"commit plan of {key}", job_pk(key), "JOB", fields,
            condition="#version = :v", values={":v": expected_version}, add={"version": 1},
        )

    def _node_update(self, ref: JobRound, update: NodeUpdate) -> dict[str, Any]:
        fields = dict(update.fields)
        if "phase" in fields and fields["phase"] != NodePhase.WAITING.value:
            fields["wpk"] = None
        return self._update_args(
            task_pk(ref.key, shard_of(update.node, ref.shards)), node_sk(update.node), fields,
            condition="#version = :v AND #round = :r", values={":v": update.expected_version, ":r": ref.round},
            add={"version": 1},
        )

    def update_task(self, ref: JobRound, update: NodeUpdate) -> None:
        """One node item alone (progress): the job item is not written."""
        self._call(f"record {update.node} in {ref.key}", "update_item", **self._node_update(ref, update))

    def apply_updates(self, ref: JobRound, updates: Sequence[NodeUpdate], deltas: Mapping[str, int]) -> None:
        """Node items and one job counter update in one transaction (at most 99 nodes: 100 actions)."""
        if len(updates) > MAX_NODES_PER_TRANSACTION:
            raise ValueError(f"{len(updates)} node updates in one transaction; at most {MAX_NODES_PER_TRANSACTION}")
        items = [{"Update": self._node_update(ref, u)} for u in updates]
        adds: dict[str, Any] = {k: v for k, v in deltas.items() if v}
        if adds:
            adds["version"] = 1
            job = self._update_args(job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r",
                                    values={":u": ref.uid, ":r": ref.round}, add=adds)
            items.append({"Update": job})
        self._transact(f"record {len(updates)} nodes in {ref.key}", items)

    def add_task(self, ref: JobRound, task: NodeTaskRecord, *, plan_id: str) -> None:
        """Adds one node to a planned round, counting it, atomically (new nodes, edited selectors)."""
        put = {
            "Item": self._task_item(ref.key, task, ref.shards),
            "ConditionExpression": "attribute_not_exists(pk) OR #round < :r",
            "ExpressionAttributeNames": {"#round": "round"},
            "ExpressionAttributeValues": {":r": _ser(task.round)},
        }
        job = self._update_args(
            job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r AND #planned = :p",
            values={":u": ref.uid, ":r": task.round, ":p": plan_id},
            add={"desired": 1, "waiting": 1, "version": 1},
        )
        self._transact(f"add {task.node} to {ref.key}", [{"Put": put}, {"Update": job}])

    def remove_task(self, ref: JobRound, task: NodeTaskRecord) -> None:
        """Removes one node from the round and from the counters, atomically (deselected nodes)."""
        delete = {
            "Key": self._key(task_pk(ref.key, shard_of(task.node, ref.shards)), node_sk(task.node)),
            "ConditionExpression": "#version = :v",
            "ExpressionAttributeNames": {"#version": "version"},
            "ExpressionAttributeValues": {":v": _ser(task.version)},
        }
        job = self._update_args(
            job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r",
            values={":u": ref.uid, ":r": task.round}, add={**removal_deltas(task), "version": 1},
        )
        self._transact(f"remove {task.node} from {ref.key}", [{"Delete": delete}, {"Update": job}])

    def claim_tasks(self, ref: JobRound, nodes: Sequence[str], *, parallelism: int, now: float) -> list[str]:
        """Dispatches `nodes` in one transaction: each still waiting, and `active` stays within `parallelism`.

        A node another run claimed first cancels the transaction; it is dropped and the rest tried
        again, so the job item is written once per batch of claims, not once per node.
        """
        pending = list(dict.fromkeys(nodes))[:MAX_NODES_PER_TRANSACTION]
        while pending:
            claims = [
                self._update_args(
                    task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n), {"dispatched_at": now, "wpk": None},
                    condition="attribute_not_exists(dispatched_at) AND #round = :r AND #phase = :w",
                    values={":r": ref.round, ":w": NodePhase.WAITING.value}, add={"version": 1},
                )
                for n in pending
            ]
            job = self._update_args(
                job_pk(ref.key), "JOB", {}, condition="#active <= :most AND #round = :r AND #state = :running",
                values={":most": parallelism - len(pending), ":r": ref.round, ":running": JobState.RUNNING},
                add={"active": len(pending), "waiting": -len(pending), "version": 1},
            )
            for entry in claims:
                entry["TableName"] = self.table_name
            job["TableName"] = self.table_name
            try:
                self.client.transact_write_items(TransactItems=[{"Update": c} for c in claims] + [{"Update": job}])
            except ClientError as e:
                reasons = [r.get("Code", "") for r in e.response.get("CancellationReasons", [])]
                if e.response.get("Error", {}).get("Code") != "TransactionCanceledException" or any(
                    r not in ("", "None", "ConditionalCheckFailed") for r in reasons
                ):
                    raise _error(e, f"claim {len(pending)} nodes in {ref.key}") from e
                if len(reasons) > len(pending) and reasons[len(pending)] == "ConditionalCheckFailed":
                    # The job has fewer free slots than asked for (or left the round): ask for fewer.
                    pending = pending[:-1]
                    continue
                taken = {n for n, r in zip(pending, reasons, strict=False) if r == "ConditionalCheckFailed"}
                pending = [n for n in pending if n not in taken]
                continue
            return pending
        return []

    def finish_job(self, key: str, fields: Mapping[str, Any], *, require_done: bool = True) -> bool:
        condition = "#state = :running" + (" AND #done = #desired" if require_done else "")
        try:
            self._update(f"finish job {key}", job_pk(key), "JOB", fields, condition=condition,
                         values={":running": JobState.RUNNING}, add={"version": 1})
        except StoreConflictError:
            return False
        return True

    # -- markers, rules, nodes --------------------------------------------------------------

    def put_rule(self, name: str, spec: dict[str, Any], spec_hash: str) -> str:
        """Writes a rule; returns `created`, `configured` or `unchanged`, as kubectl says it."""
        current = self._call("get rule", "get_item", Key=self._key(f"RULE#{name}", "RULE"), ConsistentRead=True)
        if "Item" in current and _unitem(current["Item"]).get("spec_hash") == spec_hash:
            return "unchanged"
        self._call(
            f"write rule {name}", "put_item",
            Item=_item({"pk": f"RULE#{name}", "sk": "RULE", "kind": "rule", "name": name,
                        "spec": json.dumps(spec, sort_keys=True), "spec_hash": spec_hash}),
        )
        return "configured" if "Item" in current else "created"

    def list_rules(self) -> list[dict[str, Any]]:
        return [json.loads(v["spec"]) for v in sorted(self._list_kind("rule"), key=lambda v: str(v["name"]))]

    def delete_rule(self, name: str) -> bool:
        out = self._call(f"delete rule {name}", "delete_item", Key=self._key(f"RULE#{name}", "RULE"),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out

    def put_node(self, node: RegisteredNode) -> None:
        # An update, not a put: a later hello (a restarted agent) keeps how the node warmed. A hello
        # that holds the taint starts a new warm-up (a new node with a reused name), so it drops it.
        fields = {"kind": "node", "name": node.name, "labels": node.labels, "architecture": node.architecture,
                  "os": node.os, "queue_url": node.queue_url, "last_hello": node.last_hello,
                  "warm_until": node.warm_until}
        if node.warm_until is not None:
            fields["warm"] = None
        self._update(f"register node {node.name}", f"NODE#{node.name}", "NODE", fields)

    def record_warm(self, node: str, warm: NodeWarm) -> None:
        """Stores how the node warmed; `StoreConflictError` when the node is not registered (yet)."""
        value = {"joined_at": warm.joined_at, "hello_at": warm.hello_at, "warm_at": warm.warm_at,
                 "outcome": warm.outcome, "missing": list(warm.missing), "missing_total": warm.missing_total}
        self._update(f"record how node {node} warmed (not registered: no hello yet)", f"NODE#{node}", "NODE",
                     {"warm": value}, condition="attribute_exists(pk)")

    def get_node(self, name: str) -> RegisteredNode | None:
        out = self._call(f"read node {name}", "get_item", Key=self._key(f"NODE#{name}", "NODE"))
        return _registered_node(_unitem(out["Item"])) if "Item" in out else None

    def list_nodes(self) -> list[RegisteredNode]:
        return [_registered_node(v) for v in sorted(self._list_kind("node"), key=lambda v: str(v["name"]))]

    def delete_node(self, name: str) -> None:
        self._call(f"forget node {name}", "delete_item", Key=self._key(f"NODE#{name}", "NODE"))

    # -- schedule runs ----------------------------------------------------------------------
    #
    # One item per schedule, overwritten by each run: the sweep's costs one write a minute. No `kind`,
    # so the items stay out of the kinds index (and its writes), and `sk` is not JOB, so the stream's
    # filter keeps them from dispatch_job.

    def record_run(self, run: ScheduleRun) -> None:
        self._call(
            f"record the {run.schedule} run", "put_item",
            Item=_item({"pk": f"SCHEDULE#{run.schedule}", "sk": "RUN", "schedule": run.schedule,
                        "started_at": run.started_at, "finished_at": run.finished_at}),
        )

    def last_runs(self, schedules: Sequence[str]) -> dict[str, ScheduleRun]:
        """The last recorded run of each of `schedules` that has one."""
        keys = [self._key(f"SCHEDULE#{name}", "RUN") for name in dict.fromkeys(schedules)]
        return {
            v["schedule"]: ScheduleRun(v["schedule"], started_at=float(v["started_at"]),
                                       finished_at=float(v["finished_at"]))
            for v in self._batch_get("read schedule runs", keys)
        }
