"""The three patch formats the API server accepts for built-in types.

- JSON merge patch (RFC 7386): maps merge, `null` deletes, lists are replaced.
- Strategic merge patch: as merge patch, but lists with a patch merge key merge item by item,
  primitive lists with strategy `merge` are unioned, and the directives `$patch`
  (replace/delete/merge), `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` and
  `$retainKeys` apply. Lists without a strategy (e.g. ServiceAccount.imagePullSecrets) are
  replaced, as on a real server.
- JSON patch (RFC 6902): add, remove, replace, move, copy, test.

All functions return new objects and leave their inputs untouched.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from prewarm_devtools.kubeapi.errors import FieldError, StatusError, bad_request, invalid

#: The media types of the patch formats.
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)
#: What a custom resource's PATCH accepts (and the 415 lists): no strategic merge without Go types, and
#: server-side apply (built-in types have no schemas here to apply by, so they refuse it).
CUSTOM_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)

_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_DELETE_FROM = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of `target` by `patch`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    # A replaced list is taken as sent; directive keys can never be fields and are dropped on decode.
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def strategic_merge_patch(
    original: dict[str, Any], patch: dict[str, Any], merge_lists: Mapping[str, str | None]
) -> dict[str, Any]:
    """Apply a strategic merge patch; `merge_lists` maps list paths (`spec.containers[].env`) to merge keys."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    result = _merge_map(original, patch, "", merge_lists)
    return result if result is not None else {}


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _merge_map(
    original: Any, patch: dict[str, Any], path: str, lists: Mapping[str, str | None]
) -> dict[str, Any] | None:
    directive = patch.get(_PATCH)
    if directive == "delete":
        return None
    if directive == "replace":
        replaced: dict[str, Any] = _strip_directives(patch)
        return replaced
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive} in map: {json.dumps(patch)}")
    result: dict[str, Any] = dict(original) if isinstance(original, dict) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in (_PATCH, _RETAIN_KEYS):
            continue
        if key.startswith(_SET_ORDER):
            orders[key[len(_SET_ORDER) :]] = value if isinstance(value, list) else []
            continue
        if key.startswith(_DELETE_FROM):
            name = key[len(_DELETE_FROM) :]
            if not isinstance(value, list):
                raise bad_request(f"{key} must be a list of primitives")
            current = result.get(name)
            if isinstance(current, list):
                result[name] = [v for v in current if v not in value]
            continue
        child = _child(path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value, child, lists)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and child in lists:
            result[key] = _merge_list(result.get(key), value, child, lists)
        else:
            result[key] = _strip_directives(value)
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            result[name] = _apply_order(result[name], order, lists.get(_child(path, name)))
    retain = patch.get(_RETAIN_KEYS)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: Any, patch: list[Any], path: str, lists: Mapping[str, str | None]) -> list[Any]:
    merge_key = lists[path]
    current = list(original) if isinstance(original, list) else []
    if merge_key is None:
        # A set of primitives: union, keeping the original order.
        return current + [v for v in patch if v not in current]
    if any(isinstance(item, dict) and item.get(_PATCH) == "replace" for item in patch):
        return [_strip_directives(i) for i in patch if not (isinstance(i, dict) and i.get(_PATCH) == "replace")]
    item_path = path + "[]"
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(f"strategic merge patch of {path}: expected a list of objects, found {json.dumps(item)}")
        if merge_key not in item:
            # An unclassified error of the patch library: 500 with no reason, as the API answers it.
            raise StatusError(500, "", f"map: {json.dumps(item)} does not contain declared merge key: {merge_key}")
        index = next(
            (i for i, have in enumerate(current) if isinstance(have, dict) and have.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get(_PATCH) == "delete":
            current = [h for h in current if not (isinstance(h, dict) and h.get(merge_key) == item[merge_key])]
        elif index is None:
            current.append(_strip_directives(item))
        else:
            merged = _merge_map(current[index], item, item_path, lists)
            if merged is None:
                del current[index]
            else:
                current[index] = merged
    return current


def _apply_order(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    def identity(item: Any) -> Any:
        if merge_key is not None and isinstance(item, dict):
            return item.get(merge_key)
        return item

    wanted = [o.get(merge_key) if merge_key and isinstance(o, dict) else o for o in order]
    rank = {json.dumps(w, sort_keys=True): i for i, w in enumerate(wanted)}
    ordered = sorted(
        enumerate(items),
        key=lambda pair: (rank.get(json.dumps(identity(pair[1]), sort_keys=True), len(rank)), pair[0]),
    )
    return [item for _, item in ordered]


# -- JSON patch (RFC 6902) -------------------------------------------------------------------------


class _JsonPatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _JsonPatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _JsonPatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise _JsonPatchError(f"array index {index} out of bounds")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise _JsonPatchError(f"doc is missing path: {path}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise _JsonPatchError(f"doc is missing path: {path}")
    return node


def _take(doc: Any, path: str, *, remove: bool = False) -> Any:
    """The value at `path`; with `remove`, taken out of the document."""
    what = "remove operation does not apply: " if remove else ""
    tokens = _pointer(path)
    if not tokens:
        if remove:
            raise _JsonPatchError("cannot remove the whole document")
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _JsonPatchError(f"{what}doc is missing key: {path}")
        return parent.pop(last) if remove else parent[last]
    if isinstance(parent, list):
        index = _index(parent, last, allow_end=False)
        return parent.pop(index) if remove else parent[index]
    raise _JsonPatchError(f"{what}doc is missing path: {path}")


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _JsonPatchError(f"replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, allow_end=False)] = value
        else:
            parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise _JsonPatchError(f"add operation does not apply: doc is missing path: {path}")
    return doc


def json_patch(document: dict[str, Any], operations: Any) -> dict[str, Any]:
    """Apply RFC 6902 `operations`; failures are 422 Invalid as the API server reports them."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a JSON array of operations")
    doc: Any = copy.deepcopy(document)
    try:
        for op in operations:
            if not isinstance(op, dict) or "op" not in op or "path" not in op:
                raise _JsonPatchError(f"invalid operation {json.dumps(op)}: needs op and path")
            kind, path = op["op"], op["path"]
            if kind in ("add", "replace", "test") and "value" not in op:
                raise _JsonPatchError(f"{kind} operation on {path} has no value")
            if kind == "add":
                doc = _add(doc, path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                _take(doc, path, remove=True)
            elif kind == "replace":
                doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
            elif kind in ("move", "copy"):
                source = op.get("from")
                if not isinstance(source, str):
                    raise _JsonPatchError(f"{kind} operation on {path} has no from")
                value = _take(doc, source, remove=True) if kind == "move" else copy.deepcopy(_take(doc, source))
                doc = _add(doc, path, value)
            elif kind == "test":
                if _take(doc, path) != op["value"]:
                    raise _JsonPatchError(f"testing value {path} failed: test failed")
            else:
                raise _JsonPatchError(f"Unexpected kind: {kind}")
    except _JsonPatchError as e:
        raise _invalid_patch(operations, str(e)) from None
    if not isinstance(doc, dict):
        raise _invalid_patch(operations, "the patched document is not a JSON object")
    return doc


def _invalid_patch(operations: Any, detail: str) -> StatusError:
    error = invalid("", "", [FieldError("Invalid", "patch", json.dumps(operations), detail)])
    error.message = error.message.lstrip()
    return error
