"""A cluster's fault stays in that cluster: a status batch with a hello whose cluster cannot be read still
applies everything else, the node is registered from its agent's own facts (unverified), and the sweep's
pass over that cluster checks it again once the cluster answers."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.messages import Hello, StatusReport
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.schedules import SweepSettings, sweep
from prewarm.services.status_batches import record_status
from tests.support.cluster import FakeCluster, make_node, make_pod
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

PROD = RegisteredCluster("prod-eu", endpoint="https://prod.example")
NEVER = {"type": "Never"}
DOWN = ClusterUnavailableError("cluster prod-eu cannot be reached: connection refused (https://prod.example)")


class Down(FakeCluster):
    """A cluster whose API does not answer: every read of a node or a pod fails."""

    def get_node(self, name: str) -> dict[str, Any] | None:
        raise DOWN

    def list_pods(self, namespace: str | None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        raise DOWN


class PodsDown(FakeCluster):
    """A cluster that answers for nodes but not for pods (a 429 on one list)."""

    def list_pods(self, namespace: str | None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[dict[str, Any]]:
        raise DOWN


@pytest.fixture
def prod(plane: ControlPlane) -> FakeCluster:
    """`prod-eu`, registered, with one node `p-1` and a running `Never` job selecting pool=gpu."""
    plane.store.put_cluster(PROD)
    cluster = FakeCluster(nodes=[make_node("p-1", pool="gpu")])
    apply_manifest(plane.store, job_doc("keep", selector={"matchLabels": {"pool": "gpu"}}, completionPolicy=NEVER,
                                        parallelism=10), now=plane.now(), cluster="prod-eu")
    plan_job(plane.store, cluster, plane.queues, "prod-eu:default/keep", now=plane.now())
    return cluster


def own_node_pulled(plane: ControlPlane) -> StatusReport:
    """The final report of `own-1`, a node of the stack's own cluster pulling a job's image."""
    plane.cluster.nodes.append(make_node("own-1", pool="gpu"))
    apply_manifest(plane.store, job_doc("warm", selector={"matchLabels": {"pool": "gpu"}}), now=plane.now())
    plan_job(plane.store, plane.cluster, plane.queues, "default/warm", now=plane.now())
    record = plane.store.get_job("default/warm")
    assert record is not None
    return StatusReport(job=record.key, job_uid=record.uid, round=record.round, node="own-1", phase="Succeeded",
                        attempt=1, seq=2)


def test_a_hello_whose_cluster_cannot_be_read_is_registered_unverified_and_fails_nothing_else(
    plane: ControlPlane, prod: FakeCluster
) -> None:
    # Given a job of the stack's own cluster with a node pulling, and prod-eu's API down
    pulled = own_node_pulled(plane)
    clusters = clusters_of(plane.store, plane.cluster, {"prod-eu": Down()})
    # When one batch holds a hello of each cluster and the own node's final report
    outcome = record_status(plane.store, plane.queues, clusters, [
        ("h-prod", Hello(node="p-2", cluster="prod-eu", labels={"pool": "gpu"})),
        ("h-own", Hello(node="own-2", labels={"pool": "gpu"})),
        ("r-own", pulled)], now=plane.now())
    # Then nothing goes back: the own cluster's report and hello count, and prod-eu's node is registered from
    # its agent's labels, marked unverified, and joined to the job those labels select
    assert outcome.retry_ids == []
    assert [(r.node, o.applied) for r, o in outcome.reports] == [("own-1", True)]
    assert {h.node: h.added_to for h in outcome.hellos} == {"p-2": ["prod-eu:default/keep"], "own-2": []}
    node = plane.store.get_node("p-2", "prod-eu")
    assert node is not None and node.unverified and node.labels == {"pool": "gpu"}
    own = plane.store.get_node("own-2")
    assert own is not None and not own.unverified
    # and how prod-eu failed is on its item, for `prewarm cluster list`
    item = plane.store.get_cluster("prod-eu")
    assert item is not None and item.reachable is False and item.reason == str(DOWN)
    assert view_job(plane.store, "default", "warm", now=plane.now()).succeeded == 1


def test_a_node_whose_pods_cannot_be_read_joins_its_other_jobs_and_the_sweep_joins_the_rest_once_they_can(
    plane: ControlPlane, prod: FakeCluster
) -> None:
    # Given a second running Never job of prod-eu that selects the nodes running a pod app=web
    apply_manifest(plane.store, job_doc("web", podSelector={"matchLabels": {"app": "web"}}, completionPolicy=NEVER,
                                        parallelism=10), now=plane.now(), cluster="prod-eu")
    plan_job(plane.store, prod, plane.queues, "prod-eu:default/web", now=plane.now())
    prod.nodes.append(make_node("p-2", pool="gpu"))
    prod.pods.append(make_pod("web-1", "default", "p-2", app="web"))
    # When p-2 says hello while prod-eu answers for nodes but not for pods
    flaky = PodsDown(nodes=prod.nodes, pods=prod.pods)
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": flaky}),
                            [("h", Hello(node="p-2", cluster="prod-eu", labels={"pool": "gpu"}))], now=plane.now())
    # Then it joins the job its labels select, is left out of the pod-selected one for now, and is unverified
    assert outcome.retry_ids == []
    assert outcome.hellos[0].added_to == ["prod-eu:default/keep"]
    node = plane.store.get_node("p-2", "prod-eu")
    assert node is not None and node.unverified
    # and a sweep while prod-eu is still down checks nothing
    config = SweepSettings(prefix=plane.queues.prefix)
    down = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down(nodes=prod.nodes)}),
                 now=plane.now(), config=config)
    assert down.nodes_verified == [] and "prod-eu" in down.unreachable
    # When the sweep passes over prod-eu once it answers
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=plane.now(),
                   config=config)
    # Then p-2 joins the pod-selected job too and is verified
    assert result.nodes_verified == ["prod-eu:p-2"]
    web = view_job(plane.store, "default", "web", now=plane.now(), cluster="prod-eu", with_tasks=True)
    assert "p-2" in {t.node for t in web.tasks}
    node = plane.store.get_node("p-2", "prod-eu")
    assert node is not None and not node.unverified


def test_a_sweep_reads_a_cluster_s_registrations_once_and_verifies_the_unverified_among_them(
    plane: ControlPlane, prod: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given p-2 registered unverified while prod-eu could not be read
    prod.nodes.append(make_node("p-2", pool="gpu"))
    record_status(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down(nodes=prod.nodes)}),
                  [("h", Hello(node="p-2", cluster="prod-eu", labels={"pool": "gpu"}))], now=plane.now())
    reads: list[str] = []
    list_nodes = plane.store.list_nodes

    def counted(cluster: str = "") -> Any:
        reads.append(cluster)
        return list_nodes(cluster)

    monkeypatch.setattr(plane.store, "list_nodes", counted)
    # When the sweep passes over prod-eu once it answers
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=plane.now(),
                   config=SweepSettings(prefix=plane.queues.prefix))
    # Then p-2 is verified, from the one read of prod-eu's registrations that the departures use too
    assert result.nodes_verified == ["prod-eu:p-2"]
    assert reads.count("prod-eu") == 1
    node = plane.store.get_node("p-2", "prod-eu")
    assert node is not None and not node.unverified


def test_a_refused_health_write_sends_no_hello_back(plane: ControlPlane, prod: FakeCluster, monkeypatch: Any) -> None:
    from prewarm.services.ports import StoreRetryableError

    def throttled(*args: Any, **kwargs: Any) -> None:
        raise StoreRetryableError("record cluster check: ThrottlingException")

    monkeypatch.setattr(plane.store, "record_cluster_check", throttled)
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down()}),
                            [("h", Hello(node="p-2", cluster="prod-eu", labels={"pool": "gpu"}))], now=plane.now())
    assert outcome.retry_ids == [] and outcome.hellos[0].unverified == str(DOWN)


class Hung(FakeCluster):
    """A cluster whose API takes the call and does not answer until `answer` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.called, self.answer = threading.Event(), threading.Event()

    def get_node(self, name: str) -> dict[str, Any] | None:
        self.called.set()
        self.answer.wait(10)
        raise DOWN


def test_a_hello_waiting_on_a_hung_cluster_holds_up_none_of_the_batchs_reports(
    plane: ControlPlane, prod: FakeCluster
) -> None:
    # Given a node of the stack's own cluster pulling, and prod-eu's API taking calls without answering
    pulled = own_node_pulled(plane)
    hung = Hung()
    clusters = clusters_of(plane.store, plane.cluster, {"prod-eu": hung})
    # When one batch holds prod-eu's hello and the own node's final report
    batch = threading.Thread(target=record_status, args=(plane.store, plane.queues, clusters, [
        ("h-prod", Hello(node="p-2", cluster="prod-eu", labels={"pool": "gpu"})), ("r-own", pulled)]),
        kwargs={"now": plane.now()})
    batch.start()
    try:
        # Then the report is applied while the hello still waits on prod-eu
        assert hung.called.wait(5)
        view = view_job(plane.store, "default", "warm", now=plane.now())
        deadline = time.monotonic() + 5
        while view.succeeded != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
            view = view_job(plane.store, "default", "warm", now=plane.now())
        assert view.succeeded == 1 and batch.is_alive()
    finally:
        hung.answer.set()
        batch.join(10)
