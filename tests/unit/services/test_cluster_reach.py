"""`prewarm cluster add`'s check, as the resource sync function runs it: a cluster's `/version` through the
stack's own clients, the version it reported or why it could not be reached, in one line."""

from __future__ import annotations

from prewarm.domain.clusters import ClusterReach, RegisteredCluster
from prewarm.services.clusters import reach_cluster
from prewarm.services.ports import ClusterAuthError, ClusterUnavailableError
from tests.support.cluster import FakeCluster
from tests.support.cluster_directory import clusters_of
from tests.support.memory_store import MemoryJobStore


def test_a_registered_cluster_answers_its_version() -> None:
    store = MemoryJobStore()
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    old = FakeCluster(version={"major": "1", "minor": "29+", "gitVersion": "v1.29.8-eks-a737599"})

    reach = reach_cluster(clusters_of(store, FakeCluster(), {"prod-eu": old}), "prod-eu")

    assert reach == ClusterReach("prod-eu", version="v1.29.8-eks-a737599")


def test_the_stacks_own_cluster_is_reached_by_its_cluster_name() -> None:
    own = FakeCluster()
    assert reach_cluster(clusters_of(None, own, own_name="home"), "home") == ClusterReach(
        "home", version="v1.33.5-eks-3025e55")


def test_a_cluster_that_cannot_be_reached_or_is_not_registered_says_why_in_one_line() -> None:
    store = MemoryJobStore()
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    down = ClusterUnavailableError("cluster prod-eu cannot be reached: connection timed out\n(GET /version)")
    clusters = clusters_of(store, FakeCluster(), {"prod-eu": down})

    assert reach_cluster(clusters, "prod-eu") == ClusterReach(
        "prod-eu", error="cluster prod-eu cannot be reached: connection timed out (GET /version)")
    assert reach_cluster(clusters, "staging").error == (
        "cluster 'staging' is not registered with this stack: `prewarm cluster add staging`")


def test_a_token_the_cluster_did_not_accept_is_told_from_other_failures() -> None:
    store = MemoryJobStore()
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    refused = ClusterAuthError("GET /version: 401 Unauthorized: Unauthorized", status=401)
    forbidden = ClusterAuthError("GET /version: 403 Forbidden", status=403)
    assert reach_cluster(clusters_of(store, None, {"prod-eu": refused}), "prod-eu").unauthorized
    assert not reach_cluster(clusters_of(store, None, {"prod-eu": forbidden}), "prod-eu").unauthorized
