"""moto's DynamoDB tables as DynamoDB keeps them: stream records held only while needed, no table copies,
and a query reading its partition only.

moto keeps every stream record forever, and before each `TransactWriteItems` deep-copies every table
the transaction names, its stream records included, to roll back on failure: memory and time grow
with the table and its history. Here a transaction saves only the items it touches (`ItemSnapshot`)
and rolls back those, and the stream's records it appended; a stream drops the records every live
reader has read, and any record older than DynamoDB Streams' 24 hours (by the wall clock).

moto answers every Query, of the table or of an index, by sorting and walking every item of the table
(`Table.query`, `Table.all_items`), so a query costs O(n log n) in the table's items, where DynamoDB
reads one partition. Here a query walks only the items it may answer (`query_patches`): the partition's, or the
items holding the index's key value, found in a map kept by the writes; moto's own code then answers
from those, so the answers are moto's.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.models.table import StreamShard, Table


class ItemSnapshot:
    """The items at `keys` (table, key attributes) and the table streams' lengths, to put back on failure."""

    def __init__(self, keys: Iterable[tuple[Table, Mapping[str, Any]]]) -> None:
        self._items: list[tuple[Table, DynamoType, DynamoType | None, Item | None]] = []
        self._streams: dict[int, tuple[StreamShard, int]] = {}
        for table, key in keys:
            hash_value, range_value = key_values(table, key)
            item = table.get_item(hash_value, range_value)
            self._items.append((table, hash_value, range_value, copy.deepcopy(item)))
            shard = table.stream_shard
            if shard is not None and id(shard) not in self._streams:
                self._streams[id(shard)] = (shard, len(shard.items))

    def restore(self) -> None:
        """Puts every saved item back (or removes it if it did not exist) and drops later stream records."""
        for table, hash_value, range_value, item in self._items:
            if range_value is None:
                if item is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = item  # type: ignore[assignment]  # as moto stores it
            else:
                partition = table.items[hash_value]
                if item is None:
                    partition.pop(range_value, None)
                    if not partition:
                        table.items.pop(hash_value, None)
                else:
                    partition[range_value] = item
            _reindexed(table, hash_value, range_value, {})
        for shard, length in self._streams.values():
            del shard.items[length:]


def key_values(table: Table, key: Mapping[str, Any]) -> tuple[DynamoType, DynamoType | None]:
    hash_value = DynamoType(key[table.hash_key_attr])
    range_attr = table.range_key_attr
    return hash_value, (DynamoType(key[range_attr]) if range_attr and range_attr in key else None)


# --- a query reads its partition only ---------------------------------------------------------------

_narrowed = threading.local()  # per thread: (table, the items its running query may answer)
_by_value_lock = threading.Lock()
_BY_VALUE = "_prewarm_by_value"  # on a Table: index key attribute -> value -> {(hash, range) of items holding it}


def _item_at(table: Table, hash_value: DynamoType, range_value: DynamoType | None) -> Item | None:
    partition = table.items.get(hash_value)  # .get: moto's items are a defaultdict
    if partition is None or not table.range_key_attr:
        return partition  # type: ignore[return-value]  # as moto stores it
    return partition.get(range_value)


def _values(table: Table, item: Item | None) -> dict[str, DynamoType]:
    """The item's values of the attributes mapped (copies: moto may change a value in place)."""
    mapped = table.__dict__.get(_BY_VALUE) or {}
    if item is None:
        return {}
    return {attr: DynamoType(item.attrs[attr]) for attr in tuple(mapped) if attr in item.attrs}


def _reindexed(table: Table, hash_value: DynamoType, range_value: DynamoType | None,
               before: Mapping[str, DynamoType]) -> None:
    """The item at the key was written (or removed): its key moves from the values it held `before` to
    those it holds now. Nothing to do until the table's first index query made a map."""
    mapped = table.__dict__.get(_BY_VALUE)
    if not mapped:
        return
    key = (hash_value, range_value)
    with _by_value_lock:
        now = _values(table, _item_at(table, hash_value, range_value))
        for attr, value in before.items():
            if (attr not in now or now[attr] != value) and (held := mapped[attr].get(value)) is not None:
                held.pop(key, None)
                if not held:
                    del mapped[attr][value]
        for attr, value in now.items():
            mapped[attr].setdefault(value, {})[key] = None


