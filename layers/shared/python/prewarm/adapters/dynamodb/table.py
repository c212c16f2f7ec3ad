"""The job table as every item kind's store uses it: (de)serialization, keys, client errors as the
store's error types, and the conditional, batched and paged calls (key design and capacity model in
docs/architecture.md)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from prewarm.domain.retry import Backoff, retry_on_conflict
from prewarm.services.ports import StoreConflictError, StoreError, StoreRetryableError

_RETRYABLE = {
    "ProvisionedThroughputExceededException",
    # A single UpdateItem/PutItem/DeleteItem on an item an in-flight transaction holds (DynamoDB
    # developer guide, "Transaction conflict handling"): the same write succeeds once it commits.
    "TransactionConflictException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
}
_BATCH = 25
_BATCH_GET = 100

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _serializable(value: Any) -> Any:
    """Python value → what TypeSerializer accepts (floats become Decimals)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _serializable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_serializable(v) for v in value]
    return value


def to_attribute(value: Any) -> dict[str, Any]:
    return _serializer.serialize(_serializable(value))  # type: ignore[no-any-return]


def to_item(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: to_attribute(v) for k, v in values.items() if v is not None}


def plain_value(value: Any) -> Any:
    """A deserialized attribute as the store's records hold it: numbers as int or float, sets sorted."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, set):
        return sorted(value)
    return value


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: plain_value(_deserializer.deserialize(v)) for k, v in item.items()}


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


def store_error(e: ClientError, what: str) -> StoreError:
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


# Throttled keys come back unprocessed: 50 ms doubling to 2 s, ten calls in all.
_UNPROCESSED_BACKOFF = Backoff(0.05, 2.0)
# A single write refused with TransactionConflictException was not applied, and the transaction that
# holds the item commits within milliseconds: botocore does not retry that code, so the table does,
# jittered (writers refused together do not come back together), 10 ms doubling to 0.5 s, 8 tries in
# all (about 1 s at most) before the caller gets StoreRetryableError.
_CONFLICT_BACKOFF = Backoff(0.01, 0.5, jitter=True)
_CONFLICT_ATTEMPTS = 8


class _Unprocessed(Exception):
    """A batch call left items unprocessed (throttling): call again with those."""


class _HeldByTransaction(Exception):
    """A single write met an item an in-flight transaction holds (TransactionConflictException)."""


class Table:
    """One DynamoDB table. Give it a boto3 DynamoDB client, or it builds one on first use."""

    def __init__(self, table_name: str, client: Any = None, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.table_name = table_name
        self._client = client
        self._sleep = sleep

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            # Connections for the status path's concurrent writes (services.reports.WRITERS) and then some.
            self._client = boto3.client("dynamodb", config=Config(retries={"mode": "standard", "max_attempts": 8},
                                                                  max_pool_connections=32))
        return self._client

    def _call(self, what: str, op: str, **kwargs: Any) -> dict[str, Any]:
        refusal: ClientError | None = None

        def attempt() -> dict[str, Any]:
            nonlocal refusal
            try:
                return getattr(self.client, op)(TableName=self.table_name, **kwargs)  # type: ignore[no-any-return]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") == "TransactionConflictException":
                    refusal = e
                    raise _HeldByTransaction from e
                raise store_error(e, what) from e

        def exhausted() -> StoreError:
            assert refusal is not None
            return store_error(refusal, what)

        return retry_on_conflict(attempt, conflict=_HeldByTransaction, attempts=_CONFLICT_ATTEMPTS,
                                 backoff=_CONFLICT_BACKOFF, exhausted=exhausted, sleep=self._sleep)

    def _transact(self, what: str, items: list[dict[str, Any]]) -> None:
        for entry in items:
            next(iter(entry.values()))["TableName"] = self.table_name
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as e:
            raise store_error(e, what) from e

    def _transact_or_reasons(self, what: str, items: list[dict[str, Any]]) -> list[str] | None:
        """Runs a transaction whose conditions may fail item by item: None once it commits; when only
        conditions failed, each action's cancellation reason in order (`ConditionalCheckFailed`, or
        `None`/empty for the rest). Any other refusal raises its store error."""
        for entry in items:
            next(iter(entry.values()))["TableName"] = self.table_name
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as e:
            reasons = [r.get("Code", "") for r in e.response.get("CancellationReasons", [])]
            if e.response.get("Error", {}).get("Code") != "TransactionCanceledException" or any(
                r not in ("", "None", "ConditionalCheckFailed") for r in reasons
            ):
                raise store_error(e, what) from e
            return reasons
        return None

    def _query(self, what: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        while True:
            page = self._call(what, "query", **kwargs)
            for item in page.get("Items", []):
                yield from_item(item)
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

        def call() -> list[dict[str, Any]]:
            nonlocal pending
            try:
                out = getattr(self.client, op)(RequestItems=pending)
            except ClientError as e:
                raise store_error(e, what) from e
            responses.extend(out.get("Responses", {}).get(self.table_name, []))
            pending = out.get(unprocessed) or {}
            if pending:
                raise _Unprocessed
            return responses

        return retry_on_conflict(
            call, conflict=_Unprocessed, attempts=10, backoff=_UNPROCESSED_BACKOFF,
            exhausted=lambda: StoreRetryableError(f"{what}: items left unprocessed after retries"),
        )

    def _key(self, pk: str, sk: str) -> dict[str, Any]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    def _put_spec(self, what: str, item: Mapping[str, Any], spec_hash: str, keep: tuple[str, ...] = ()) -> str:
        """Writes `item` (its `pk`, `sk` and `spec_hash` among its fields) unless the stored one has that spec
        hash, the stored item's `keep` fields kept; returns `created`, `configured` or `unchanged`, as kubectl
        says it."""
        key = self._key(item["pk"], item["sk"])
        current = self._call(f"get {what}", "get_item", Key=key, ConsistentRead=True)
        stored = from_item(current["Item"]) if "Item" in current else {}
        if "Item" in current and stored.get("spec_hash") == spec_hash:
            return "unchanged"
        kept = {name: stored[name] for name in keep if stored.get(name) is not None}
        self._call(f"write {what}", "put_item", Item=to_item({**item, **kept, "spec_hash": spec_hash}))
        return "configured" if "Item" in current else "created"

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
                vals[f":f{i}"] = to_attribute(v)
        for i, (k, v) in enumerate((add or {}).items()):
            names[f"#a{i}"] = k
            adds.append(f"#a{i} :a{i}")
            vals[f":a{i}"] = to_attribute(v)
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
            vals.update({k: to_attribute(v) for k, v in (values or {}).items()})
        if names:
            args["ExpressionAttributeNames"] = names
        if vals:
            args["ExpressionAttributeValues"] = vals
        return args

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
            items += [from_item(i) for i in self._until_processed(what, "batch_get_item", "UnprocessedKeys", request)]
        return items
