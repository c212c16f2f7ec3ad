"""The table stream's use cases (`services/stream.py`): a plan and a deletion each tell the warming nodes
of their job's cluster; a cluster that cannot be read holds no stream record up: its job is parked at once, and
the sweep asks for its plan as soon as the cluster answers, whatever the job's age."""

from __future__ import annotations

import threading
from typing import Any

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import job_key
from prewarm.domain.messages import Hello, RequiredImages
from prewarm.services.jobs import apply_manifest, request_deletion, view_job
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.reports import register_node
from prewarm.services.schedules import SweepSettings, sweep
from prewarm.services.stream import delete, each_item_in_order, plan
from tests.support.cluster import FakeCluster, make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, take_node_messages
from tests.support.manifests import job_doc


def test_a_never_jobs_plan_sends_its_clusters_warming_nodes_their_lists(plane: ControlPlane) -> None:
    # Given a node of the stack's own cluster holding the startup taint, its agent said hello
    plane.cluster.nodes.append(make_node("ip-10-0-1-1"))
    url = plane.queues.ensure_queue("ip-10-0-1-1")
    register_node(plane.store, plane.queues, plane.cluster, Hello(node="ip-10-0-1-1", warm_until=plane.now() + 600),
                  now=plane.now())
    take_node_messages(plane.sqs, url)
    apply_manifest(plane.store, job_doc("keep", completionPolicy={"type": "Never"}), now=plane.now())
    # When the stream plans the job
    result = plan(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), job_key("default", "keep"),
                  now=plane.now())
    # Then the node is sent its task and its list of required images, which now names the job
    assert result.sent == 1
    lists = [m for m in take_node_messages(plane.sqs, url) if isinstance(m, RequiredImages)]
    assert lists and [image.job for image in lists[-1].images] == ["default/keep"]


def test_a_registered_cluster_that_cannot_be_reached_leaves_the_job_waiting_and_says_why(plane: ControlPlane) -> None:
    plane.store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    apply_manifest(plane.store, job_doc("warm"), now=plane.now(), cluster="prod-eu")
    # When the stream plans it and prod-eu's API cannot even be built
    key = job_key("default", "warm", "prod-eu")
    result = plan(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), key, now=plane.now())
    # Then the record does not fail: the job is parked, and its message says why
    assert result.action == "parked: cluster prod-eu has no API in this test"
    view = view_job(plane.store, "default", "warm", now=plane.now(), cluster="prod-eu")
    assert view.message.endswith("; cluster prod-eu has no API in this test; planned as soon as it answers")
    assert view.record.is_parked


class Down(FakeCluster):
    """A cluster whose API refuses connections, as the bounded client says it."""

    def list_nodes(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        raise ClusterUnavailableError("cluster prod-eu cannot be reached: connection refused (GET https://prod.example"
                                      "/api/v1/nodes)")


def test_the_stacks_own_cluster_failing_parks_its_job_too_holding_up_no_later_record(plane: ControlPlane) -> None:
    class Refusing(FakeCluster):
        def list_nodes(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            raise ClusterUnavailableError("GET /api/v1/nodes: 503 ServiceUnavailable: etcd leader changed")

    apply_manifest(plane.store, job_doc("warm"), now=plane.now())
    result = plan(plane.store, plane.queues, clusters_of(plane.store, Refusing(), own_name="home"),
                  job_key("default", "warm"), now=plane.now())
    assert result.action == "parked: cluster home cannot be read: GET /api/v1/nodes: 503 ServiceUnavailable: etcd " \
                            "leader changed"
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert view.record.is_parked and "\n" not in view.message


def test_a_parked_job_is_planned_again_as_soon_as_its_cluster_answers_whatever_its_age(plane: ControlPlane) -> None:
    # Given a job of prod-eu applied a moment ago, parked because prod-eu cannot be reached
    plane.store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    prod = FakeCluster(nodes=[make_node("p-1")])
    apply_manifest(plane.store, job_doc("warm"), now=plane.now(), cluster="prod-eu")
    key = job_key("default", "warm", "prod-eu")
    plan(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down()}), key, now=plane.now())
    view = view_job(plane.store, "default", "warm", now=plane.now(), cluster="prod-eu")
    # Then its message says so in one line, naming the cluster and what failed, without repeating it
    assert view.message.endswith("; cluster prod-eu cannot be reached: connection refused (GET https://prod.example"
                                 "/api/v1/nodes); planned as soon as it answers")
    assert view.message.count("prod-eu") == 1
    config = SweepSettings(prefix=plane.queues.prefix)
    # When the sweep runs while prod-eu is still down, nothing is asked
    down = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down()}), now=plane.now(),
                 config=config)
    assert down.replanned == []
    # and when it runs once prod-eu answers, seconds after the job was applied, its plan is asked for
    up = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=plane.now(),
               config=config)
    assert up.replanned == [key]
    result = plan(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), key, now=plane.now())
    assert result.selected == 1
    planned = plane.store.get_job(key)
    assert planned is not None and planned.is_planned and not planned.is_parked
    assert "planned as soon as" not in view_job(plane.store, "default", "warm", now=plane.now(),
                                                cluster="prod-eu").message