def _holding(table: Table, attr: str, value: DynamoType) -> list[Item]:
    """The items whose `attr` is `value`: one walk of the table on the first query by `attr`, then the map
    the writes keep; each item is checked against the table as it is now."""
    with _by_value_lock:
        mapped = table.__dict__.setdefault(_BY_VALUE, {})
        if attr not in mapped:
            by_value: dict[DynamoType, dict[tuple[DynamoType, DynamoType | None], None]] = {}
            for hash_value, partition in list(table.items.items()):
                items: Iterable[Item] = partition.values() if table.range_key_attr else [partition]  # type: ignore[list-item]
                for item in items:
                    if attr in item.attrs:
                        by_value.setdefault(DynamoType(item.attrs[attr]), {})[(hash_value, item.range_key)] = None
            mapped[attr] = by_value
        found = []
        for hash_value, range_value in list(mapped[attr].get(value, ())):
            held = _item_at(table, hash_value, range_value)
            if held is not None and attr in held.attrs and held.attrs[attr] == value:
                found.append(held)
        return found


def _candidates(table: Table, arguments: Mapping[str, Any]) -> list[Item] | None:
    """What a query may answer: the partition's items (the table, a local index), the items holding the
    key value (a global index); None when the query is not one of those (moto walks the table then)."""
    index_name = arguments.get("index_name")
    attr, value = table.hash_key_attr, arguments.get("hash_key")
    if index_name:
        index = next((i for i in table.all_indexes() if i.name == index_name), None)
        hashes = [] if index is None else [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]
        conditions = dict(arguments.get("hash_key_conditions") or [])
        if len(hashes) != 1 or hashes[0] not in conditions:
            return None
        attr, value = hashes[0], conditions[hashes[0]]
    if not isinstance(value, DynamoType):
        return None
    if attr == table.hash_key_attr:
        partition = table.items.get(value)
        if partition is None:
            return []
        return list(partition.values()) if table.range_key_attr else [partition]  # type: ignore[list-item]
    return _holding(table, attr, value)


