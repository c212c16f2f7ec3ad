"""Field ownership and server-side apply for custom resources, as sigs.k8s.io/structured-merge-diff does
them over a CRD's structural schema.

- A value's fields (`fields`): its leaves by path, in `managedFields`' FieldsV1 notation (`f:name`,
  `k:{"name":"http"}` for an item of a `map` list, `v:"a"` for an item of a `set`). An object with
  properties or additionalProperties is granular (each field apart) unless `x-kubernetes-map-type:
  atomic`; a list is atomic (one leaf) unless its `x-kubernetes-list-type` is `set` or `map`. Of the
  metadata only labels and annotations are fields; the status is the status subresource's.
- `record_update`: a create, update or patch gives its manager (`fieldManager`, else the User-Agent's
  product) the fields it changed, taken from the others; removed fields leave every manager.
- `apply`: an apply configuration merged into the live object (granular maps field by field, `set`
  and `map` lists item by item, the rest replaced whole); the fields the manager applied before and
  left out now are removed unless another manager owns them; a field the configuration changes that
  another manager owns is a conflict (409, `Apply failed with 1 conflict: conflict with "a" using
  v1: .spec.x`) unless `force`, which takes it from them.

Not done: Update entries' time-based merging of identical managers beyond (manager, operation,
subresource), version conversion of field sets, managedFields sent by clients (ignored), and
`x-kubernetes-list-type: map` items without their keys.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from prewarm_devtools.kubeapi.goformat import go_json
from prewarm_devtools.kubeapi.schema import field_schema, items_schema

Obj = dict[str, Any]
Path = tuple[str, ...]
_PRESENT = object()  # the value of a `map` list item's own path: its presence
_META_FIELDS = ("labels", "annotations")


class ApplyConflict(Exception):
    """Fields an apply would change that other managers own: (manager entry, path) each."""

    def __init__(self, conflicts: list[tuple[Obj, Path]]) -> None:
        self.conflicts = conflicts
        super().__init__(conflict_message(conflicts))


# -- schemas ------------------------------------------------------------------------------------------


def _kind(schema: Obj | None, value: Any) -> str:
    """How a value merges: `map` (field by field), `set`, `maplist`, or `leaf` (atomic)."""
    if isinstance(value, dict):
        if schema is not None and schema.get("x-kubernetes-map-type") == "atomic":
            return "leaf"
        return "map"
    if isinstance(value, list) and schema is not None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            return "set"
        if list_type == "map" and schema.get("x-kubernetes-list-map-keys"):
            return "maplist"
    return "leaf"


def _item_key(schema: Obj, item: Any) -> str:
    keys = schema.get("x-kubernetes-list-map-keys") or []
    fields = {k: item[k] for k in keys if isinstance(item, dict) and k in item}
    return "k:" + go_json(fields)


# -- field sets ---------------------------------------------------------------------------------------


def fields(obj: Obj, schema: Obj | None, subresource: str = "") -> dict[Path, Any]:
    """The leaves of a resource (its status alone for the status subresource), by path."""
    found: dict[Path, Any] = {}
    properties = (schema or {}).get("properties") or {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind") or (key == "status") != (subresource == "status"):
            continue
        if key == "metadata":
            for meta in _META_FIELDS:
                if isinstance(value, dict) and isinstance(value.get(meta), dict):
                    _walk(value[meta], None, ("f:metadata", f"f:{meta}"), found)
            continue
        _walk(value, properties.get(key), (f"f:{key}",), found)
    return found


def _walk(value: Any, schema: Obj | None, path: Path, found: dict[Path, Any]) -> None:
    kind = _kind(schema, value)
    if kind == "map":
        for key, item in value.items():
            _walk(item, field_schema(schema, key), (*path, f"f:{key}"), found)
    elif kind == "set":
        for item in value:
            found[(*path, "v:" + go_json(item))] = item
    elif kind == "maplist":
        assert schema is not None
        for item in value:
            key = _item_key(schema, item)
            found[(*path, key)] = _PRESENT
            _walk(item, items_schema(schema), (*path, key), found)
    else:
        found[path] = value


def to_fields_v1(paths: Iterable[Path]) -> Obj:
    """A set of paths as FieldsV1: a tree whose nodes that are members themselves hold `.`."""
    tree: Obj = {}
    members = set(paths)
    for path in sorted(members):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in members:
        node = tree
        for element in path:
            node = node[element]
        if node:
            node["."] = {}
    return tree


def from_fields_v1(tree: Obj, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for element, child in tree.items():
        if element == ".":
            paths.add(prefix)
        elif isinstance(child, dict) and child:
            paths |= from_fields_v1(child, (*prefix, element))
        else:
            paths.add((*prefix, element))
    return paths


def path_text(path: Path) -> str:
    """A path as structured-merge-diff prints it: `.spec.ports[name="http"].port`, `.spec.tags[="a"]`."""
    text = ""
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            text += f".{rest}"
        elif kind == "v":
            text += f"[={rest}]"
        elif kind == "k":
            text += "[" + ",".join(f"{k}={go_json(v)}" for k, v in json.loads(rest).items()) + "]"
    return text


# -- managers -----------------------------------------------------------------------------------------


def _identity(entry: Obj) -> tuple[str, str, str]:
    return str(entry.get("manager") or ""), str(entry.get("operation") or ""), str(entry.get("subresource") or "")


def _entry(manager: str, operation: str, api_version: str, now: str, paths: set[Path], subresource: str) -> Obj:
    entry: Obj = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now,
                  "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
    if subresource:
        entry["subresource"] = subresource
    return entry


def _owned(managed: list[Obj]) -> list[tuple[Obj, set[Path]]]:
    return [(entry, from_fields_v1(entry.get("fieldsV1") or {})) for entry in managed if isinstance(entry, dict)]


def _rebuild(owned: list[tuple[Obj, set[Path]]], mine: Obj | None) -> list[Obj]:
    kept = [{**entry, "fieldsV1": to_fields_v1(paths)} for entry, paths in owned if paths]
    return [*kept, mine] if mine is not None else kept


def _changed(before: dict[Path, Any], after: dict[Path, Any]) -> set[Path]:
    return {p for p, v in after.items() if p not in before or before[p] != v} | (set(before) - set(after))


def record_update(old: Obj | None, new: Obj, schema: Obj | None, manager: str, api_version: str, now: str,
                  subresource: str = "") -> list[Obj]:
    """`new`'s managedFields after a create, update or patch by `manager`."""
    managed = list(((old or {}).get("metadata") or {}).get("managedFields") or [])
    before = fields(old, schema, subresource) if old is not None else {}
    after = fields(new, schema, subresource)
    changed = _changed(before, after)
    if not changed:
        return managed  # a write that changes nothing changes no ownership either
    wanted = (manager, "Update", subresource)
    mine: set[Path] = set()
    owned = []
    for entry, paths in _owned(managed):
        if _identity(entry) == wanted:
            mine = paths
            continue
        owned.append((entry, paths - changed if _identity(entry)[2] == subresource else paths))
    mine = ((mine - changed) | {p for p in changed if p in after}) & set(after)
    return _rebuild(owned, _entry(manager, "Update", api_version, now, mine, subresource) if mine else None)


