"""The small item kinds of `MemoryJobStore` (`tests/support/memory_store.py`), each written on the
`MemoryTable` as its module of `prewarm.adapters.dynamodb` writes it on DynamoDB: registered nodes
(`nodes`), prewarm rules and schedule runs (`rules`), registered clusters (`clusters`)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER, ClusterSetup, RegisteredCluster, check_cluster_name, scoped
from prewarm.domain.cronjobs import StoredCronJob
from prewarm.domain.keys import JobKey
from prewarm.domain.mirrors import MirrorConfig
from prewarm.domain.nodes import NodeBoot, NodeFootprint, NodeWarm, RegisteredNode
from prewarm.domain.registry_budget import BudgetState, RegistryBudget, reserve_starts
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.schedules import ScheduleRun
from prewarm.domain.warm_budgets import WarmBudget
from prewarm.services.ports import StoreConflictError
from tests.support.memory_table import MemoryTable, equal, has


class TableItems:
    """Holds the table every item kind of the store shares."""

    def __init__(self, table: MemoryTable | None = None) -> None:
        self.table = table if table is not None else MemoryTable()

    def _list_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every item of a kind, as the adapter reads the keys-only `kinds` index, then the items."""
        return self.table.index("kind", kind)


# -- registered nodes (adapters/dynamodb/nodes.py) ---------------------------------------------


def node_pk(name: str, cluster: str) -> str:
    return f"NODE#{scoped(cluster, name)}"


def _node_warm(value: Any) -> NodeWarm | None:
    if not isinstance(value, dict):
        return None
    return NodeWarm(joined_at=float(value.get("joined_at", 0)), hello_at=float(value.get("hello_at", 0)),
                    warm_at=float(value.get("warm_at", 0)), outcome=str(value.get("outcome", "")),
                    missing=tuple(str(m) for m in value.get("missing", [])),
                    missing_total=int(value.get("missing_total", 0)))


def _node_boot(value: Any) -> NodeBoot | None:
    if not isinstance(value, dict):
        return None
    return NodeBoot(required=tuple(str(r) for r in value.get("required", [])),
                    present=tuple(str(p) for p in value.get("present", [])), at=float(value.get("at", 0)))


def _registered_node(v: Mapping[str, Any]) -> RegisteredNode:
    return RegisteredNode(name=v["name"], labels=v.get("labels", {}), architecture=v.get("architecture", ""),
                          os=v.get("os", ""), queue_url=v.get("queue_url", ""), last_hello=v.get("last_hello", 0),
                          warm_until=float(v["warm_until"]) if "warm_until" in v else None,
                          warm=_node_warm(v.get("warm")), agent_version=str(v.get("agent_version", "")),
                          cluster=str(v.get("cluster", DEFAULT_CLUSTER)), unverified=bool(v.get("unverified")),
                          boot=_node_boot(v.get("boot")), footprint=NodeFootprint.from_dict(v.get("footprint")),
                          mirror_config=MirrorConfig.model_validate_json(v["mirror_config"]) if v.get("mirror_config")
                          else None)


