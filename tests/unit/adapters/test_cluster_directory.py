"""The clusters a stack serves (`adapters/clusters.py`): its own first, then those registered in its
table, each one's API built once per endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.adapters.clusters import StackClusters
from prewarm.domain.clusters import RegisteredCluster
from prewarm.services.ports import ClusterConfigError


class Registered:
    """The table's cluster items."""

    def __init__(self, *clusters: RegisteredCluster) -> None:
        self.clusters = {c.name: c for c in clusters}

    def list_clusters(self) -> list[RegisteredCluster]:
        return list(self.clusters.values())

    def get_cluster(self, name: str) -> RegisteredCluster | None:
        return self.clusters.get(name)


def directory(table: Registered, own_name: str = "home") -> tuple[StackClusters, list[Any]]:
    built: list[Any] = []

    def own() -> Any:
        built.append("own")
        return "own-api"

    def registered(cluster: RegisteredCluster) -> Any:
        built.append((cluster.name, cluster.endpoint))
        return f"api of {cluster.name} at {cluster.endpoint}"

    return StackClusters(table, own_name, own_api=own, registered_api=registered), built  # type: ignore[arg-type]


def test_the_own_cluster_comes_first_with_its_registered_labels_then_the_registered_ones() -> None:
    table = Registered(RegisteredCluster("home", labels={"env": "prod"}), RegisteredCluster("prod-eu"))
    clusters, _ = directory(table)
    served = clusters.served()
    assert [(c.name, dict(c.labels)) for c in served] == [("", {"env": "prod"}), ("prod-eu", {})]
    assert clusters.own_name == "home"
    assert clusters.serves("") and clusters.serves("prod-eu") and not clusters.serves("gone")
    assert [c.name for c in directory(Registered())[0].served()] == [""]


def test_each_api_is_built_once_per_endpoint_and_a_cluster_added_again_is_reached_at_its_new_one() -> None:
    table = Registered(RegisteredCluster("prod-eu", endpoint="https://a.example"))
    clusters, built = directory(table)
    assert clusters.api() == clusters.api("") == "own-api"
    assert clusters.api("prod-eu") == clusters.api("prod-eu") == "api of prod-eu at https://a.example"
    table.clusters["prod-eu"] = RegisteredCluster("prod-eu", endpoint="https://b.example")
    assert clusters.api("prod-eu") == "api of prod-eu at https://b.example"
    assert built == ["own", ("prod-eu", "https://a.example"), ("prod-eu", "https://b.example")]


def test_a_cluster_not_registered_cannot_be_reached_and_says_how_to_register_it() -> None:
    clusters, _ = directory(Registered())
    with pytest.raises(ClusterConfigError, match="not registered with this stack: `prewarm cluster add gone`"):
        clusters.api("gone")


def test_an_own_cluster_that_cannot_be_built_is_tried_again_on_the_next_call() -> None:
    attempts: list[int] = []

    def own() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise ClusterConfigError("no Kubernetes API configured")
        return "own-api"

    clusters = StackClusters(Registered(), "", own_api=own, registered_api=lambda c: c)  # type: ignore[arg-type, return-value]
    with pytest.raises(ClusterConfigError):
        clusters.api()
    assert clusters.api() == "own-api" and clusters.api() == "own-api" and len(attempts) == 2


def test_the_secret_mirror_is_built_on_its_first_use_once() -> None:
    from prewarm.adapters.deferred import DeferredSecretMirror

    built: list[str] = []

    class Mirror:
        def mirror(self, namespace: str, names: list[str], cluster: str = "") -> list[str]:
            return [f"{cluster}:{namespace}/{n}" for n in names]

        def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]:
            return sorted(f"{ns}/{n}" for ns, n in referenced)

    def build() -> Mirror:
        built.append("mirror")
        return Mirror()

    deferred = DeferredSecretMirror(build)
    assert built == []
    assert deferred.mirror("ml", ["a"], "prod-eu") == ["prod-eu:ml/a"]
    assert deferred.cleanup({("ml", "b")}) == ["ml/b"] and built == ["mirror"]