# -- apply --------------------------------------------------------------------------------------------


def merge(live: Any, config: Any, schema: Obj | None) -> Any:
    """`config` applied onto `live`: granular maps and set/map lists merged, everything else replaced."""
    kind = _kind(schema, config)
    if kind == "map" and isinstance(live, dict):
        merged = dict(live)
        for key, value in config.items():
            merged[key] = merge(live.get(key), value, field_schema(schema, key))
        return merged
    if kind == "set" and isinstance(live, list):
        return [*live, *(item for item in config if item not in live)]
    if kind == "maplist" and isinstance(live, list):
        assert schema is not None
        merged_items = list(live)
        for item in config:
            key = _item_key(schema, item)
            at = next((i for i, old in enumerate(merged_items) if _item_key(schema, old) == key), None)
            if at is None:
                merged_items.append(copy.deepcopy(item))
            else:
                merged_items[at] = merge(merged_items[at], item, items_schema(schema))
        return merged_items
    return copy.deepcopy(config)


def _remove(value: Any, path: Path, schema: Obj | None) -> None:
    """Drop the field at `path` (relative to `value`) when it is there."""
    if not path:
        return
    element, rest = path[0], path[1:]
    kind, _, name = element.partition(":")
    if kind == "f" and isinstance(value, dict) and name in value:
        if rest:
            _remove(value[name], rest, field_schema(schema, name))
        else:
            del value[name]
    elif kind in ("v", "k") and isinstance(value, list) and schema is not None:
        for i, item in enumerate(value):
            identity = "v:" + go_json(item) if kind == "v" else _item_key(schema, item)
            if identity == element:
                if rest:
                    _remove(item, rest, items_schema(schema))
                else:
                    del value[i]
                return


