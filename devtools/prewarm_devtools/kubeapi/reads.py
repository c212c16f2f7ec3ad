"""Reads, as the generic registry answers them: objects in the version the request serves (a custom
resource's apiVersion and schema defaults), lists from consistent snapshots paged with `limit` and
`continue` tokens (resourceVersion and resourceVersionMatch as the API server checks them), and watches:
events after a resourceVersion or initial ADDED events, selectors (an object leaving the selection is
DELETED), bookmarks, timeouts and 410 Expired."""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.errors import FieldError, StatusError
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.schema import apply_defaults
from prewarm_devtools.kubeapi.selectors import FieldSelector, LabelSelector
from prewarm_devtools.kubeapi.store import Event, Snapshot, Store, Stored, TooOldError, Version, dumps

Obj = dict[str, Any]


_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)


# How long a list or watch for a future resourceVersion waits before 504, as the apiserver does.
TOO_LARGE_RV_WAIT = 3.0


@dataclass(frozen=True)
class ListQuery:
    """The list and watch parameters of a request."""

    label_selector: LabelSelector = field(default_factory=lambda: LabelSelector(()))
    field_selector: FieldSelector = field(default_factory=lambda: FieldSelector(()))
    limit: int = 0
    continue_token: str = ""
    resource_version: str = ""
    resource_version_match: str = ""
    send_initial_events: bool | None = None
    allow_bookmarks: bool = False


def encode_continue(rv: int, start: str) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()


