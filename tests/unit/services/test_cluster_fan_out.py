"""Work on every cluster a stack serves (`services/clusters.py`): side by side, each failure its own, and
how each cluster answered recorded on its item."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.services.clusters import on_each_cluster, raise_if_own_unreachable, record_health, unreachable
from prewarm.services.ports import ClusterConfigError, ClusterUnavailableError
from tests.support.cluster_directory import clusters_of


class Table:
    """Registered clusters and the health checks recorded on them."""

    def __init__(self, *names: str) -> None:
        self.clusters = {n: RegisteredCluster(n) for n in names}
        self.checks: list[tuple[str, dict[str, Any]]] = []

    def list_clusters(self) -> list[RegisteredCluster]:
        return list(self.clusters.values())

    def get_cluster(self, name: str) -> RegisteredCluster | None:
        return self.clusters.get(name)

    def record_cluster_check(self, name: str, **fields: Any) -> None:
        self.checks.append((name, fields))


def test_each_cluster_runs_its_work_and_a_failing_one_is_named_with_why() -> None:
    table = Table("prod-eu", "staging", "gone")
    down = ClusterUnavailableError("connection refused")
    clusters = clusters_of(table, "own", {"prod-eu": "prod", "staging": down})  # type: ignore[arg-type]
    runs = on_each_cluster(clusters, lambda name, api: f"{name or 'own'} via {api}", clock=lambda: 5.0)
    assert [(r.name, r.outcome, r.error) for r in runs] == [
        ("", "own via own", None), ("prod-eu", "prod-eu via prod", None), ("staging", None, "connection refused"),
        ("gone", None, "cluster gone has no API in this test")]
    assert unreachable(runs) == {"staging": "connection refused", "gone": "cluster gone has no API in this test"}


def test_a_failure_inside_the_work_is_the_clusters_own() -> None:
    def work(name: str, api: Any) -> str:
        if name == "prod-eu":
            raise ClusterUnavailableError("timed out")
        return "done"

    clusters = clusters_of(Table("prod-eu"), "own", {"prod-eu": "prod"})  # type: ignore[arg-type]
    assert unreachable(on_each_cluster(clusters, work, clock=lambda: 0.0)) == {"prod-eu": "timed out"}


def test_an_own_cluster_without_kubernetes_access_is_left_out_only_when_optional() -> None:
    clusters = clusters_of(Table(), None)  # type: ignore[arg-type]
    assert on_each_cluster(clusters, lambda name, api: api, clock=lambda: 0.0, own_optional=True) == []
    (run,) = on_each_cluster(clusters, lambda name, api: api, clock=lambda: 0.0)
    assert run.error == "no Kubernetes API configured"
    with pytest.raises(ClusterUnavailableError, match="own cluster '' was not synced: no Kubernetes API"):
        raise_if_own_unreachable(unreachable([run]), clusters, "synced")


def test_health_is_recorded_on_each_clusters_item_the_own_under_its_name_only_when_it_has_one() -> None:
    table = Table("prod-eu")
    clusters = clusters_of(table, ClusterConfigError("no API"), {"prod-eu": "prod"},  # type: ignore[arg-type]
                           own_name="home")
    runs = on_each_cluster(clusters, lambda name, api: api, clock=lambda: 7.0)
    record_health(table, clusters, runs, agents={"prod-eu": 3}, synced=True)  # type: ignore[arg-type]
    assert table.checks == [
        ("home", {"reachable": False, "reason": "no API", "checked_at": 7.0, "agents": None, "synced": False,
                  "own": True}),
        ("prod-eu", {"reachable": True, "reason": "", "checked_at": 7.0, "agents": 3, "synced": True, "own": False})]
    unnamed = Table()
    record_health(unnamed, clusters_of(unnamed, "own"), runs[:1])  # type: ignore[arg-type]
    assert unnamed.checks == []
    with pytest.raises(ClusterUnavailableError, match="the stack's own cluster 'home' was not swept: no API"):
        raise_if_own_unreachable(unreachable(runs), clusters, "swept")
    raise_if_own_unreachable({"prod-eu": "down"}, clusters, "swept")  # another cluster's failure: no raise


def test_a_hung_cluster_counts_as_unreachable_at_its_deadline_and_the_others_go_on() -> None:
    # Given five clusters whose APIs hang (more than the four worked on at once before) and one that answers
    hung = [f"hung-{i}" for i in range(5)]
    table = Table(*hung, "prod-eu")
    release = threading.Event()

    def work(name: str, api: Any) -> str:
        if name.startswith("hung"):
            release.wait(30)
        return f"{name or 'own'} done"

    clusters = clusters_of(table, "own", dict.fromkeys([*hung, "prod-eu"], "api"))  # type: ignore[arg-type]
    try:
        # When the work runs on every cluster with a deadline of 0.3 s
        began = time.monotonic()
        runs = on_each_cluster(clusters, work, clock=lambda: 9.0, deadline=0.3)
        took = time.monotonic() - began
    finally:
        release.set()
    # Then the call returns at the deadline, not when the hung clusters answer, the answering clusters' work
    # stands, and each hung one is unreachable for having not answered in time
    assert took < 3.0
    assert [(r.name, r.outcome) for r in runs if r.answered] == [("", "own done"), ("prod-eu", "prod-eu done")]
    assert unreachable(runs) == dict.fromkeys(hung, "did not answer within 0.3 s")
    assert [r.name for r in runs] == ["", *hung, "prod-eu"]


def test_an_error_that_is_not_the_clusters_is_raised_to_the_caller() -> None:
    def work(name: str, api: Any) -> str:
        raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):
        on_each_cluster(clusters_of(Table(), "own"), work, clock=lambda: 0.0)  # type: ignore[arg-type]