class MemoryNodeItems(TableItems):
    """`NodeItems`: the nodes whose agents said hello."""

    def put_node(self, node: RegisteredNode) -> None:
        fields = {"kind": scoped(node.cluster, "node"), "cluster": node.cluster or None, "name": node.name,
                  "labels": node.labels, "architecture": node.architecture,
                  "os": node.os, "queue_url": node.queue_url, "last_hello": node.last_hello,
                  "warm_until": node.warm_until, "agent_version": node.agent_version or None,
                  "unverified": node.unverified or None,
                  "mirror_config": node.mirror_config.model_dump_json() if node.mirror_config else None}
        if node.warm_until is not None:
            fields["warm"] = None
        self.table.update(f"register node {scoped(node.cluster, node.name)}", node_pk(node.name, node.cluster),
                          "NODE", fields)

    def record_warm(self, node: str, warm: NodeWarm, cluster: str = DEFAULT_CLUSTER) -> RegisteredNode:
        value = {"joined_at": warm.joined_at, "hello_at": warm.hello_at, "warm_at": warm.warm_at,
                 "outcome": warm.outcome, "missing": list(warm.missing), "missing_total": warm.missing_total}
        what = f"record how node {scoped(cluster, node)} warmed (not registered: no hello yet)"
        return _registered_node(self.table.update(what, node_pk(node, cluster), "NODE", {"warm": value},
                                                  condition=lambda i: has(i, "pk")))

    def record_boot(self, node: str, boot: NodeBoot, cluster: str = DEFAULT_CLUSTER) -> None:
        value = {"required": list(boot.required), "present": list(boot.present), "at": boot.at}
        self.table.update(f"record node {scoped(cluster, node)}'s images at boot (not registered)",
                          node_pk(node, cluster), "NODE", {"boot": value}, condition=lambda i: has(i, "pk"))

    def record_footprint(self, node: str, footprint: NodeFootprint, cluster: str = DEFAULT_CLUSTER) -> None:
        self.table.update(f"record node {scoped(cluster, node)}'s footprint (not registered)",
                          node_pk(node, cluster), "NODE", {"footprint": footprint.as_dict()},
                          condition=lambda i: has(i, "pk"))

    def get_node(self, name: str, cluster: str = DEFAULT_CLUSTER) -> RegisteredNode | None:
        item = self.table.get(node_pk(name, cluster), "NODE")
        return _registered_node(item) if item is not None else None

    def list_nodes(self, cluster: str = DEFAULT_CLUSTER) -> list[RegisteredNode]:
        items = self._list_kind(scoped(cluster, "node"))
        return [_registered_node(v) for v in sorted(items, key=lambda v: str(v["name"]))]

    def mark_node_verified(self, name: str, cluster: str = DEFAULT_CLUSTER) -> None:
        with contextlib.suppress(StoreConflictError):
            self.table.update(f"mark node {scoped(cluster, name)} verified", node_pk(name, cluster), "NODE",
                              {"unverified": None}, condition=lambda i: has(i, "pk"))

    def delete_node(self, name: str, cluster: str = DEFAULT_CLUSTER) -> None:
        self.table.delete(f"forget node {scoped(cluster, name)}", node_pk(name, cluster), "NODE")


# -- prewarm rules and schedule runs (adapters/dynamodb/rules.py) ------------------------------


class MemoryRuleItems(TableItems):
    """`RuleItems`: the prewarm rules, each with its spec and spec hash."""

    def put_rule(self, name: str, spec: dict[str, Any], spec_hash: str) -> str:
        current = self.table.get(f"RULE#{name}", "RULE")
        if current is not None and current.get("spec_hash") == spec_hash:
            return "unchanged"
        self.table.put(f"write rule {name}", {"pk": f"RULE#{name}", "sk": "RULE", "kind": "rule", "name": name,
                                              "spec": json.dumps(spec, sort_keys=True), "spec_hash": spec_hash})
        return "configured" if current is not None else "created"

    def list_rules(self) -> list[dict[str, Any]]:
        return [json.loads(v["spec"]) for v in sorted(self._list_kind("rule"), key=lambda v: str(v["name"]))]

    def delete_rule(self, name: str) -> bool:
        return self.table.delete(f"delete rule {name}", f"RULE#{name}", "RULE") is not None


class MemoryCronJobItems(TableItems):
    """`CronJobItems`: the AdvancedCronJobs, each with its manifest and spec hash."""

    def put_cron_job(self, key: JobKey, manifest: dict[str, Any], spec_hash: str, uid: str = "") -> str:
        current = self.table.get(f"CRON#{key}", "CRON")
        if current is not None and current.get("spec_hash") == spec_hash:
            return "unchanged"
        self.table.put(f"write cron job {key}", {"pk": f"CRON#{key}", "sk": "CRON", "kind": "cronjob",
                                                 "key": str(key), "spec": json.dumps(manifest, sort_keys=True),
                                                 "spec_hash": spec_hash,
                                                 "uid": uid or (current or {}).get("uid") or str(uuid.uuid4())})
        return "configured" if current is not None else "created"

    @staticmethod
    def _cron_job(value: Mapping[str, Any]) -> StoredCronJob:
        return StoredCronJob(JobKey.parse(str(value["key"])), json.loads(value["spec"]), str(value["spec_hash"]),
                             str(value.get("uid", "")))

    def get_cron_job(self, key: JobKey) -> StoredCronJob | None:
        item = self.table.get(f"CRON#{key}", "CRON")
        return self._cron_job(item) if item is not None else None

    def list_cron_jobs(self) -> list[StoredCronJob]:
        return [self._cron_job(v) for v in sorted(self._list_kind("cronjob"), key=lambda v: str(v["key"]))]

    def delete_cron_job(self, key: JobKey) -> bool:
        return self.table.delete(f"delete cron job {key}", f"CRON#{key}", "CRON") is not None


