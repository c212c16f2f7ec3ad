"""The clusters a stack serves, as the `ClusterDirectory` port: its own (from the function's settings) and
each cluster registered in the table (`prewarm cluster add`).

A registered cluster's endpoint and CA are read from the table on each call, so a cluster added again is
reached at its new endpoint; the client for an endpoint is kept for the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prewarm.domain.clusters import DEFAULT_CLUSTER, RegisteredCluster
from prewarm.services.ports import ClusterApi, ClusterConfigError, ClusterItems

# Clients kept for the process, one per registered endpoint (a cluster added again gets a new one).
CLIENTS_KEPT = 64


class ServedClusters:
    """`ClusterRoster` over the table's cluster items: which clusters are served, never their APIs."""

    def __init__(self, store: ClusterItems, own_name: str) -> None:
        self._store = store
        self._own_name = own_name

    @property
    def own_name(self) -> str:
        return self._own_name

    def served(self) -> list[RegisteredCluster]:
        stored = {c.name: c for c in self._store.list_clusters()}
        own = stored.get(self._own_name)
        return [RegisteredCluster(DEFAULT_CLUSTER, labels=own.labels if own else {}),
                *(c for name, c in stored.items() if name != self._own_name)]

    def serves(self, name: str) -> bool:
        return name == DEFAULT_CLUSTER or self._store.get_cluster(name) is not None


class StackClusters(ServedClusters):
    """`ClusterDirectory` over the table's cluster items.

    `own_api` builds the stack's own cluster's API (raising `ClusterConfigError` when none is configured);
    `registered_api` builds a registered cluster's. Both are called once per endpoint, not per use."""

    def __init__(self, store: ClusterItems, own_name: str, *, own_api: Callable[[], ClusterApi],
                 registered_api: Callable[[RegisteredCluster], ClusterApi]) -> None:
        super().__init__(store, own_name)
        self._own_api = own_api
        self._registered_api = registered_api
        self._own: ClusterApi | None = None
        self._clients: dict[tuple[str, str, str], ClusterApi] = {}
        self._lock = threading.Lock()

    def api(self, name: str = DEFAULT_CLUSTER) -> ClusterApi:
        if name == DEFAULT_CLUSTER:
            return self._own_cluster()
        registered = self._store.get_cluster(name)
        if registered is None:
            raise ClusterConfigError(
                f"cluster {name!r} is not registered with this stack: `prewarm cluster add {name}`")
        key = (registered.name, registered.endpoint, registered.ca_data)
        with self._lock:
            client = self._clients.get(key)
        if client is None:
            client = self._registered_api(registered)
            with self._lock:
                if len(self._clients) >= CLIENTS_KEPT:
                    self._clients.pop(next(iter(self._clients)))
                client = self._clients.setdefault(key, client)
        return client

    def _own_cluster(self) -> ClusterApi:
        # Not kept when it fails: a setting fixed meanwhile applies on the next call.
        if self._own is None:
            own = self._own_api()
            with self._lock:
                if self._own is None:
                    self._own = own
        return self._own