def decode_continue(token: str) -> tuple[int, str]:
    """The resourceVersion and start key of a continue token, or 400 as the apiserver words it."""

    def invalid(why: str) -> StatusError:
        return errors.bad_request(f"invalid continue token: continue key is not valid{why}")

    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        parsed = json.loads(raw)
    except (binascii.Error, ValueError) as e:
        raise invalid(f": {e}") from None
    if not isinstance(parsed, dict):
        raise invalid("")
    if parsed.get("v") != "meta.k8s.io/v1":
        raise invalid(": server does not recognize this encoded version")
    rv, start = parsed.get("rv"), parsed.get("start")
    if not isinstance(rv, int) or rv == 0:
        raise invalid(": incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise invalid(": encoded start key empty (version meta.k8s.io/v1)")
    if ".." in start.split("/"):
        raise invalid("")
    return rv, start


def _watch_line(kind: str, raw: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


def served_as(rtype: ResourceType, obj: Obj) -> Obj:
    """`obj` (as stored) in the version `rtype` serves: a custom resource's apiVersion is the request's, and
    the version's schema defaults are filled in, as the API server's storage decoder does on every read
    (so a default added to a CRD shows on objects stored before it)."""
    custom = rtype.custom
    if custom is None:
        return obj
    if custom.defaults:
        obj = copy.deepcopy(obj)
        apply_defaults(obj, custom.schema)
    if rtype.version == custom.storage_version:
        return obj
    return {**obj, "apiVersion": rtype.api_version}


def raw_served_as(rtype: ResourceType, raw: bytes) -> bytes:
    custom = rtype.custom
    if custom is None or (rtype.version == custom.storage_version and not custom.defaults):
        return raw
    return dumps(served_as(rtype, json.loads(raw)))


def _parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise _invalid_list_options(FieldError("Invalid", "resourceVersion", text, "must be a non-negative integer"))
    return value


def _invalid_list_options(error: FieldError) -> StatusError:
    return errors.invalid("ListOptions.meta.k8s.io", "", [error])


def _too_large(wanted: int, current: int) -> StatusError:
    error = errors.timeout(f"Timeout: Too large resource version: {wanted}, current: {current}")
    assert error.details is not None
    error.details["causes"] = [
        {"reason": "ResourceVersionTooLarge", "message": f"Too large resource version: {wanted}, current: {current}"}
    ]
    return error


def list_collection(store: Store, rtype: ResourceType, namespace: str | None, query: ListQuery) -> bytes:
    """GET on a collection: the serialised list, one page of it when `limit` is set."""
    prefix = f"{namespace}/" if namespace is not None else ""
    start = ""
    if query.continue_token:
        if query.resource_version not in ("", "0"):
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        token_rv, start = decode_continue(query.continue_token)
        if token_rv == -1:
            snapshot = store.snapshot(rtype.storage)
        else:
            cached = store.cached_snapshot(rtype.storage, token_rv)
            if cached is None:
                raise errors.expired(_CONTINUE_EXPIRED, encode_continue(-1, start))
            snapshot = cached
        start = prefix + start
    else:
        snapshot = _list_snapshot(store, rtype, query)
    return _page(store, rtype, snapshot, prefix, start, query)


def _list_snapshot(store: Store, rtype: ResourceType, query: ListQuery) -> Snapshot:
    rv_text, match = query.resource_version, query.resource_version_match
    if match and match not in ("Exact", "NotOlderThan"):
        raise _invalid_list_options(
            FieldError("NotSupported", "resourceVersionMatch", match, 'supported values: "Exact", "NotOlderThan"')
        )
    if match and not rv_text:
        raise _invalid_list_options(
            FieldError(
                "Forbidden",
                "resourceVersionMatch",
                detail="resourceVersionMatch is forbidden unless resourceVersion is provided",
            )
        )
    if rv_text in ("", "0"):
        if match == "Exact":
            raise _invalid_list_options(
                FieldError(
                    "Forbidden",
                    "resourceVersionMatch",
                    detail='resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
        return store.snapshot(rtype.storage)
    rv = _parse_rv(rv_text)
    if rv > store.rv and not store.wait_for_rv(rv, TOO_LARGE_RV_WAIT):
        raise _too_large(rv, store.rv)
    if match == "Exact" and rv != store.rv:
        cached = store.cached_snapshot(rtype.storage, rv)
        if cached is None:
            raise errors.expired("The resourceVersion for the provided list is too old.")
        return cached
    return store.snapshot(rtype.storage)


def _page(store: Store, rtype: ResourceType, snapshot: Snapshot, prefix: str, start: str, query: ListQuery) -> bytes:
    keys, entries = snapshot.keys, snapshot.entries
    lo, hi = snapshot.bounds(prefix)
    if start:
        lo = max(lo, bisect.bisect_left(keys, start))
    filtered = not (query.label_selector.empty and query.field_selector.empty)
    limit = query.limit if query.limit > 0 else 0
    if not filtered and not limit:
        raws = [e.raw for e in entries[lo:hi]]
        last = hi - 1
    else:
        raws = []
        last = lo - 1
        for i in range(lo, hi):
            if limit and len(raws) == limit:
                break
            last = i
            if not filtered or _matches(rtype, entries[i].obj, query):
                raws.append(entries[i].raw)
    metadata: Obj = {"resourceVersion": str(snapshot.rv)}
    if limit and last + 1 < hi and len(raws) == limit:
        store.keep(rtype.storage, snapshot)
        metadata["continue"] = encode_continue(snapshot.rv, keys[last][len(prefix) :] + "\x00")
        if not filtered:
            metadata["remainingItemCount"] = hi - last - 1
    head = dumps({"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": metadata})
    return head[:-1] + b',"items":[' + b",".join(raw_served_as(rtype, raw) for raw in raws) + b"]}"


def watch(
    store: Store,
    rtype: ResourceType,
    namespace: str | None,
    query: ListQuery,
    timeout: float,
    bookmark_interval: float,
) -> Iterator[bytes | None]:
    """Watch event lines; None now and then while idle, so the caller can check its client."""
    deadline = time.monotonic() + timeout
    prefix = f"{namespace}/" if namespace is not None else ""
    rv_text = query.resource_version
    send_initial = query.send_initial_events
    if send_initial and query.resource_version_match != "NotOlderThan":
        raise _invalid_list_options(
            FieldError(
                "Forbidden",
                "resourceVersionMatch",
                detail="sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )
        )
    if send_initial is None:
        send_initial = rv_text in ("", "0")
    initial: list[Stored] = []
    if send_initial:
        if rv_text not in ("", "0"):
            wanted = _parse_rv(rv_text)
            if not store.wait_for_rv(wanted, TOO_LARGE_RV_WAIT):
                raise _too_large(wanted, store.rv)
        snapshot = store.snapshot(rtype.storage)
        lo, hi = snapshot.bounds(prefix)
        initial = [e for e in snapshot.entries[lo:hi] if _matches(rtype, e.obj, query)]
        last = snapshot.rv
    else:
        last = _parse_rv(rv_text)
    return _events(store, rtype, prefix, query, initial, last, deadline, bookmark_interval)


def _events(
    store: Store,
    rtype: ResourceType,
    prefix: str,
    query: ListQuery,
    initial: list[Stored],
    last: int,
    deadline: float,
    bookmark_interval: float,
) -> Iterator[bytes | None]:
    for entry in initial:
        yield _watch_line("ADDED", raw_served_as(rtype, entry.raw))
    if query.send_initial_events:
        yield _bookmark(rtype, last, initial_end=True)
    next_bookmark = time.monotonic() + bookmark_interval
    while not store.closed:
        try:
            events = store.events_after(last)
        except TooOldError as e:
            status = StatusError(410, "Expired", str(e)).status()
            yield _watch_line("ERROR", dumps(status))
            return
        for event in events:
            last = event.rv
            if event.resource == rtype.storage and event.key.startswith(prefix):
                line = _event_line(rtype, event, query)
                if line is not None:
                    yield line
        now = time.monotonic()
        if now >= deadline:
            return
        if query.allow_bookmarks and now >= next_bookmark:
            yield _bookmark(rtype, last)
            next_bookmark = now + bookmark_interval
        if not events:
            store.wait(last, max(0.0, min(1.0, deadline - now, next_bookmark - now)))
            yield None


def _matches(rtype: ResourceType, obj: Obj, query: ListQuery) -> bool:
    return query.label_selector.matches((obj.get("metadata") or {}).get("labels")) and query.field_selector.matches(
        obj, rtype.fields
    )


def _version_matches(version: Version, query: ListQuery) -> bool:
    return query.label_selector.matches(version.labels) and query.field_selector.matches_values(version.fields)


def _event_line(rtype: ResourceType, event: Event, query: ListQuery) -> bytes | None:
    now_matches = _version_matches(event.current, query)
    if event.type != "MODIFIED":
        return _watch_line(event.type, raw_served_as(rtype, event.current.raw)) if now_matches else None
    assert event.previous is not None
    before = _version_matches(event.previous, query)
    if now_matches:
        return _watch_line("MODIFIED" if before else "ADDED", raw_served_as(rtype, event.current.raw))
    if before:
        # It left the selection: DELETED with its previous content at the event's resourceVersion.
        obj = served_as(rtype, json.loads(event.previous.raw))
        obj["metadata"]["resourceVersion"] = str(event.rv)
        return _watch_line("DELETED", dumps(obj))
    return None


def _bookmark(rtype: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    metadata: Obj = {"resourceVersion": str(rv)}
    if initial_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _watch_line(
        "BOOKMARK", dumps({"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": metadata})
    )