class MemoryScheduleRunItems(TableItems):
    """`ScheduleRuns`: one item per schedule, overwritten by each run, of no kind."""

    def record_run(self, run: ScheduleRun) -> None:
        self.table.put(f"record the {run.schedule} run",
                       {"pk": f"SCHEDULE#{run.schedule}", "sk": "RUN", "schedule": run.schedule,
                        "started_at": run.started_at, "finished_at": run.finished_at})

    def last_runs(self, schedules: Sequence[str]) -> dict[str, ScheduleRun]:
        keys = [(f"SCHEDULE#{name}", "RUN") for name in dict.fromkeys(schedules)]
        return {
            v["schedule"]: ScheduleRun(v["schedule"], started_at=float(v["started_at"]),
                                       finished_at=float(v["finished_at"]))
            for v in self.table.batch_get(keys)
        }


# -- registered clusters (adapters/dynamodb/clusters.py) ---------------------------------------


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


class MemoryClusterItems(TableItems):
    """`ClusterItems`: the registered clusters, and the own cluster's health."""

    def put_cluster(self, cluster: RegisteredCluster) -> None:
        check_cluster_name(cluster.name)
        self.table.update(f"register cluster {cluster.name}", f"CLUSTER#{cluster.name}", "CLUSTER", {
            "kind": "cluster", "name": cluster.name, "endpoint": cluster.endpoint, "ca_data": cluster.ca_data or None,
            "labels": dict(cluster.labels), "added_at": cluster.added_at, "setup": str(cluster.setup),
            "setup_message": cluster.setup_message or None, "region": cluster.region or None,
        })

    def get_cluster(self, name: str) -> RegisteredCluster | None:
        item = self.table.get(f"CLUSTER#{name}", "CLUSTER")
        return _cluster(item) if item is not None else None

    def list_clusters(self) -> list[RegisteredCluster]:
        return [_cluster(v) for v in sorted(self._list_kind("cluster"), key=lambda v: str(v["name"]))]

    def delete_cluster(self, name: str) -> bool:
        return self.table.delete(f"forget cluster {name}", f"CLUSTER#{name}", "CLUSTER") is not None

    def record_cluster_check(self, name: str, *, reachable: bool, reason: str, checked_at: float,
                             agents: int | None = None, synced: bool = False, own: bool = False) -> None:
        fields: dict[str, Any] = {"reachable": reachable, "reason": reason or None, "checked_at": checked_at}
        if agents is not None:
            fields["agents"] = agents
        if synced:
            fields["last_sync"] = checked_at
        what = f"record how cluster {name} answered"
        if own:
            self.table.update(what, f"CLUSTER#{name}", "CLUSTER", {"kind": "cluster", "name": name, **fields})
            return
        with contextlib.suppress(StoreConflictError):
            self.table.update(what, f"CLUSTER#{name}", "CLUSTER", fields, condition=lambda i: has(i, "pk"))


    def start_probe(self, name: str, token: str, *, due: float, lost_before: float, own: bool = False) -> bool:
        def free(item: Any) -> bool:
            idle = not has(item, "probe") or float(item["probe_due"]) < lost_before
            return idle and (own or has(item, "pk"))

        fields: dict[str, Any] = {"probe": token, "probe_due": due}
        if own:
            fields = {"kind": "cluster", "name": name, **fields}
        try:
            self.table.update(f"start the probes of cluster {name}", f"CLUSTER#{name}", "CLUSTER", fields,
                              condition=free)
        except StoreConflictError:
            return False
        return True

    def pass_probe(self, name: str, token: str, *, to: str | None, due: float = 0.0) -> bool:
        fields = {"probe": to, "probe_due": due if to is not None else None}
        try:
            self.table.update(f"pass on the probe of cluster {name}", f"CLUSTER#{name}", "CLUSTER", fields,
                              condition=lambda item: equal(item, "probe", token))
        except StoreConflictError:
            return False
        return True

    def probe_due(self, name: str) -> float | None:
        item = self.table.get(f"CLUSTER#{name}", "CLUSTER") or {}
        return None if item.get("probe_due") is None else float(item["probe_due"])


