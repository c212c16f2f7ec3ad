"""Registered clusters (`CLUSTER#<name>`, sort key `CLUSTER`): where each cluster's API is, its labels,
how it last answered the schedules that call it, and its probe chain while jobs are parked on it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prewarm.adapters.dynamodb.table import Table, from_item
from prewarm.domain.clusters import ClusterSetup, RegisteredCluster, check_cluster_name
from prewarm.services.ports import StoreConflictError


def _cluster(v: Mapping[str, Any]) -> RegisteredCluster:
    reachable = v.get("reachable")
    return RegisteredCluster(
        name=str(v["name"]), endpoint=str(v.get("endpoint", "")), ca_data=str(v.get("ca_data", "")),
        labels=dict(v.get("labels", {})), added_at=v.get("added_at"),
        reachable=None if reachable is None else bool(reachable), reason=str(v.get("reason", "")),
        checked_at=v.get("checked_at"), agents=v.get("agents"), last_sync=v.get("last_sync"),
        setup=ClusterSetup(v.get("setup") or ClusterSetup.INSTALLED), setup_message=str(v.get("setup_message", "")),
        region=str(v.get("region", "")),
    )


def _pk(name: str) -> str:
    return f"CLUSTER#{name}"


class ClusterItems(Table):
    """The clusters `prewarm cluster add` registered (the stack's own cluster is not stored: it is the
    stack's `ClusterName`)."""

    def put_cluster(self, cluster: RegisteredCluster) -> None:
        """Registers a cluster, or changes its endpoint, CA and labels (its health stays)."""
        check_cluster_name(cluster.name)
        self._update(f"register cluster {cluster.name}", _pk(cluster.name), "CLUSTER", {
            "kind": "cluster", "name": cluster.name, "endpoint": cluster.endpoint, "ca_data": cluster.ca_data or None,
            "labels": dict(cluster.labels), "added_at": cluster.added_at, "setup": str(cluster.setup),
            "setup_message": cluster.setup_message or None, "region": cluster.region or None,
        })

    def get_cluster(self, name: str) -> RegisteredCluster | None:
        out = self._call(f"read cluster {name}", "get_item", Key=self._key(_pk(name), "CLUSTER"), ConsistentRead=True)
        return _cluster(from_item(out["Item"])) if "Item" in out else None

    def list_clusters(self) -> list[RegisteredCluster]:
        return [_cluster(v) for v in sorted(self._list_kind("cluster"), key=lambda v: str(v["name"]))]

    def delete_cluster(self, name: str) -> bool:
        out = self._call(f"forget cluster {name}", "delete_item", Key=self._key(_pk(name), "CLUSTER"),
                         ReturnValues="ALL_OLD")
        return "Attributes" in out

    def record_cluster_check(self, name: str, *, reachable: bool, reason: str, checked_at: float,
                             agents: int | None = None, synced: bool = False, own: bool = False) -> None:
        """How the cluster's API last answered a schedule (`synced`: the resource sync, whose time is its
        last sync). A registered cluster removed meanwhile stays removed; the stack's own (`own`, its
        ClusterName) gets an item for its health if it has none (registered labels or not)."""
        fields: dict[str, Any] = {"reachable": reachable, "reason": reason or None, "checked_at": checked_at}
        if agents is not None:
            fields["agents"] = agents
        if synced:
            fields["last_sync"] = checked_at
        if own:
            self._update(f"record how cluster {name} answered", _pk(name), "CLUSTER",
                         {"kind": "cluster", "name": name, **fields})
            return
        with contextlib.suppress(StoreConflictError):
            self._update(f"record how cluster {name} answered", _pk(name), "CLUSTER", fields,
                         condition="attribute_exists(pk)")

    def start_probe(self, name: str, token: str, *, due: float, lost_before: float, own: bool = False) -> bool:
        condition = "(attribute_not_exists(#probe) OR #probe_due < :lost)"
        fields: dict[str, Any] = {"probe": token, "probe_due": due}
        if own:
            fields = {"kind": "cluster", "name": name, **fields}
        else:
            condition += " AND attribute_exists(pk)"
        try:
            self._update(f"start the probes of cluster {name}", _pk(name), "CLUSTER", fields, condition=condition,
                         values={":lost": lost_before})
        except StoreConflictError:
            return False
        return True

    def pass_probe(self, name: str, token: str, *, to: str | None, due: float = 0.0) -> bool:
        fields = {"probe": to, "probe_due": due if to is not None else None}
        try:
            self._update(f"pass on the probe of cluster {name}", _pk(name), "CLUSTER", fields,
                         condition="#probe = :token", values={":token": token})
        except StoreConflictError:
            return False
        return True

    def probe_due(self, name: str) -> float | None:
        out = self._call(f"read the probes of cluster {name}", "get_item", Key=self._key(_pk(name), "CLUSTER"),
                         ConsistentRead=True, ProjectionExpression="probe_due")
        due = from_item(out.get("Item", {})).get("probe_due")
        return None if due is None else float(due)
