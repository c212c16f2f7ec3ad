"""The clusters a test's stack serves, as the services see them: the real directory
(`prewarm.adapters.clusters.StackClusters`) over the test's store, with the APIs the test gives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prewarm.adapters.clusters import StackClusters
from prewarm.domain.clusters import RegisteredCluster
from prewarm.services.ports import ClusterConfigError, ClusterItems


class _NoneRegistered:
    """A store that holds no registered cluster."""

    def list_clusters(self) -> list[RegisteredCluster]:
        return []

    def get_cluster(self, name: str) -> RegisteredCluster | None:
        return None


def clusters_of(store: ClusterItems | None, own: Any = None, registered: Mapping[str, Any] | None = None, *,
                own_name: str = "") -> StackClusters:
    """The stack's own cluster's API `own` (None: no Kubernetes access configured) and, of the clusters
    registered in `store` (None: none is), the API of each named in `registered` (one not named cannot be
    reached). An exception given for an API is raised when that API is asked for."""
    apis = dict(registered or {})

    def built(api: Any, missing: str) -> Any:
        if api is None:
            raise ClusterConfigError(missing)
        if isinstance(api, Exception):
            raise api
        return api

    def registered_api(cluster: RegisteredCluster) -> Any:
        return built(apis.get(cluster.name), f"cluster {cluster.name} has no API in this test")

    listed: ClusterItems = store if store is not None else _NoneRegistered()  # type: ignore[assignment]
    return StackClusters(listed, own_name, own_api=lambda: built(own, "no Kubernetes API configured"),
                         registered_api=registered_api)
