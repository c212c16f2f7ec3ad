"""`meta.k8s.io` Tables of custom resources, as `kubectl get` asks for them
(`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), built as the CRD table convertor builds them.

Columns: Name, then the version's additionalPrinterColumns (Age alone when it declares none). A cell
is found by a simple JSON path (`.status.active`, `.spec.images[0]`; no filters or wildcards, which
give an empty cell), typed by its column: strings as jsonpath prints them, integers, numbers,
booleans, and dates as the age `kubectl` shows (`5m2s`).
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable
from typing import Any

from prewarm_devtools.kubeapi.errors import bad_request
from prewarm_devtools.kubeapi.goformat import go_float, go_json
from prewarm_devtools.kubeapi.resources.types import ResourceType

Obj = dict[str, Any]

_NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources may "
    "allow a client to request the generation of an appropriate name automatically. Name is primarily intended "
    "for creation idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def _find(obj: Any, path: str) -> tuple[bool, Any]:
    """The value at a simple JSON path, and whether it was there."""
    position, value = 0, obj
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None:
            return False, None
        key, index = step.groups()
        if key is not None and isinstance(value, dict) and key in value:
            value = value[key]
        elif index is not None and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return False, None
        position = step.end()
    return True, value


def human_duration(seconds: float) -> str:
    """apimachinery's HumanDuration: ~2-3 significant figures of a duration."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m" if whole % 60 == 0 else f"{minutes}m{whole % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(value: str, now: float) -> str:
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if moment.tzinfo is None:
        return "<invalid>"
    return human_duration(now - moment.timestamp())


def _text(value: Any) -> str:
    # client-go's jsonpath: maps and lists as JSON, the rest as Go prints it.
    if isinstance(value, dict | list):
        return go_json(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)


def cell(kind: str, value: Any, now: float) -> Any:
    """A column's cell for the value its path found (cellForJSONValue, and jsonpath printing for strings)."""
    if value is None:
        return None
    if kind == "string":
        return _text(value)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "integer" and number:
        return int(value)
    if kind == "number" and number:
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "date" and isinstance(value, str):
        return _age(value, now)
    return None


def _row_object(obj: Obj, include: str, version: str) -> Any:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}", "metadata": obj.get("metadata")}


def to_table(
    rtype: ResourceType, body: Obj, version: str, include: str = "", clock: Callable[[], float] = time.time
) -> Obj:
    """The Table of an object or a list of `rtype` (a custom resource), rows as `includeObject` asks."""
    include = include or "Metadata"
    if include not in ("None", "Metadata", "Object"):
        raise bad_request(f'unrecognized includeObject value: "{include}"')
    assert rtype.custom is not None
    columns = [{"name": "Name", "type": "string", "format": "name", "description": _NAME_DESCRIPTION, "priority": 0}]
    for column in rtype.custom.columns:
        path = str(column.get("jsonPath") or "")
        description = column.get("description") or f"Custom resource definition column (in JSONPath format): {path}"
        columns.append(
            {
                "name": column.get("name", ""),
                "type": column.get("type", ""),
                "format": column.get("format", ""),
                "description": description,
                "priority": column.get("priority", 0),
            }
        )
    items = body.get("items", [body])
    now = clock()
    rows = []
    for item in items:
        cells = [(item.get("metadata") or {}).get("name", "")]
        for column in rtype.custom.columns:
            found, value = _find(item, str(column.get("jsonPath") or ""))
            cells.append(cell(str(column.get("type")), value, now) if found else None)
        rows.append({"cells": cells, "object": _row_object(item, include, version)})
    source = body.get("metadata") or {}
    metadata = {k: source[k] for k in ("resourceVersion", "continue", "remainingItemCount") if k in source}
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    }
