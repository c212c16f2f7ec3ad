"""moto's DynamoDB tables as DynamoDB keeps them: stream records held only while needed, no table copies.

moto keeps every stream record forever, and before each `TransactWriteItems` deep-copies every table
the transaction names, its stream records included, to roll back on failure: memory and time grow
with the table and its history. Here a transaction saves only the items it touches (`ItemSnapshot`)
and rolls back those, and the stream's records it appended; a stream drops the records every live
reader has read, and any record older than DynamoDB Streams' 24 hours (by the wall clock).
"""

from __future__ import annotations

import copy
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
        for shard, length in self._streams.values():
            del shard.items[length:]


def key_values(table: Table, key: Mapping[str, Any]) -> tuple[DynamoType, DynamoType | None]:
    hash_value = DynamoType(key[table.hash_key_attr])
    range_attr = table.range_key_attr
    return hash_value, (DynamoType(key[range_attr]) if range_attr and range_attr in key else None)


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
