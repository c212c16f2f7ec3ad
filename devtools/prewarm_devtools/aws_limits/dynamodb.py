"""DynamoDB's limits in front of moto's handler: item size, transactions, conflicts, per-partition capacity.

Each wrapped `DynamoHandler` action (`DynamoDBLimits.guard`) sees the request's parameters and the
backend, checks what AWS would refuse before moto runs it, and counts the capacity the request
consumed against every partition key value it touched, the base table's and each GSI's.

Transaction conflicts (DynamoDB developer guide, "Transaction conflict handling in DynamoDB"): a
`PutItem`, `UpdateItem` or `DeleteItem` on an item an ongoing `TransactWriteItems` includes is refused
with `TransactionConflictException`, and a `TransactWriteItems` with an item another one includes is
cancelled with the reason `TransactionConflict`. Here each transaction holds its items for at least
`Quotas.transaction_hold_s` (the window), so concurrent writers meet it as on AWS; and for fault tests
`inject_conflicts(rate)` refuses that share of the writes on items transactions write, as if another
writer's transaction held them, whether or not one runs at that moment.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from moto.dynamodb.exceptions import DynamodbException, MockValidationException, TransactionCanceledException

from prewarm_devtools.aws_limits.counting import CapacityKey, TokenBucket
from prewarm_devtools.aws_limits.quotas import KIB
from prewarm_devtools.aws_limits.tables import ItemSnapshot, key_values

if TYPE_CHECKING:
    from moto.dynamodb.models.table import Table

    from prewarm_devtools.aws_limits.layer import LayerState

_PREFIX = "com.amazonaws.dynamodb.v20120810#"
Json = dict[str, Any]


class ThroughputExceededError(DynamodbException):
    """A partition key value took more than its partition serves. AWS answers per-partition throttling
    ("KeyRangeThroughputExceeded", on-demand tables included) with ProvisionedThroughputExceededException
    and a ThrottlingReasons list (DynamoDB API Reference, "ThrottlingReason"); the SDKs retry it."""

    def __init__(self, key: CapacityKey, arn: str, write: bool) -> None:
        kind = f"{'Index' if key.index_name else 'Table'}{'Write' if write else 'Read'}KeyRangeThroughputExceeded"
        message = (f"Throughput exceeds the current capacity for one or more partitions of your "
                   f"{'index' if key.index_name else 'table'} ({key})")
        super().__init__(_PREFIX + "ProvisionedThroughputExceededException", message)
        resource = f"{arn}/index/{key.index_name}" if key.index_name else arn
        self.description = json.dumps({"__type": _PREFIX + "ProvisionedThroughputExceededException",
                                       "message": message,
                                       "ThrottlingReasons": [{"reason": kind, "resource": resource}]})


class TransactionConflictError(DynamodbException):
    """A single write to an item an ongoing transaction holds (TransactionConflictException)."""

    def __init__(self) -> None:
        super().__init__(_PREFIX + "TransactionConflictException", "Transaction is ongoing for the item")


# --- sizes and capacity units -------------------------------------------------------------------


def item_size(item: Mapping[str, Any] | None) -> int:
    """An item's size as DynamoDB counts it ("Item sizes and formats"): attribute names' UTF-8 bytes
    plus each value: strings their UTF-8 bytes, binary its bytes, numbers 1 byte per 2 significant
    digits plus 1, booleans and null 1, lists and maps 3 bytes plus 1 a member (and map keys)."""
    return sum(len(name.encode()) + value_size(value) for name, value in (item or {}).items())


def value_size(value: Mapping[str, Any]) -> int:
    kind, v = next(iter(value.items()))
    if kind == "S":
        return len(v.encode())
    if kind == "N":
        return _number_size(v)
    if kind == "B":
        return len(_binary(v))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in v)
    if kind == "NS":
        return sum(_number_size(n) for n in v)
    if kind == "BS":
        return sum(len(_binary(b)) for b in v)
    if kind == "L":
        return 3 + sum(1 + value_size(member) for member in v)
    if kind == "M":
        return 3 + sum(1 + len(name.encode()) + value_size(member) for name, member in v.items())
    raise MockValidationException(f"Supplied AttributeValue has an unknown data type: {kind}")


def _number_size(text: str) -> int:
    try:
        digits = Decimal(text).normalize().as_tuple().digits
    except InvalidOperation:
        return len(text)
    return (len(digits) + 1) // 2 + 1


def _binary(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return base64.b64decode(value)


def write_units(size: int, transactional: bool = False) -> int:
    """"One write capacity unit represents one write per second for an item up to 1 KB"; a
    transactional write costs two ("Read/write capacity mode")."""
    return max(1, math.ceil(size / KIB)) * (2 if transactional else 1)


def read_units(size: int, *, consistent: bool = True, transactional: bool = False) -> float:
    """One read capacity unit: a strongly consistent read a second of up to 4 KB, two eventually
    consistent ones; a transactional read costs two."""
    units = float(max(1, math.ceil(size / (4 * KIB))))
    if transactional:
        return units * 2
    return units if consistent else units / 2


# --- the layer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConflictInjection:
    """Refuses `rate` of the writes (single or transactional) on items that transactions write, as
    DynamoDB refuses them while another writer's transaction holds the item. Each refusal is drawn
    from `seed`, the item keys and how often those items were tried, not from table names or time: a
    scenario run again on a fresh table meets the same refusals at the same writes."""

    rate: float
    seed: int = 0

    def refuses(self, keys: Iterable[str], attempt: int) -> bool:
        text = f"{self.seed}|{attempt}|" + "|".join(sorted(keys))
        draw = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2.0**64
        return draw < self.rate


@dataclass
class _Action:
    kind: str  # Put, Update, Delete or ConditionCheck
    table: Table
    key: Json
    put: Json | None
    before: Json | None

    @property
    def item_id(self) -> tuple[str, str]:
        return self.table.name, self.key_text

    @property
    def key_text(self) -> str:
        return json.dumps(self.key, sort_keys=True, default=str)


class DynamoDBLimits:
    def __init__(self, layer: LayerState) -> None:
        self.layer = layer
        self.quotas = layer.quotas
        # moto has no locks: writes (and the rollback of a failed one) run one at a time.
        self.write_lock = threading.RLock()
        self._held_lock = threading.Lock()
        self._held: dict[tuple[str, str], object] = {}
        self._buckets: dict[tuple[CapacityKey, bool], TokenBucket] = {}  # (key, write)
        self.injection: ConflictInjection | None = None
        self._transacted: set[tuple[str, str]] = set()  # items a transaction wrote (while injecting)
        self._tries: Counter[tuple[tuple[str, str], ...]] = Counter()  # writes tried per item set

    def reset(self) -> None:
        with self._held_lock:
            self._held.clear()
            self._buckets.clear()
            self._transacted.clear()
            self._tries.clear()

    def inject_conflicts(self, rate: float, *, seed: int = 0) -> None:
        """From now on, refuse `rate` (0 to 1; 0 turns it off) of the writes on items transactions write
        with DynamoDB's conflict answers (`ConflictInjection`)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"conflict rate must be between 0 and 1, got {rate}")
        with self._held_lock:
            self.injection = ConflictInjection(rate, seed) if rate else None
            self._transacted.clear()
            self._tries.clear()

    def _injected(self, actions: list[_Action], *, transaction: bool) -> set[int]:
        """The actions an injected conflict refuses (all or none of a request's, one draw per request)."""
        injection = self.injection
        if injection is None:
            return set()
        ids = tuple(sorted(a.item_id for a in actions))
        with self._held_lock:
            if transaction:
                self._transacted.update(ids)
            held = [i for i, a in enumerate(actions) if a.item_id in self._transacted]
            if not held:
                return set()
            self._tries[ids] += 1
            tries = self._tries[ids]
        return set(held[:1]) if injection.refuses((a.key_text for a in actions), tries) else set()

    def guard(self, action: str, handler: Any, run: Callable[[], Any]) -> Any:
        """Runs moto's `action` for `handler`'s request inside the limits."""
        params = handler.body
        backend = handler.dynamodb_backend
        if action in ("put_item", "update_item", "delete_item"):
            return self._single_write(action, params, backend, run)
        if action == "batch_write_item":
            return self._batch_write(params, backend, run)
        if action == "transact_write_items":
            return self._transaction(params, backend, run)
        return self._read(action, params, backend, run)

    # -- writes ------------------------------------------------------------------------------------

    def _action(self, kind: str, op: Mapping[str, Any], backend: Any) -> _Action:
        table = backend.get_table(op["TableName"])
        put = op.get("Item")
        if put is not None:
            key = {a: put[a] for a in (table.hash_key_attr, table.range_key_attr) if a and a in put}
        else:
            key = dict(op["Key"])
        current = backend.get_item(table.name, key)
        return _Action(kind, table, key, put, current.to_json()["Attributes"] if current else None)

    def _check_put_size(self, action: _Action) -> None:
        if action.put is not None and item_size(action.put) > self.quotas.item_bytes:
            self.layer.stats.record_refusal("ValidationException")
            raise MockValidationException("Item size has exceeded the maximum allowed size")

    def _single_write(self, name: str, params: Mapping[str, Any], backend: Any, run: Callable[[], Any]) -> Any:
        kind = {"put_item": "Put", "update_item": "Update", "delete_item": "Delete"}[name]
        with self.write_lock:
            action = self._action(kind, params, backend)
            self._check_put_size(action)
            with self._held_lock:
                held = action.item_id in self._held
            if held or self._injected([action], transaction=False):
                self.layer.stats.record_refusal("TransactionConflict")
                raise TransactionConflictError()
            self._take([action], transactional=False)
            snapshot = ItemSnapshot([(action.table, action.key)])
            try:
                result = run()
            except DynamodbException:
                self._charge(action, action.before, transactional=False)  # a refused condition costs too
                raise
            after = self._after(action)
            if kind == "Update" and item_size(after) > self.quotas.item_bytes:
                snapshot.restore()
                self.layer.stats.record_refusal("ValidationException")
                raise MockValidationException("Item size to update has exceeded the maximum allowed size")
            self._charge(action, after, transactional=False)
            return result

    def _batch_write(self, params: Mapping[str, Any], backend: Any, run: Callable[[], Any]) -> Any:
        with self.write_lock:
            actions = []
            for table_name, requests in params.get("RequestItems", {}).items():
                for request in requests:
                    if "PutRequest" in request:
                        op = {"TableName": table_name, "Item": request["PutRequest"]["Item"]}
                        actions.append(self._action("Put", op, backend))
                    elif "DeleteRequest" in request:
                        op = {"TableName": table_name, "Key": request["DeleteRequest"]["Key"]}
                        actions.append(self._action("Delete", op, backend))
            for action in actions:
                self._check_put_size(action)
            self._take(actions, transactional=False)
            result = run()
            for action in actions:
                self._charge(action, self._after(action), transactional=False)
            return result

    def _transaction(self, params: Mapping[str, Any], backend: Any, run: Callable[[], Any]) -> Any:
        started = time.monotonic()
        transact_items = params.get("TransactItems", [])
        if len(transact_items) > self.quotas.transaction_actions:
            self.layer.stats.record_refusal("ValidationException")
            raise MockValidationException(
                "1 validation error detected at 'transactItems' failed to satisfy constraint: Member must have "
                f"length less than or equal to {self.quotas.transaction_actions}")
        with self.write_lock:
            actions = [self._action(kind, op, backend) for item in transact_items for kind, op in item.items()]
        seen: set[tuple[str, str]] = set()
        for action in actions:
            if action.item_id in seen:
                self.layer.stats.record_refusal("ValidationException")
                raise MockValidationException("Transaction request cannot include multiple operations on one item")
            seen.add(action.item_id)
            self._check_put_size(action)
        if sum(max(item_size(a.put), item_size(a.before)) for a in actions) > self.quotas.transaction_bytes:
            self.layer.stats.record_refusal("ValidationException")
            raise MockValidationException("Transaction request cannot be larger than 4 MB")
        injected = self._injected(actions, transaction=True)
        if injected:
            self.layer.stats.record_refusal("TransactionConflict")
            raise _cancelled(actions, injected, "TransactionConflict", "Transaction is ongoing for the item")
        token = self._hold(actions)
        try:
            # The items stay held for as long as a transaction lasts on AWS: a concurrent one conflicts.
            time.sleep(max(0.0, started + self.quotas.transaction_hold_s - time.monotonic()))
            with self.write_lock:
                throttled = self._throttled(actions, transactional=True)
                if throttled:
                    raise _cancelled(actions, throttled, "ThrottlingError",
                                     "Throughput exceeds the current capacity of your table or index.")
                self._take(actions, transactional=True)
                snapshot = ItemSnapshot((a.table, a.key) for a in actions)
                try:
                    result = run()
                except Exception:
                    snapshot.restore()
                    raise
                afters = [self._after(a) for a in actions]
                too_big = {i for i, after in enumerate(afters) if item_size(after) > self.quotas.item_bytes}
                if too_big:
                    snapshot.restore()
                    self.layer.stats.record_refusal("ValidationException")
                    raise _cancelled(actions, too_big, "ValidationError",
                                     "Item size to update has exceeded the maximum allowed size")
                for action, after in zip(actions, afters, strict=True):
                    self._charge(action, after, transactional=True)
                return result
        finally:
            self._release(actions, token)

    def _hold(self, actions: list[_Action]) -> object:
        token = object()
        with self._held_lock:
            conflicts = {i for i, a in enumerate(actions) if a.item_id in self._held}
            if not conflicts:
                for action in actions:
                    self._held[action.item_id] = token
                return token
        self.layer.stats.record_refusal("TransactionConflict")
        raise _cancelled(actions, conflicts, "TransactionConflict", "Transaction is ongoing for the item")

    def _release(self, actions: list[_Action], token: object) -> None:
        with self._held_lock:
            for action in actions:
                if self._held.get(action.item_id) is token:
                    del self._held[action.item_id]

    def _after(self, action: _Action) -> Json | None:
        item = action.table.get_item(*key_values(action.table, action.key))
        return item.to_json()["Attributes"] if item else None

    # -- capacity ------------------------------------------------------------------------------------

    def _units(self, action: _Action, after: Json | None, transactional: bool) -> list[tuple[CapacityKey, float]]:
        """The write units `action` costs on each partition: the table's (the larger of the item before and
        after), and each GSI's whose projection of the item changed (a moved key costs its old partition too)."""
        table = action.table
        size = max(item_size(action.before), item_size(after))
        out = [(CapacityKey(table.name, None, _text(action.key[table.hash_key_attr])),
                float(write_units(size, transactional)))]
        if action.kind == "ConditionCheck":
            return out
        for index in table.global_indexes:
            old, new = _projected(table, index, action.before), _projected(table, index, after)
            if old == new:
                continue
            hash_attr = index.schema_key_attrs[0]
            if new is not None:
                out.append((CapacityKey(table.name, index.name, _text(new[hash_attr])),
                            float(write_units(item_size(new)))))
            if old is not None and (new is None or old[hash_attr] != new[hash_attr]):
                out.append((CapacityKey(table.name, index.name, _text(old[hash_attr])),
                            float(write_units(item_size(old)))))
        return out

    def _estimate(self, action: _Action, transactional: bool) -> list[tuple[CapacityKey, float]]:
        # Before the write, an update's result is unknown: the item as it is (or the put) stands in.
        return self._units(action, action.put if action.put is not None else action.before, transactional)

    def _bucket(self, key: CapacityKey, write: bool, now: float) -> TokenBucket:
        bucket = self._buckets.get((key, write))
        if bucket is None:
            rate = self.quotas.partition_wcu_per_s if write else self.quotas.partition_rcu_per_s
            bucket = self._buckets[(key, write)] = TokenBucket(rate, rate, now)
        return bucket

    def _throttled(self, actions: list[_Action], transactional: bool) -> set[int]:
        now = self.layer.clock()
        out = set()
        with self._held_lock:
            for i, action in enumerate(actions):
                for key, units in self._estimate(action, transactional):
                    if not self._bucket(key, True, now).can_take(units, now):
                        out.add(i)
                        self.layer.stats.record_refusal("ThrottlingError", key)
        return out

    def _take(self, actions: list[_Action], transactional: bool) -> None:
        """Refuses the request if one of its partitions is out of write capacity (the whole request: moto
        applies a batch all or nothing). The capacity is charged after the write, by `_charge`."""
        now = self.layer.clock()
        with self._held_lock:
            for action in actions:
                for key, units in self._estimate(action, transactional):
                    if not self._bucket(key, True, now).can_take(units, now):
                        self.layer.stats.record_refusal("ProvisionedThroughputExceededException", key)
                        raise ThroughputExceededError(key, action.table.table_arn, write=True)

    def _charge(self, action: _Action, after: Json | None, transactional: bool) -> None:
        now = self.layer.clock()
        writer = _text(action.key[action.table.hash_key_attr])
        for key, units in self._units(action, after, transactional):
            with self._held_lock:
                self._bucket(key, True, now).take(units, now)
            self.layer.stats.record_write(key, units, writer)

    # -- reads ---------------------------------------------------------------------------------------

    def _read(self, action: str, params: Mapping[str, Any], backend: Any, run: Callable[[], Any]) -> Any:
        # Reads change nothing: run them, then refuse the answer if the partitions could not serve it.
        # Under the writes' lock: moto reads an item's attributes while another thread changes them (a
        # query sorting an index raised KeyError for a key just removed); DynamoDB reads each item whole.
        with self.write_lock:
            result = run()
        consistent = bool(params.get("ConsistentRead"))
        charges: list[tuple[CapacityKey, float, str]] = []
        if action == "get_item":
            table = backend.get_table(params["TableName"])
            item = result.result.get("Item")
            charges.append((CapacityKey(table.name, None, _text(params["Key"][table.hash_key_attr])),
                            read_units(item_size(item), consistent=consistent), table.table_arn))
        elif action == "query":
            table = backend.get_table(params["TableName"])
            index = params.get("IndexName")
            items = result.result.get("Items") or []
            hash_attr = table.hash_key_attr
            if index:
                hash_attr = next(i.schema_key_attrs[0] for i in table.global_indexes + table.indexes
                                 if i.name == index)
            if items and hash_attr in items[0]:
                key = CapacityKey(table.name, index if index and index not in
                                  {i.name for i in table.indexes} else None, _text(items[0][hash_attr]))
                charges.append((key, read_units(sum(item_size(i) for i in items), consistent=consistent),
                                table.table_arn))
        elif action in ("batch_get_item", "transact_get_items"):
            charges.extend(self._key_reads(action, params, backend))
        now = self.layer.clock()
        for key, units, arn in charges:
            with self._held_lock:
                bucket = self._bucket(key, False, now)
                if not bucket.can_take(units, now):
                    self.layer.stats.record_refusal("ProvisionedThroughputExceededException", key)
                    raise ThroughputExceededError(key, arn, write=False)
                bucket.take(units, now)
            self.layer.stats.record_read(key, units)
        return result

    def _key_reads(
        self, action: str, params: Mapping[str, Any], backend: Any
    ) -> Iterable[tuple[CapacityKey, float, str]]:
        if action == "batch_get_item":
            requests = [(name, key, bool(spec.get("ConsistentRead")))
                        for name, spec in params.get("RequestItems", {}).items() for key in spec.get("Keys", [])]
        else:
            requests = [(item["Get"]["TableName"], item["Get"]["Key"], True)
                        for item in params.get("TransactItems", [])]
        for table_name, key, consistent in requests:
            table = backend.get_table(table_name)
            item = backend.get_item(table_name, key)
            size = item_size(item.to_json()["Attributes"] if item else None)
            units = read_units(size, consistent=consistent, transactional=action == "transact_get_items")
            yield CapacityKey(table.name, None, _text(key[table.hash_key_attr])), units, table.table_arn


def _cancelled(actions: list[_Action], failed: set[int], code: str, message: str) -> TransactionCanceledException:
    return TransactionCanceledException(
        [(code, message, None) if i in failed else (None, None, None) for i in range(len(actions))])


def _projected(table: Table, index: Any, item: Json | None) -> Json | None:
    """What a GSI holds of `item`: None when the item lacks the index's keys (it is not in the index)."""
    if item is None or any(attr not in item for attr in index.schema_key_attrs):
        return None
    projection = (index.projection or {}).get("ProjectionType", "ALL")
    if projection == "ALL":
        return dict(item)
    names = set(index.table_key_attrs) | set(index.schema_key_attrs)
    if projection == "INCLUDE":
        names |= set(index.projection.get("NonKeyAttributes", []))
    return {name: value for name, value in item.items() if name in names}


def _text(value: Mapping[str, Any]) -> str:
    """A key attribute value as text: `{"S": "job#a"}` is `job#a`."""
    inner = next(iter(value.values()))
    return inner if isinstance(inner, str) else base64.b64encode(_binary(inner)).decode()