def test_a_deletion_cancels_the_pulls_removes_the_job_and_tells_warming_nodes(plane: ControlPlane) -> None:
    plane.cluster.nodes.append(make_node("ip-10-0-1-1"))
    url = plane.queues.ensure_queue("ip-10-0-1-1")
    register_node(plane.store, plane.queues, plane.cluster, Hello(node="ip-10-0-1-1", warm_until=plane.now() + 600),
                  now=plane.now())
    apply_manifest(plane.store, job_doc("keep", completionPolicy={"type": "Never"}), now=plane.now())
    clusters = clusters_of(plane.store, plane.cluster)
    plan(plane.store, plane.queues, clusters, job_key("default", "keep"), now=plane.now())
    take_node_messages(plane.sqs, url)
    request_deletion(plane.store, "default", "keep", now=plane.now())
    # When the stream completes the deletion
    cancels = delete(plane.store, plane.queues, clusters, job_key("default", "keep"), now=plane.now())
    # Then the pull is cancelled, the job is gone, and the node no longer waits for its image
    assert cancels == 1 and plane.store.get_job("default/keep") is None
    lists = [m for m in take_node_messages(plane.sqs, url) if isinstance(m, RequiredImages)]
    assert lists and lists[-1].images == []


def test_a_batch_runs_each_items_records_in_order_and_the_items_side_by_side() -> None:
    # Given a batch whose first record waits (a plan on a hung cluster) until a later item's record ran
    later_ran = threading.Event()
    seen: list[str] = []

    def handle(record: tuple[str, str]) -> None:
        if record == ("hung", "1"):
            assert later_ran.wait(5), "the other item's record waited for the hung one"
        if record[0] == "healthy":
            later_ran.set()
        seen.append("/".join(record))

    batch = [("hung", "1"), ("healthy", "1"), ("hung", "2"), ("healthy", "2")]
    # When it is handled
    failed = each_item_in_order(batch, lambda r: r[0], handle)
    # Then nothing failed, the healthy item was not held up, and each item's records ran in order
    assert failed is None
    assert seen.index("healthy/1") < seen.index("hung/1")
    assert [s for s in seen if s.startswith("hung")] == ["hung/1", "hung/2"]
    assert [s for s in seen if s.startswith("healthy")] == ["healthy/1", "healthy/2"]


def test_an_items_records_stop_at_its_failure_and_the_earliest_failure_is_where_the_stream_retries() -> None:
    seen: list[str] = []

    def handle(record: tuple[str, str]) -> None:
        if record in {("b", "1"), ("a", "2")}:
            raise RuntimeError("send refused")
        seen.append("/".join(record))

    batch = [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2"), ("c", "1")]
    assert each_item_in_order(batch, lambda r: r[0], handle) == ("b", "1")
    # b's later record waits for b's retry; other items' records ran
    assert sorted(seen) == ["a/1", "c/1"]
