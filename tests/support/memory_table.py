"""One DynamoDB table in memory, as `prewarm.adapters.dynamodb.table.Table` uses it: items by (pk, sk),
values as a read hands them back, conditional writes, all-or-nothing transactions with a reason per
action, batches that refuse a key twice, and DynamoDB's 400 KB item size. `MemoryJobStore` writes each
item kind on it the way the adapter writes it on DynamoDB; `tests/unit/adapters/test_memory_store_contract.py`
checks the two against each other.

Conditions are Python predicates over the item as stored (None when there is none), written with `has`,
`equal`, `below` and `at_most`, which compare as DynamoDB does: a missing attribute, or one of another
type, fails every comparison.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import Any

from prewarm.services.ports import StoreConflictError, StoreError

Item = dict[str, Any]
Condition = Callable[[Item | None], bool]

# DynamoDB's item size limit (developer guide, "Service, account, and table quotas"): names and values.
MAX_ITEM_BYTES = 400 * 1024
# BatchWriteItem takes 25 requests a call (the adapter's `_BATCH`); none of them may name a key twice.
BATCH_WRITE = 25
# TransactWriteItems takes at most 100 actions.
MAX_TRANSACTION_ACTIONS = 100


def plain(value: Any) -> Any:
    """A value as DynamoDB hands it back to the adapter: floats as their number (integral ones as int, as
    `table.plain_value` makes them), str enums as their text, tuples as lists, sets sorted."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Enum) and isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int | float | Decimal):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        return int(number) if number == number.to_integral_value() else float(number)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    # boto3's TypeSerializer refuses the rest before any call (datetimes, objects)
    raise TypeError(f'Unsupported type "{type(value)}" for value "{value}"')


def _value_size(value: Any) -> int:
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return len(str(value))
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict):
        return 3 + sum(len(k.encode()) + 1 + _value_size(v) for k, v in value.items())
    if isinstance(value, list):
        return 3 + sum(1 + _value_size(v) for v in value)
    return len(repr(value).encode())


def item_size(item: Mapping[str, Any]) -> int:
    """Roughly DynamoDB's measure of an item (attribute names and values in bytes): exact for text."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _comparable(stored: Any, wanted: Any) -> bool:
    return (_is_number(stored) and _is_number(wanted)) or type(stored) is type(wanted)


def has(item: Item | None, name: str) -> bool:
    """`attribute_exists(name)`."""
    return item is not None and name in item


def equal(item: Item | None, name: str, value: Any) -> bool:
    """`#name = :value`."""
    wanted = plain(value)
    return has(item, name) and _comparable(item[name], wanted) and item[name] == wanted  # type: ignore[index]


def below(item: Item | None, name: str, value: Any) -> bool:
    """`#name < :value` (numbers)."""
    wanted = plain(value)
    return has(item, name) and _is_number(item[name]) and _is_number(wanted) and item[name] < wanted  # type: ignore[index]


def at_most(item: Item | None, name: str, value: Any) -> bool:
    """`#name <= :value` (numbers)."""
    wanted = plain(value)
    return has(item, name) and _is_number(item[name]) and _is_number(wanted) and item[name] <= wanted  # type: ignore[index]


@dataclass(frozen=True)
class Put:
    """PutItem: the whole item, replacing any (None values are not written, as `table.to_item` drops them)."""

    item: Mapping[str, Any]
    condition: Condition | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (str(self.item["pk"]), str(self.item["sk"]))


@dataclass(frozen=True)
class Update:
    """UpdateItem: `fields` SET (None: REMOVE), `add` ADDed to numbers; makes the item when there is none."""

    pk: str
    sk: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    add: Mapping[str, Any] = field(default_factory=dict)
    condition: Condition | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.pk, self.sk)


@dataclass(frozen=True)
class Delete:
    pk: str
    sk: str
    condition: Condition | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.pk, self.sk)


Action = Put | Update | Delete


class _Invalid(Exception):
    """DynamoDB's ValidationException: the request itself is refused (`StoreError`, not a conflict)."""


