"""`FakeCluster`: the Kubernetes ports (`Cluster` for dispatch, the refresher's and the mirror's) over
plain dicts, and builders of the objects it holds."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prewarm.services.ports import ClusterConflictError, ClusterError


def make_node(name: str, *, arch: str = "amd64", ready: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", **labels}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def make_pod(name: str, namespace: str, node: str | None, phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def shipped_daemon_set() -> dict[str, Any]:
    """The agent DaemonSet as `prewarm install` ships it (every taint tolerated, Linux and not Fargate)."""
    import yaml

    from prewarm_cli.install.render import MANIFESTS

    return dict(yaml.safe_load((MANIFESTS / "40-daemonset.yaml").read_text()))


def make_namespace(name: str, phase: str = "Active", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}},
            "status": {"phase": phase}}


def _partial(node: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": copy.deepcopy(node["metadata"])}


@dataclass
class FakeCluster:
    """A cluster in memory, with resourceVersion checks on writes as the API server does.

    Lists return every node and namespace: the domain re-checks selectors (`selectors` records the
    namespace selectors asked for). `before_write(namespace, name)` runs between a read and the next
    write, to stage a race; `broken[namespace]` is raised by every secret or service account call in
    that namespace.
    """

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    service_accounts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    broken: dict[str, ClusterError] = field(default_factory=dict)
    before_write: Callable[[str, str], None] | None = None
    rv: int = 100
    selectors: list[str | None] = field(default_factory=list)
    writes: list[tuple[str, str, str]] = field(default_factory=list)
    config_maps: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The agent DaemonSet dispatch reads, by (namespace, name); `daemon_set_error` is raised on a read.
    daemon_sets: dict[tuple[str, str], dict[str, Any]] = field(
        default_factory=lambda: {("prewarm-system", "prewarm-agent"): shipped_daemon_set()})
    daemon_set_error: ClusterError | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    # What `/version` answers (EKS's shape).
    version: dict[str, str] = field(default_factory=lambda: {"major": "1", "minor": "33+",
                                                             "gitVersion": "v1.33.5-eks-3025e55"})

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _check(self, ns: str) -> None:
        if ns in self.broken:
            raise self.broken[ns]

    def _hook(self, ns: str, name: str) -> None:
        if self.before_write is not None:
            self.before_write(ns, name)

    def get_version(self) -> dict[str, Any]:
        return dict(self.version)

    # --- nodes and pods (dispatch) ----------------------------------------------------------------

    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The agents' ConfigMap (`config_maps`), as the sweep reads it, and the agent DaemonSet
        (`daemon_sets`), as dispatch reads it; any other object is absent."""
        if plural == "daemonsets":
            if self.daemon_set_error is not None:
                raise self.daemon_set_error
            return copy.deepcopy(self.daemon_sets.get((namespace or "", name)))
        return self.config_maps.get((namespace or "", name)) if plural == "configmaps" else None

    def patch_node(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of `test` and `remove` ops on the node's taints, or of `test`, `add` and `remove` ops on
        its labels, failing (422) when a test does."""
        from prewarm.services.ports import ClusterInvalidError, ClusterNotFoundError

        node = self._find_node(name)
        if node is None:
            raise ClusterNotFoundError(f'nodes "{name}" not found', status=404, reason="NotFound")
        if all(op["path"].startswith("/metadata/labels") for op in ops):
            return self._patch_labels(name, node, ops)
        taints = list((node.get("spec") or {}).get("taints") or [])
        for op in ops:
            index = int(op["path"].rsplit("/", 1)[1])
            if op["op"] == "test" and (index >= len(taints) or taints[index] != op["value"]):
                raise ClusterInvalidError(f"test of {op['path']} failed", status=422, reason="Invalid")
            if op["op"] == "remove":
                del taints[index]
        node.setdefault("spec", {})["taints"] = taints
        self.writes.append(("patch", "node", name))
        return node

    def _patch_labels(self, name: str, node: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
        from prewarm.services.ports import ClusterInvalidError

        labels = node.setdefault("metadata", {}).setdefault("labels", {})
        for op in ops:
            if op["path"] == "/metadata/labels":
                labels.update(op["value"])
                continue
            key = op["path"].removeprefix("/metadata/labels/").replace("~1", "/").replace("~0", "~")
            if op["op"] == "test" and labels.get(key) != op["value"]:
                raise ClusterInvalidError(f"test of {op['path']} failed", status=422, reason="Invalid")
            if op["op"] == "add":
                labels[key] = op["value"]
            elif op["op"] == "remove":
                del labels[key]
        self.writes.append(("patch", "node", name))
        return node

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic merge patch of the node's status: its conditions merge by `type`."""
        from prewarm.services.ports import ClusterNotFoundError

        node = self._find_node(name)
        if node is None:
            raise ClusterNotFoundError(f'nodes "{name}" not found', status=404, reason="NotFound")
        conditions = node.setdefault("status", {}).setdefault("conditions", [])
        for new in (patch.get("status") or {}).get("conditions") or []:
            conditions[:] = [c for c in conditions if c.get("type") != new["type"]] + [dict(new)]
        self.writes.append(("patch", "node/status", name))
        return node

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append(dict(body))
        return body

    def list_nodes(self, label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        return list(self.nodes)

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None,
                     label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        """Events (`events`), with the API server's `a.b=value` field selector terms; nothing else is kept."""
        if plural != "events":
            return []
        terms = [term.split("=", 1) for term in (field_selector or "").split(",") if term]

        def at(obj: Any, path: str) -> Any:
            for part in path.split("."):
                obj = (obj or {}).get(part)
            return obj

        return [e for e in self.events if all(str(at(e, path)) == value for path, value in terms)
                and (namespace is None or at(e, "metadata.namespace") == namespace)]

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self._find_node(name)

    def _find_node(self, name: str) -> dict[str, Any] | None:
        # The fake's own lookups go through here, so a test may wrap get_node to count the caller's reads.
        return next((n for n in self.nodes if n["metadata"]["name"] == name), None)

    def list_node_metadata(self) -> list[dict[str, Any]]:
        """`list_nodes` as metadata only (replace `list_nodes` to serve a stale list to both)."""
        return [_partial(n) for n in self.list_nodes()]

    def get_node_metadata(self, name: str) -> dict[str, Any] | None:
        node = self._find_node(name)
        return None if node is None else _partial(node)

    def list_pods(self, namespace: str | None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.pods if namespace is None or p["metadata"]["namespace"] == namespace]

    # --- namespaces, secrets, service accounts (credentials) --------------------------------------

    def add_namespace(self, name: str, phase: str = "Active", *, accounts: tuple[str, ...] = ("default",),
                      **labels: str) -> None:
        self.namespaces.append(make_namespace(name, phase, **labels))
        for account in accounts:
            self.service_accounts[(name, account)] = {
                "metadata": {"name": account, "namespace": name, "resourceVersion": self._next_rv()}}

    def list_namespaces(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.selectors.append(label_selector)
        return copy.deepcopy(self.namespaces)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check(namespace)
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found)

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check(namespace)
        name = body["metadata"]["name"]
        self._hook(namespace, name)
        if (namespace, name) in self.secrets:
            raise ClusterConflictError(f'secrets "{name}" already exists', status=409, reason="AlreadyExists")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[(namespace, name)] = stored
        self.writes.append(("create", namespace, name))
        return copy.deepcopy(stored)

    def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check(namespace)
        self._hook(namespace, name)
        current = self.secrets[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ClusterConflictError("the object has been modified", status=409, reason="Conflict")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[(namespace, name)] = stored
        self.writes.append(("replace", namespace, name))
        return copy.deepcopy(stored)

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check(namespace)
        return copy.deepcopy(self.service_accounts.get((namespace, name)))

    def patch_service_account(
        self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = True
    ) -> dict[str, Any]:
        self._check(namespace)
        self._hook(namespace, name)
        current = self.service_accounts[(namespace, name)]
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise ClusterConflictError("the object has been modified", status=409, reason="Conflict")
        # imagePullSecrets has no merge key: both patch types replace the list, as on a real server.
        updated = copy.deepcopy(current)
        for key, value in patch.items():
            if key != "metadata":
                updated[key] = copy.deepcopy(value)
        updated["metadata"]["resourceVersion"] = self._next_rv()
        self.service_accounts[(namespace, name)] = updated
        self.writes.append(("patch", namespace, name))
        return copy.deepcopy(updated)


def recorded_reads(cluster: FakeCluster, method: str = "get_node") -> list[str]:
    """The names `cluster.<method>` (`get_node`, `get_node_metadata`) is asked for from now on, in order."""
    reads: list[str] = []
    get = getattr(cluster, method)

    def reading(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return get(name)  # type: ignore[no-any-return]

    setattr(cluster, method, reading)
    return reads