class MemoryBudgetItems(TableItems):
    """`BudgetItems`: one item per registry budget, its GCRA arrival time written under a version."""

    def reserve_pull_starts(self, key: str, costs: Sequence[float], *, now: float,
                            burst_seconds: float, horizon: float | None = None,
                            budget: RegistryBudget | None = None) -> tuple[float, ...]:
        if not costs:
            return ()

        def reserve() -> tuple[float, ...]:
            current = self.table.get(f"BUDGET#{key}", "BUDGET")
            version = int(current["version"]) if current is not None else 0
            reservation = reserve_starts(None if current is None else float(current["tat"]), now=now, costs=costs,
                                         burst_seconds=burst_seconds, horizon=horizon)

            def unchanged(item: Any) -> bool:
                return item is None if current is None else equal(item, "version", version)

            rates = BudgetState(reservation.tat, budget).fields() if budget is not None else {"tat": reservation.tat}
            self.table.update(f"reserve {len(costs)} pull starts of {key}", f"BUDGET#{key}", "BUDGET",
                              {**rates, "version": version + 1, "updated_at": now},
                              condition=unchanged)
            return reservation.starts

        return retry_on_conflict(reserve, conflict=StoreConflictError, attempts=8, exhausted=lambda: (  # as the adapter
            StoreConflictError(f"the budget of {key} kept changing: 8 reservations refused")))

    def get_budget(self, key: str) -> BudgetState | None:
        item = self.table.get(f"BUDGET#{key}", "BUDGET")
        return BudgetState.of_item(item) if item is not None else None


# -- warm snapshots (adapters/dynamodb/snapshots.py) ------------------------------------------------

def _warm_snapshot(item: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int]:
    return json.loads(item["spec"]), json.loads(item.get("state") or "{}"), int(item.get("version", 0))


class MemoryWarmSnapshotItems(TableItems):
    """`WarmSnapshotItems`: each warm snapshot's manifest, and its bakes' state under a version."""

    def put_warm_snapshot(self, name: str, manifest: dict[str, Any], spec_hash: str) -> str:
        current = self.table.get(f"WARMSNAPSHOT#{name}", "WARMSNAPSHOT")
        if current is not None and current.get("spec_hash") == spec_hash:
            return "unchanged"
        self.table.update(f"write warm snapshot {name}", f"WARMSNAPSHOT#{name}", "WARMSNAPSHOT", {
            "kind": "warmsnapshot", "name": name, "spec": json.dumps(manifest, sort_keys=True), "spec_hash": spec_hash})
        return "configured" if current is not None else "created"

    def list_warm_snapshots(self) -> list[tuple[dict[str, Any], dict[str, Any], int]]:
        return [_warm_snapshot(v) for v in sorted(self._list_kind("warmsnapshot"), key=lambda v: str(v["name"]))]

    def get_warm_snapshot(self, name: str) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        item = self.table.get(f"WARMSNAPSHOT#{name}", "WARMSNAPSHOT")
        return _warm_snapshot(item) if item is not None else None

    def save_snapshot_state(self, name: str, state: dict[str, Any], version: int) -> int:
        self.table.update(f"write the bake state of {name}", f"WARMSNAPSHOT#{name}", "WARMSNAPSHOT",
                          {"state": json.dumps(state, sort_keys=True), "version": version + 1},
                          condition=lambda i: i is not None and int(i.get("version", 0)) == version)
        return version + 1

    def delete_warm_snapshot(self, name: str) -> bool:
        return self.table.delete(f"delete warm snapshot {name}", f"WARMSNAPSHOT#{name}", "WARMSNAPSHOT") is not None


class MemoryWarmBudgetItems(TableItems):
    """`WarmBudgetItems`: each cluster's namespaces' warm budgets, one item, as the DynamoDB adapter keeps them."""

    def get_warm_budgets(self, cluster: str = DEFAULT_CLUSTER) -> dict[str, WarmBudget]:
        item = self.table.get(f"WARMBUDGETS#{cluster}", "WARMBUDGETS")
        stored = json.loads(item["budgets"]) if item is not None else {}
        return {ns: WarmBudget.from_dict(ns, value) for ns, value in stored.items()}

    def put_warm_budgets(self, budgets: Mapping[str, WarmBudget], cluster: str = DEFAULT_CLUSTER) -> bool:
        if budgets == self.get_warm_budgets(cluster):
            return False
        value = json.dumps({ns: b.as_dict() for ns, b in sorted(budgets.items())}, sort_keys=True)
        self.table.update(f"write the warm budgets of cluster {cluster!r}", f"WARMBUDGETS#{cluster}", "WARMBUDGETS",
                          {"budgets": value})
        return True
