"""Registered nodes (`NODE#<name>`, or `NODE#<cluster>:<name>` in a registered cluster; sort key `NODE`):
each agent's hello, and how its startup taint came off."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prewarm.adapters.dynamodb.table import Table, from_item
from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped
from prewarm.domain.mirrors import MirrorConfig
from prewarm.domain.nodes import NodeBoot, NodeFootprint, NodeWarm, RegisteredNode
from prewarm.services.ports import StoreConflictError


def node_pk(name: str, cluster: str) -> str:
    return f"NODE#{scoped(cluster, name)}"


def node_kind(cluster: str) -> str:
    """The `kinds` index partition of a cluster's nodes: a cluster's sweep reads its own nodes only."""
    return scoped(cluster, "node")


def _registered_node(v: Mapping[str, Any]) -> RegisteredNode:
    return RegisteredNode(name=v["name"], labels=v.get("labels", {}), architecture=v.get("architecture", ""),
                          os=v.get("os", ""), queue_url=v.get("queue_url", ""), last_hello=v.get("last_hello", 0),
                          warm_until=float(v["warm_until"]) if "warm_until" in v else None,
                          warm=_node_warm(v.get("warm")), agent_version=str(v.get("agent_version", "")),
                          cluster=str(v.get("cluster", DEFAULT_CLUSTER)), unverified=bool(v.get("unverified")),
                          boot=_node_boot(v.get("boot")), footprint=NodeFootprint.from_dict(v.get("footprint")),
                          mirror_config=MirrorConfig.model_validate_json(v["mirror_config"]) if v.get("mirror_config")
                          else None)


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


class NodeItems(Table):
    """The nodes whose agents said hello."""

    def put_node(self, node: RegisteredNode) -> None:
        # An update, not a put: a later hello (a restarted agent) keeps how the node warmed. A hello
        # that holds the taint starts a new warm-up (a new node with a reused name), so it drops it.
        fields = {"kind": node_kind(node.cluster), "cluster": node.cluster or None, "name": node.name,
                  "labels": node.labels, "architecture": node.architecture,
                  "os": node.os, "queue_url": node.queue_url, "last_hello": node.last_hello,
                  "warm_until": node.warm_until, "agent_version": node.agent_version or None,
                  "unverified": node.unverified or None,
                  "mirror_config": node.mirror_config.model_dump_json() if node.mirror_config else None}
        if node.warm_until is not None:
            fields["warm"] = None
        self._update(f"register node {scoped(node.cluster, node.name)}", node_pk(node.name, node.cluster), "NODE",
                     fields)

    def record_warm(self, node: str, warm: NodeWarm, cluster: str = DEFAULT_CLUSTER) -> RegisteredNode:
        """Stores how the node warmed and returns its registration as the write left it (`ALL_NEW`: no read
        after); `StoreConflictError` when the node is not registered (yet)."""
        value = {"joined_at": warm.joined_at, "hello_at": warm.hello_at, "warm_at": warm.warm_at,
                 "outcome": warm.outcome, "missing": list(warm.missing), "missing_total": warm.missing_total}
        what = f"record how node {scoped(cluster, node)} warmed (not registered: no hello yet)"
        out = self._call(what, "update_item", ReturnValues="ALL_NEW", **self._update_args(
            node_pk(node, cluster), "NODE", {"warm": value}, condition="attribute_exists(pk)"))
        return _registered_node(from_item(out["Attributes"]))

    def record_boot(self, node: str, boot: NodeBoot, cluster: str = DEFAULT_CLUSTER) -> None:
        """Stores which required images the node had at boot; `StoreConflictError` when it is not registered."""
        value = {"required": list(boot.required), "present": list(boot.present), "at": boot.at}
        self._update(f"record node {scoped(cluster, node)}'s images at boot (not registered)",
                     node_pk(node, cluster), "NODE", {"boot": value}, condition="attribute_exists(pk)")

    def record_footprint(self, node: str, footprint: NodeFootprint, cluster: str = DEFAULT_CLUSTER) -> None:
        """Stores the node's footprint; `StoreConflictError` when it is not registered. SQS keeps no order, so
        the caller compares `at` with the one stored (a footprint older than it changes nothing)."""
        self._update(f"record node {scoped(cluster, node)}'s footprint (not registered)",
                     node_pk(node, cluster), "NODE", {"footprint": footprint.as_dict()},
                     condition="attribute_exists(pk)")

    def get_node(self, name: str, cluster: str = DEFAULT_CLUSTER) -> RegisteredNode | None:
        out = self._call(f"read node {scoped(cluster, name)}", "get_item",
                         Key=self._key(node_pk(name, cluster), "NODE"))
        return _registered_node(from_item(out["Item"])) if "Item" in out else None

    def list_nodes(self, cluster: str = DEFAULT_CLUSTER) -> list[RegisteredNode]:
        """The registered nodes of one cluster."""
        items = self._list_kind(node_kind(cluster))
        return [_registered_node(v) for v in sorted(items, key=lambda v: str(v["name"]))]

    def mark_node_verified(self, name: str, cluster: str = DEFAULT_CLUSTER) -> None:
        with contextlib.suppress(StoreConflictError):  # forgotten meanwhile (it left the cluster)
            self._update(f"mark node {scoped(cluster, name)} verified", node_pk(name, cluster), "NODE",
                         {"unverified": None}, condition="attribute_exists(pk)")

    def delete_node(self, name: str, cluster: str = DEFAULT_CLUSTER) -> None:
        self._call(f"forget node {scoped(cluster, name)}", "delete_item",
                   Key=self._key(node_pk(name, cluster), "NODE"))
