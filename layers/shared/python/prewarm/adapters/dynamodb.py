"""The job store on one DynamoDB table (key design in docs/architecture.md).

A report's node-item change and the job counters are written in one `TransactWriteItems`, guarded
by the node item's `version`, so duplicated or reordered reports can never double-count. Client
error codes become the store's error types: a failed condition is a conflict (re-read, decide
again), throttling is retryable.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from prewarm.domain.jobs import JobState
from prewarm.domain.messages import NodePhase
from prewarm.services.ports import (
    Counters,
    JobRecord,
    NodeTaskRecord,
    RegisteredNode,
    ReportUpdate,
    StoreConflictError,
    StoreError,
    StoreRetryableError,
)

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


def _unitem(item: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in item.items():
        value = _deserializer.deserialize(v)
        if isinstance(value, Decimal):
            value = int(value) if value == value.to_integral_value() else float(value)
        elif isinstance(value, set):
            value = sorted(value)
        out[k] = value
    return out


def _delete_from_set(update: dict[str, Any], attribute: str, value: str) -> None:
    update["UpdateExpression"] += " DELETE #del :del"
    update.setdefault("ExpressionAttributeNames", {})["#del"] = attribute
    update.setdefault("ExpressionAttributeValues", {})[":del"] = _ser({value})


def job_pk(key: str) -> str:
    return f"JOB#{key}"


def node_sk(node: str) -> str:
    return f"NODE#{node}"


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
    return StoreError(f"{what}: {code or e}")


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
            pending = {self.table_name: requests[start : start + _BATCH]}
            delay = 0.05
            for _ in range(10):
                try:
                    result = self.client.batch_write_item(RequestItems=pending)
                except ClientError as e:
                    raise _error(e, what) from e
                pending = result.get("UnprocessedItems") or {}
                if not pending:
                    break
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                raise StoreRetryableError(f"{what}: items left unprocessed after retries")

    # -- jobs -------------------------------------------------------------------------------

    @staticmethod
    def _job_item(job: JobRecord) -> dict[str, Any]:
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
                "failed_nodes": set(job.failed_nodes) or None,
                "excluded": json.dumps(job.excluded),
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
    def _job(values: dict[str, Any]) -> JobRecord:
        return JobRecord(
            namespace=values["namespace"],
            name=values["name"],
            uid=values["uid"],
            api_kind=values["api_kind"],
            manifest=json.loads(values["spec"]),
            spec_hash=values["spec_hash"],
            generation=values.get("generation", 1),
            round=values.get("round", 0),
            planned=values.get("planned", ""),
            state=JobState(values.get("state", JobState.RUNNING)),
            version=values.get("version", 0),
            counters=Counters(**{k: values.get(k, 0) for k in _COUNTERS if k != "done"}),
            failed_nodes=list(values.get("failed_nodes", [])),
            excluded=json.loads(values.get("excluded", "[]")),
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

    def get_job(self, key: str, *, consistent: bool = True) -> JobRecord | None:
        out = self._call("get job", "get_item", Key=self._key(job_pk(key), "JOB"), ConsistentRead=consistent)
        return self._job(_unitem(out["Item"])) if "Item" in out else None

    def create_job(self, job: JobRecord) -> None:
        self._call(
            f"create job {job.key}", "put_item", Item=self._job_item(job),
            ConditionExpression="attribute_not_exists(pk)",
        )

    def replace_job_spec(self, job: JobRecord, *, expected_hash: str) -> None:
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
        if "excluded" in fields or "platforms" in fields:
            fields = {k: json.dumps(v) if k in {"excluded", "platforms"} else v for k, v in fields.items()}
        self._update(
            f"update job {key}", job_pk(key), "JOB", fields,
            condition="attribute_exists(pk)" + (" AND #state = :state" if condition_state else ""),
            values={":state": condition_state} if condition_state else None,
        )

    def list_jobs(self) -> list[JobRecord]:
        return [
            self._job(v)
            for v in self._query(
                "list jobs", IndexName="by_kind", KeyConditionExpression="kind = :k",
                ExpressionAttributeValues={":k": {"S": "job"}},
            )
        ]

    def delete_job(self, key: str) -> None:
        keys = [
            {"DeleteRequest": {"Key": self._key(v["pk"], v["sk"])}}
            for v in self._query(
                f"read job {key}", KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": job_pk(key)}},
                ProjectionExpression="pk, sk", ConsistentRead=True,
            )
        ]
        self._batch_write(f"delete job {key}", keys)

    # -- node tasks -------------------------------------------------------------------------

    @staticmethod
    def _task_item(key: str, task: NodeTaskRecord) -> dict[str, Any]:
        waiting = task.phase is NodePhase.WAITING and task.dispatched_at is None
        return _item(
            {
                "pk": job_pk(key),
                "sk": node_sk(task.node),
                "kind": "task",
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
                # sparse index of the tasks still waiting for a parallelism slot
                "wpk": job_pk(key) if waiting else None,
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

    def get_tasks(self, key: str) -> list[NodeTaskRecord]:
        return [
            self._task(v)
            for v in self._query(
                f"read tasks of {key}", KeyConditionExpression="pk = :pk AND begins_with(sk, :node)",
                ExpressionAttributeValues={":pk": {"S": job_pk(key)}, ":node": {"S": "NODE#"}}, ConsistentRead=True,
            )
        ]

    def get_task(self, key: str, node: str) -> NodeTaskRecord | None:
        out = self._call("get task", "get_item", Key=self._key(job_pk(key), node_sk(node)), ConsistentRead=True)
        return self._task(_unitem(out["Item"])) if "Item" in out else None

    def waiting_nodes(self, key: str, limit: int) -> list[str]:
        """Up to `limit` nodes still waiting for a slot (eventually consistent; claims re-check)."""
        out = self._call(
            "read waiting tasks", "query", IndexName="waiting", KeyConditionExpression="wpk = :pk",
            ExpressionAttributeValues={":pk": {"S": job_pk(key)}}, Limit=limit,
        )
        return [item["sk"]["S"].removeprefix("NODE#") for item in out.get("Items", [])]

    def put_tasks(self, key: str, tasks: Sequence[NodeTaskRecord]) -> None:
        self._batch_write(f"write tasks of {key}", [{"PutRequest": {"Item": self._task_item(key, t)}} for t in tasks])

    def delete_tasks(self, key: str, nodes: Sequence[str]) -> None:
        self._batch_write(
            f"delete tasks of {key}", [{"DeleteRequest": {"Key": self._key(job_pk(key), node_sk(n))}} for n in nodes]
        )

    def commit_plan(
        self,
        key: str,
        *,
        plan_id: str,
        expected_version: int,
        counters: Counters,
        failed_nodes: Sequence[str],
        excluded: Sequence[Mapping[str, str]],
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
            "failed_nodes": set(failed_nodes) or None,
            "excluded": json.dumps(list(excluded)),
            **extra,
        }
        self._update(
            f"commit plan of {key}", job_pk(key), "JOB", fields,
            condition="#version = :v", values={":v": expected_version}, add={"version": 1},
        )

    def apply_update(self, update: ReportUpdate) -> None:
        node_fields = dict(update.fields)
        if "phase" in node_fields and node_fields["phase"] != NodePhase.WAITING.value:
            node_fields["wpk"] = None
        node = self._update_args(
            job_pk(update.job_key), node_sk(update.node), node_fields,
            condition="#version = :v AND #round = :r", values={":v": update.expected_version, ":r": update.round},
            add={"version": 1},
        )
        deltas: dict[str, Any] = {k: v for k, v in update.deltas.items() if v}
        deltas["version"] = 1
        if update.add_failed_node:
            deltas["failed_nodes"] = {update.node}
        job = self._update_args(
            job_pk(update.job_key), "JOB", {}, condition="#uid = :u AND #round = :r",
            values={":u": update.job_uid, ":r": update.round}, add=deltas,
        )
        if update.remove_failed_node:
            _delete_from_set(job, "failed_nodes", update.node)
        self._transact(f"record {update.node} in {update.job_key}", [{"Update": node}, {"Update": job}])

    def add_task(self, key: str, task: NodeTaskRecord, *, plan_id: str, job_uid: str) -> None:
        """Adds one node to a planned round, counting it, atomically (new nodes, edited selectors)."""
        item = self._task_item(key, task)
        put = {
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk) OR #round < :r",
            "ExpressionAttributeNames": {"#round": "round"},
            "ExpressionAttributeValues": {":r": _ser(task.round)},
        }
        job = self._update_args(
            job_pk(key), "JOB", {}, condition="#uid = :u AND #round = :r AND #planned = :p",
            values={":u": job_uid, ":r": task.round, ":p": plan_id},
            add={"desired": 1, "waiting": 1, "version": 1},
        )
        self._transact(f"add {task.node} to {key}", [{"Put": put}, {"Update": job}])

    def remove_task(self, key: str, task: NodeTaskRecord, *, job_uid: str) -> None:
        """Removes one node from the round and from the counters, atomically (deselected nodes)."""
        counter = (
            "succeeded" if task.phase is NodePhase.SUCCEEDED
            else "failed" if task.phase.is_terminal
            else "waiting" if task.dispatched_at is None
            else "active"
        )
        deltas: dict[str, Any] = {"desired": -1, counter: -1, "version": 1}
        if counter in {"succeeded", "failed"}:
            deltas["done"] = -1
        delete = {
            "Key": self._key(job_pk(key), node_sk(task.node)),
            "ConditionExpression": "#version = :v",
            "ExpressionAttributeNames": {"#version": "version"},
            "ExpressionAttributeValues": {":v": _ser(task.version)},
        }
        job = self._update_args(
            job_pk(key), "JOB", {}, condition="#uid = :u AND #round = :r",
            values={":u": job_uid, ":r": task.round}, add=deltas,
        )
        if counter == "failed":
            _delete_from_set(job, "failed_nodes", task.node)
        self._transact(f"remove {task.node} from {key}", [{"Delete": delete}, {"Update": job}])

    def claim_task(self, key: str, node: str, *, round: int, parallelism: int, now: float) -> bool:
        claim = self._update_args(
            job_pk(key), node_sk(node), {"dispatched_at": now, "wpk": None},
            condition="attribute_not_exists(dispatched_at) AND #round = :r AND #phase = :w",
            values={":r": round, ":w": NodePhase.WAITING.value}, add={"version": 1},
        )
        job = self._update_args(
            job_pk(key), "JOB", {}, condition="#active < :p AND #round = :r AND #state = :running",
            values={":p": parallelism, ":r": round, ":running": JobState.RUNNING},
            add={"active": 1, "waiting": -1, "version": 1},
        )
        try:
            self._transact(f"claim {node} in {key}", [{"Update": claim}, {"Update": job}])
        except StoreConflictError:
            return False
        return True

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
        return [
            json.loads(v["spec"])
            for v in self._query("list rules", IndexName="by_kind", KeyConditionExpression="kind = :k",
                                 ExpressionAttributeValues={":k": {"S": "rule"}})
        ]

    def delete_rule(self, name: str) -> bool:
        out = self._call(f"delete rule {name}", "delete_item", Key=self._key(f"RULE#{name}", "RULE"),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out

    def put_node(self, node: RegisteredNode) -> None:
        self._call(
            f"register node {node.name}", "put_item",
            Item=_item({"pk": f"NODE#{node.name}", "sk": "NODE", "kind": "node", "name": node.name,
                        "labels": node.labels, "architecture": node.architecture, "os": node.os,
                        "queue_url": node.queue_url, "last_hello": node.last_hello}),
        )

    def list_nodes(self) -> list[RegisteredNode]:
        return [
            RegisteredNode(name=v["name"], labels=v.get("labels", {}), architecture=v.get("architecture", ""),
                           os=v.get("os", ""), queue_url=v.get("queue_url", ""), last_hello=v.get("last_hello", 0))
            for v in self._query("list nodes", IndexName="by_kind", KeyConditionExpression="kind = :k",
                                 ExpressionAttributeValues={":k": {"S": "node"}})
        ]

    def delete_node(self, name: str) -> None:
        self._call(f"forget node {name}", "delete_item", Key=self._key(f"NODE#{name}", "NODE"))
