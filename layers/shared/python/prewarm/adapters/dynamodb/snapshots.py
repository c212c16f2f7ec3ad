"""Warm snapshots (`WARMSNAPSHOT#<name>`, sort key `WARMSNAPSHOT`): the manifest, and the state of its
bakes (`domain.bakes.SnapshotState` as JSON) under a version every write is conditional on."""

from __future__ import annotations

import json
from typing import Any

from prewarm.adapters.dynamodb.table import Table, from_item, to_item

_SK = "WARMSNAPSHOT"


def _record(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int]:
    return json.loads(item["spec"]), json.loads(item.get("state") or "{}"), int(item.get("version", 0))


class WarmSnapshotItems(Table):
    """`ports.WarmSnapshotItems` on the table."""

    def put_warm_snapshot(self, name: str, manifest: dict[str, Any], spec_hash: str) -> str:
        pk = f"{_SK}#{name}"
        current = self._call("get warm snapshot", "get_item", Key=self._key(pk, _SK), ConsistentRead=True)
        if "Item" in current and from_item(current["Item"]).get("spec_hash") == spec_hash:
            return "unchanged"
        # The spec alone: the state of the bakes stays as it is (a new spec bakes on the next event).
        self._call(f"write warm snapshot {name}", "update_item", Key=self._key(pk, _SK),
                   UpdateExpression="SET #k = :k, #n = :n, spec = :s, spec_hash = :h",
                   ExpressionAttributeNames={"#k": "kind", "#n": "name"},
                   ExpressionAttributeValues={":k": {"S": "warmsnapshot"}, ":n": {"S": name},
                                              ":s": {"S": json.dumps(manifest, sort_keys=True)},
                                              ":h": {"S": spec_hash}})
        return "configured" if "Item" in current else "created"

    def list_warm_snapshots(self) -> list[tuple[dict[str, Any], dict[str, Any], int]]:
        return [_record(v) for v in sorted(self._list_kind("warmsnapshot"), key=lambda v: str(v["name"]))]

    def get_warm_snapshot(self, name: str) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        out = self._call("get warm snapshot", "get_item", Key=self._key(f"{_SK}#{name}", _SK), ConsistentRead=True)
        return _record(from_item(out["Item"])) if "Item" in out else None

    def save_snapshot_state(self, name: str, state: dict[str, Any], version: int) -> int:
        self._call(f"write the bake state of {name}", "update_item", Key=self._key(f"{_SK}#{name}", _SK),
                   UpdateExpression="SET #s = :s, version = :next",
                   ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(version) OR version = :v)",
                   ExpressionAttributeNames={"#s": "state"},
                   ExpressionAttributeValues=to_item({":s": json.dumps(state, sort_keys=True), ":v": version,
                                                      ":next": version + 1}))
        return version + 1

    def delete_warm_snapshot(self, name: str) -> bool:
        out = self._call(f"delete warm snapshot {name}", "delete_item", Key=self._key(f"{_SK}#{name}", _SK),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out