def _remove_from(obj: Obj, path: Path, schema: Obj | None) -> None:
    head = path[0].partition(":")[2]
    if head == "metadata":
        _remove(obj.get("metadata"), path[1:], None)
    else:
        _remove(obj, path, schema)


def apply(live: Obj | None, config: Obj, schema: Obj | None, manager: str, api_version: str, now: str, *,
          force: bool = False, subresource: str = "") -> Obj:
    """The object after `manager` applies `config` to `live` (None: it is created), its managedFields set."""
    current = copy.deepcopy(live) if live is not None else {}
    managed = list((current.get("metadata") or {}).get("managedFields") or [])
    applied = fields(config, schema, subresource)
    result: Obj = merge(current, {k: v for k, v in config.items() if k != "metadata"}, schema)
    metadata = result.setdefault("metadata", {})
    for key, value in (config.get("metadata") or {}).items():
        if key in _META_FIELDS and isinstance(value, dict):
            metadata[key] = merge(metadata.get(key), value, None)
        elif key not in metadata:
            metadata[key] = copy.deepcopy(value)
    wanted = (manager, "Apply", subresource)
    owned = _owned(managed)
    before_mine = next((paths for entry, paths in owned if _identity(entry) == wanted), set())
    others = [(entry, paths) for entry, paths in owned if _identity(entry) != wanted]
    others_own = set().union(*(paths for _, paths in others)) if others else set()
    for path in sorted(before_mine - set(applied) - others_own, key=len, reverse=True):
        _remove_from(result, path, schema)
    changed = _changed(fields(current, schema, subresource), fields(result, schema, subresource))
    conflicts = [(entry, path) for entry, paths in others if _identity(entry)[2] == subresource
                 for path in sorted(paths & set(applied) & changed)]
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    taken = {path for _, path in conflicts}
    others = [(entry, paths - taken) for entry, paths in others]
    metadata["managedFields"] = _rebuild(others, _entry(manager, "Apply", api_version, now, set(applied),
                                                        subresource))
    return result


def manager_text(entry: Obj) -> str:
    """A manager as the API server's conflict errors name it (printManager): an Update manager with its
    apiVersion and time, a subresource's with the subresource."""
    text = json.dumps(str(entry.get("manager") or ""))
    if entry.get("subresource"):
        text += f" with subresource {json.dumps(entry['subresource'])}"
    if entry.get("operation") == "Update":
        text += f" using {entry.get('apiVersion', '')}" + (f" at {entry['time']}" if entry.get("time") else "")
    return text


def conflict_message(conflicts: list[tuple[Obj, Path]]) -> str:
    """The 409's message (getConflictMessage, over structured-merge-diff's paths)."""
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        return f"Apply failed with 1 conflict: conflict with {manager_text(entry)}: {path_text(path)}"
    by_manager: dict[str, list[Path]] = {}
    for entry, path in conflicts:
        by_manager.setdefault(manager_text(entry), []).append(path)
    lines = []
    for manager in sorted(by_manager):
        lines.append(f"conflicts with {manager}:")
        lines += [f"- {path_text(path)}" for path in by_manager[manager]]
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
