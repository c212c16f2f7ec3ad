"""The thread-safe object store: one global resourceVersion counter (as etcd's revision),
objects kept with their pre-serialised JSON, a bounded event log for watches, and list snapshots
kept for continue tokens.

Stored objects are never mutated: a write stores a new dict, so readers may use what they got
outside the lock.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
# Sorts after every character a key can hold.
_KEY_END = "\U0010ffff"


def dumps(obj: Any) -> bytes:
    """Compact JSON as the API server writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Stored:
    obj: Obj
    raw: bytes
    rv: int


@dataclass(frozen=True, slots=True)
class Version:
    """What a watch needs of one state of an object: its JSON and what selectors look at."""

    raw: bytes
    labels: dict[str, str]
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED or DELETED
    key: str
    current: Version  # for DELETED: the last state, at the deletion's resourceVersion
    previous: Version | None


FieldValues = Callable[[Obj], dict[str, str]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A resource's objects sorted by key, as they were at `rv`."""

    rv: int
    keys: list[str]
    entries: list[Stored]
    taken_at: float

    def bounds(self, prefix: str) -> tuple[int, int]:
        """The index range of the keys starting with `prefix` (a namespace's `ns/`, or all for "")."""
        if not prefix:
            return 0, len(self.keys)
        return bisect.bisect_left(self.keys, prefix), bisect.bisect_left(self.keys, prefix + _KEY_END)


class TooOldError(Exception):
    """The event log no longer holds events after the requested resourceVersion."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class Store:
    """All objects of all resources, keyed by `name` or `namespace/name`."""

    def __init__(
        self,
        resources: Mapping[str, FieldValues],
        *,
        max_events: int = 10_000,
        snapshot_ttl: float = 300.0,
        max_snapshots: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`resources` maps each resource to the values of its selectable fields, for watch events."""
        self._field_values = dict(resources)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.closed = False
        self._rv = 1
        self._objects: dict[str, dict[str, Stored]] = {r: {} for r in resources}
        self._sorted: dict[str, list[str] | None] = dict.fromkeys(self._objects)
        self._events: list[Event] = []
        # The log holds every event with rv > _floor.
        self._floor = self._rv
        self._max_events = max_events
        self._snapshots: OrderedDict[tuple[str, int], Snapshot] = OrderedDict()
        self._snapshot_ttl = snapshot_ttl
        self._max_snapshots = max_snapshots
        self._clock = clock

    @property
    def rv(self) -> int:
        return self._rv

    def add_resource(self, resource: str, field_values: FieldValues) -> None:
        """Hold objects of `resource` from now on (a CRD's); one held already keeps its objects."""
        with self.lock:
            self._field_values[resource] = field_values
            if resource not in self._objects:
                self._objects[resource] = {}
                self._sorted[resource] = None

    def get(self, resource: str, key: str) -> Stored | None:
        return self._objects[resource].get(key)

    def write(self, resource: str, key: str, obj: Obj | None) -> Stored:
        """Store `obj` under `key` (None deletes it) at the next resourceVersion and log the event."""
        with self.lock:
            collection = self._objects[resource]
            previous = collection.get(key)
            self._rv += 1
            if obj is None:
                if previous is None:
                    raise KeyError(key)
                obj = json.loads(previous.raw)
                kind = "DELETED"
                del collection[key]
                self._sorted[resource] = None
            else:
                kind = "ADDED" if previous is None else "MODIFIED"
                if previous is None:
                    self._sorted[resource] = None
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            stored = Stored(obj, dumps(obj), self._rv)
            if kind != "DELETED":
                collection[key] = stored
            self._events.append(
                Event(
                    self._rv,
                    resource,
                    kind,
                    key,
                    self._version(resource, stored),
                    None if previous is None else self._version(resource, previous),
                )
            )
            if len(self._events) > self._max_events:
                drop = len(self._events) - self._max_events // 2
                self._floor = self._events[drop - 1].rv
                del self._events[:drop]
            self.changed.notify_all()
            return stored

    def _version(self, resource: str, stored: Stored) -> Version:
        # Old versions in the log keep their JSON and selector data, not their whole dict.
        labels = (stored.obj.get("metadata") or {}).get("labels") or {}
        return Version(stored.raw, labels, self._field_values[resource](stored.obj))

    def snapshot(self, resource: str) -> Snapshot:
        """The resource's objects now, sorted by key."""
        with self.lock:
            cached = self._snapshots.get((resource, self._rv))
            if cached is not None:
                return cached
            keys = self._sorted[resource]
            collection = self._objects[resource]
            if keys is None:
                keys = sorted(collection)
                self._sorted[resource] = keys
            return Snapshot(self._rv, keys, [collection[k] for k in keys], self._clock())

    def keep(self, resource: str, snapshot: Snapshot) -> None:
        """Hold `snapshot` for the continue tokens of a paged list (the oldest go first)."""
        with self.lock:
            self._snapshots[(resource, snapshot.rv)] = snapshot
            self._snapshots.move_to_end((resource, snapshot.rv))
            while len(self._snapshots) > self._max_snapshots:
                self._snapshots.popitem(last=False)

    def cached_snapshot(self, resource: str, rv: int) -> Snapshot | None:
        """The snapshot taken at `rv`, unless it expired (as etcd compaction expires continue tokens)."""
        with self.lock:
            snapshot = self._snapshots.get((resource, rv))
            if snapshot is None:
                return None
            if self._clock() - snapshot.taken_at > self._snapshot_ttl:
                del self._snapshots[(resource, rv)]
                return None
            return snapshot

    def expire_snapshots(self) -> None:
        with self.lock:
            self._snapshots.clear()

    def events_after(self, rv: int) -> list[Event]:
        """Every event with a resourceVersion above `rv`; TooOldError when the log lost some."""
        with self.lock:
            if rv < self._floor:
                raise TooOldError(rv, self._floor + 1)
            if not self._events:
                return []
            start = max(0, rv - self._events[0].rv + 1)
            return self._events[start:]

    def wait(self, after_rv: int, timeout: float) -> None:
        """Block until a write after `after_rv`, the store closes, or `timeout` seconds pass."""
        with self.lock:
            if self._rv <= after_rv and not self.closed:
                self.changed.wait(timeout)

    def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the store to reach `rv`; whether it did."""
        deadline = self._clock() + timeout
        with self.lock:
            while self._rv < rv and not self.closed:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self.changed.wait(remaining)
            return self._rv >= rv

    def reopen(self) -> None:
        with self.lock:
            self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.changed.notify_all()