def query_patches() -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for `patches.install`: queries walk their candidates, writes keep the map."""
    from moto.dynamodb.models import DynamoDBBackend

    query, all_items = Table.__dict__["query"], Table.__dict__["all_items"]
    signature = inspect.signature(query)

    @functools.wraps(query)
    def narrowed_query(table: Table, *args: Any, **kwargs: Any) -> Any:
        items = _candidates(table, signature.bind(table, *args, **kwargs).arguments)
        if items is None:
            return query(table, *args, **kwargs)
        _narrowed.items = (table, items)
        try:
            return query(table, *args, **kwargs)  # moto's sort after the walk is on whole keys: order kept
        finally:
            _narrowed.items = None

    @functools.wraps(all_items)
    def narrowed_all_items(table: Table) -> list[Item]:
        narrowed = getattr(_narrowed, "items", None)
        return list(narrowed[1]) if narrowed is not None and narrowed[0] is table else all_items(table)

    put, delete, update = Table.__dict__["put_item"], Table.__dict__["delete_item"], DynamoDBBackend.update_item

    @functools.wraps(put)
    def put_item(table: Table, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if not table.__dict__.get(_BY_VALUE) or table.hash_key_attr not in item_attrs:
            return put(table, item_attrs, *args, **kwargs)
        return _rewrite(table, key_values(table, item_attrs), lambda: put(table, item_attrs, *args, **kwargs))

    @functools.wraps(delete)
    def delete_item(table: Table, hash_key: DynamoType, range_key: DynamoType | None) -> Any:
        return _rewrite(table, (hash_key, range_key), lambda: delete(table, hash_key, range_key))

    @functools.wraps(update)
    def update_item(backend: Any, table_name: str, key: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        table = backend.get_table(table_name)
        if not table.__dict__.get(_BY_VALUE) or table.hash_key_attr not in key:
            return update(backend, table_name, key, *args, **kwargs)
        return _rewrite(table, key_values(table, key), lambda: update(backend, table_name, key, *args, **kwargs))

    return [(Table, "query", narrowed_query), (Table, "all_items", narrowed_all_items), (Table, "put_item", put_item),
            (Table, "delete_item", delete_item), (DynamoDBBackend, "update_item", update_item)]


def _rewrite(table: Table, key: tuple[DynamoType, DynamoType | None], write: Callable[[], Any]) -> Any:
    if not table.__dict__.get(_BY_VALUE):
        return write()
    before = _values(table, _item_at(table, *key))
    try:
        return write()
    finally:
        _reindexed(table, *key, before)


class _TablesAreNotCopied:
    """Stands in for the `copy` module inside `moto.dynamodb.models`: a table "copied" for a transaction's
    rollback is the table itself (the layer's `ItemSnapshot` rolls back instead); items are still copied."""

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        if isinstance(value, Table):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


TABLES_ARE_NOT_COPIED = _TablesAreNotCopied()


class StreamReaders:
    """Who reads each stream shard and how far: a reader is a chain of shard iterators, each from the last.

    A record is dropped once every reader that read in the last `iterator_s` seconds (a shard
    iterator's life on AWS) is past it, or once it is `retention_s` old. With no live reader, records
    stay for `retention_s`, so a reader that starts later (TRIM_HORIZON) still finds them.
    """

    def __init__(self, clock: Callable[[], float], retention_s: float, iterator_s: float) -> None:
        self._clock = clock
        self.retention_s = retention_s
        self.iterator_s = iterator_s

    def started(self, iterator: Any) -> None:
        """A new iterator from GetShardIterator: a new reader."""
        iterator._prewarm_reader = object()
        iterator._prewarm_born = self._clock()

    def read(self, iterator: Any, following: Any, streams_backend: Any) -> None:
        """`iterator` answered GetRecords and handed out `following`: its reader is now at `following`."""
        now = self._clock()
        following._prewarm_reader = getattr(iterator, "_prewarm_reader", None) or object()
        following._prewarm_born = now
        shard = iterator.stream_shard
        readers: dict[object, tuple[int, float]] = shard.__dict__.setdefault("_prewarm_readers", {})
        readers[following._prewarm_reader] = (int(following.sequence_number), now)
        self._forget_expired(streams_backend, now)
        self.trim(shard, now)

    def trim(self, shard: StreamShard, now: float) -> int:
        """Drops what no live reader needs and what is past retention; returns how many records went."""
        readers: dict[object, tuple[int, float]] = shard.__dict__.setdefault("_prewarm_readers", {})
        for reader, (_, seen) in list(readers.items()):
            if now - seen > self.iterator_s:
                del readers[reader]
        start = shard.starting_sequence_number
        keep_from = min((position for position, _ in readers.values()), default=start)
        drop = max(0, min(keep_from - start, len(shard.items)))
        cutoff = time.time() - self.retention_s
        while drop < len(shard.items) and _created(shard.items[drop]) < cutoff:
            drop += 1
        if drop:
            del shard.items[:drop]
            shard.starting_sequence_number = start + drop
        return drop

    def _forget_expired(self, streams_backend: Any, now: float) -> None:
        # moto keeps every shard iterator it ever handed out; AWS's expire after 15 minutes.
        iterators: dict[str, Any] = streams_backend.shard_iterators
        for arn in list(iterators):
            if now - getattr(iterators[arn], "_prewarm_born", now) <= self.iterator_s:
                break
            del iterators[arn]


def _created(record: Any) -> float:
    created = record.record["dynamodb"].get("ApproximateCreationDateTime")
    if not isinstance(created, datetime):
        return float("inf")
    return (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