class MemoryTable:
    """Items by (pk, sk), each write atomic, one writer at a time (threads share it, as Lambda's share
    DynamoDB)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], Item] = {}
        self._lock = threading.RLock()

    # -- reads -----------------------------------------------------------------------------

    def get(self, pk: str, sk: str) -> Item | None:
        with self._lock:
            item = self._items.get((pk, sk))
            return copy.deepcopy(item) if item is not None else None

    def query(self, pk: str, prefix: str = "") -> list[Item]:
        """The items of one partition key whose sort key starts with `prefix`, in sort key order."""
        with self._lock:
            found = [(sk, item) for (p, sk), item in self._items.items() if p == pk and sk.startswith(prefix)]
            return [copy.deepcopy(item) for _, item in sorted(found, key=lambda e: e[0])]

    def index(self, name: str, value: Any, *, order: str = "pk") -> list[Item]:
        """The items a sparse index keyed on `name` holds under `value`, in the index's sort key order."""
        with self._lock:
            found = [item for item in self._items.values() if item.get(name) == value]
            return [copy.deepcopy(item) for item in sorted(found, key=lambda i: (str(i[order]), str(i["pk"])))]

    def keys(self) -> list[tuple[str, str]]:
        """Every item's (pk, sk), sorted: what a scan of the table would find."""
        with self._lock:
            return sorted(self._items)

    # -- single writes ---------------------------------------------------------------------

    def put(self, what: str, item: Mapping[str, Any], condition: Condition | None = None) -> None:
        self.write(what, Put(item, condition))

    def update(self, what: str, pk: str, sk: str, fields: Mapping[str, Any], *, condition: Condition | None = None,
               add: Mapping[str, Any] | None = None) -> Item:
        """UpdateItem; returns the item as the update left it (`ReturnValues=ALL_NEW`)."""
        after = self.write(what, Update(pk, sk, fields, add or {}, condition))
        assert after is not None  # an update leaves an item
        return after

    def delete(self, what: str, pk: str, sk: str) -> Item | None:
        """Deletes the item (none is fine); returns it as it was (`ReturnValues=ALL_OLD`)."""
        with self._lock:
            return self._items.pop((pk, sk), None)

    def write(self, what: str, action: Action) -> Item | None:
        """One write; returns the item as it left it (None: deleted)."""
        with self._lock:
            current = self._items.get(action.key)
            if action.condition is not None and not action.condition(current):
                raise StoreConflictError(f"{what}: the item changed or the condition does not hold")
            try:
                after = self._after(action, current)
                self._apply([(action, after)])
            except _Invalid as e:
                raise StoreError(f"{what}: ValidationException: {e}") from None
            return copy.deepcopy(after)

    # -- batches and transactions ----------------------------------------------------------

    def batch_write(self, what: str, actions: Sequence[Put | Delete]) -> None:
        """BatchWriteItem, 25 requests a call, each call refusing a key named twice; no conditions."""
        for start in range(0, len(actions), BATCH_WRITE):
            chunk = actions[start : start + BATCH_WRITE]
            with self._lock:
                try:
                    self._unique(chunk, "Provided list of item keys contains duplicates")
                    self._apply([(a, self._after(a, self._items.get(a.key))) for a in chunk])
                except _Invalid as e:
                    raise StoreError(f"{what}: ValidationException: {e}") from None

    def batch_get(self, keys: Iterable[tuple[str, str]]) -> list[Item]:
        """BatchGetItem: the items that exist (a key named twice is refused, as DynamoDB refuses it)."""
        wanted = list(keys)
        if len(set(wanted)) != len(wanted):
            raise StoreError("read items: ValidationException: Provided list of item keys contains duplicates")
        with self._lock:
            return [copy.deepcopy(self._items[k]) for k in wanted if k in self._items]

    def transact(self, what: str, actions: Sequence[Action]) -> None:
        """TransactWriteItems: every action or none; a failed condition is a `StoreConflictError`."""
        reasons = self.transact_or_reasons(what, actions)
        if reasons is not None:
            raise StoreConflictError(f"{what}: transaction condition failed ({', '.join(reasons)})")

    def transact_or_reasons(self, what: str, actions: Sequence[Action]) -> list[str] | None:
        """None once the transaction commits; when conditions failed, each action's cancellation reason
        in order (`ConditionalCheckFailed` or `None`), as `Table._transact_or_reasons` returns them."""
        with self._lock:
            try:
                if not actions or len(actions) > MAX_TRANSACTION_ACTIONS:
                    raise _Invalid(f"TransactItems must hold 1 to {MAX_TRANSACTION_ACTIONS} actions, not "
                                   f"{len(actions)}")
                self._unique(actions, "Transaction request cannot include multiple operations on one item")
                reasons = ["ConditionalCheckFailed" if a.condition is not None and not a.condition(
                    self._items.get(a.key)) else "None" for a in actions]
                if "ConditionalCheckFailed" in reasons:
                    return reasons
                self._apply([(a, self._after(a, self._items.get(a.key))) for a in actions])
            except _Invalid as e:
                raise StoreError(f"{what}: ValidationException: {e}") from None
            return None

    # -- how a write changes an item -------------------------------------------------------

    @staticmethod
    def _unique(actions: Sequence[Action], message: str) -> None:
        if len({a.key for a in actions}) != len(actions):
            raise _Invalid(message)

    @staticmethod
    def _after(action: Action, current: Item | None) -> Item | None:
        """The item once `action` is applied (None: deleted); raises `_Invalid` for what DynamoDB refuses."""
        if isinstance(action, Delete):
            return None
        if isinstance(action, Put):
            item = {k: plain(v) for k, v in action.item.items() if v is not None}
        else:
            item = copy.deepcopy(current) if current is not None else {"pk": action.pk, "sk": action.sk}
            for name, value in action.fields.items():
                if value is None:
                    item.pop(name, None)
                else:
                    item[name] = plain(value)
            for name, value in action.add.items():
                amount = plain(value)
                if name in item and not _is_number(item[name]):
                    raise _Invalid(f"An operand in the update expression has an incorrect data type ({name})")
                item[name] = plain(item.get(name, 0) + amount)
        if item_size(item) > MAX_ITEM_BYTES:
            raise _Invalid("Item size has exceeded the maximum allowed size")
        return item

    def _apply(self, changes: Sequence[tuple[Action, Item | None]]) -> None:
        for action, item in changes:
            if item is None:
                self._items.pop(action.key, None)
            else:
                self._items[action.key] = item
