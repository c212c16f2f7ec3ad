"""One stack, several clusters: node names repeat across clusters, and nothing of one cluster's jobs, nodes
or queues is touched by another's traffic. The stack's own cluster keeps its one-cluster names."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import job_key
from prewarm.domain.messages import Hello, PullTask, RequiredImages, StatusReport, Warmed
from prewarm.domain.push import ImagePush
from prewarm.domain.warming import SettledNodes
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.push import handle_push
from prewarm.services.reports import record_report
from prewarm.services.resources import RULES_FROM_OWN_CLUSTER, sync_clusters, sync_resources
from prewarm.services.schedules import SweepSettings, sweep
from prewarm.services.status_batches import record_status
from prewarm.services.stream import plan
from tests.support.cluster import FakeCluster, make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, take_node_messages
from tests.support.manifests import job_doc
from tests.support.memory_queues import MemoryTaskQueues

NODES = ("ip-10-0-1-1", "ip-10-0-1-2")
PUSH = ImagePush(account="123456789012", region="us-west-2", repository="ml/model", digest="sha256:" + "a" * 64,
                 tag="v1")
PROD = RegisteredCluster("prod-eu", endpoint="https://prod.example", labels={"env": "prod"})


def rule(name: str = "models", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": name},
            "spec": {"repositories": ["ml/*"],
                     "template": {"metadata": {"namespace": "ml"}, "spec": {"parallelism": 10}}, **spec}}


def queues_of(plane: ControlPlane, cluster: str) -> MemoryTaskQueues:
    """The node queues as an agent of `cluster` makes them (the control plane finds them per message)."""
    assert isinstance(plane.queues, MemoryTaskQueues)
    return plane.queues.for_cluster(cluster)


def agents_start(plane: ControlPlane, cluster: str) -> dict[str, str]:
    mine = queues_of(plane, cluster)
    return {node: mine.ensure_queue(node) for node in NODES}


def report(plane: ControlPlane, key: str, node: str, phase: str) -> None:
    record = plane.store.get_job(key)
    assert record is not None
    record_report(plane.store, plane.queues, StatusReport(job=key, job_uid=record.uid, round=record.round, node=node,
                                                          phase=phase, attempt=1, seq=2 if phase != "Pulling" else 1),
                  now=plane.now())


@pytest.fixture
def two(plane: ControlPlane) -> tuple[ControlPlane, FakeCluster]:
    """The stack's own cluster and `prod-eu`, with the same two node names; every node runs an agent."""
    prod = FakeCluster(nodes=[make_node(n, pool="gpu") for n in NODES])
    plane.cluster.nodes += [make_node(n, pool="gpu") for n in NODES]
    plane.store.put_cluster(PROD)
    return plane, prod


def test_a_push_makes_one_job_per_cluster_each_counting_only_its_own_nodes(two: tuple[ControlPlane, FakeCluster]
                                                                          ) -> None:
    plane, prod = two
    apply_manifest(plane.store, rule(), now=plane.now())
    own_queues, prod_queues = agents_start(plane, ""), agents_start(plane, "prod-eu")
    # When one push comes for a rule that names no cluster
    applied = handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store, own_name="home"))
    assert sorted(a.cluster for a in applied) == ["", "prod-eu"]
    own_key = next(r.key for r in plane.store.list_jobs() if not r.cluster)
    prod_key = next(r.key for r in plane.store.list_jobs() if r.cluster == "prod-eu")
    assert prod_key == f"prod-eu:{own_key}"
    # Then each job is planned over its own cluster's nodes, its tasks in that cluster's queues only
    plan_job(plane.store, plane.cluster, plane.queues, own_key, now=plane.now())
    plan_job(plane.store, prod, plane.queues, prod_key, now=plane.now())
    for node in NODES:
        own_tasks = take_node_messages(plane.sqs, own_queues[node])
        prod_tasks = take_node_messages(plane.sqs, prod_queues[node])
        assert [t.job for t in own_tasks if isinstance(t, PullTask)] == [own_key]
        assert [t.job for t in prod_tasks if isinstance(t, PullTask)] == [prod_key]
    assert own_queues[NODES[0]] != prod_queues[NODES[0]]
    # and a node of prod-eu finishing counts in prod-eu's job only
    for node in NODES:
        report(plane, prod_key, node, "Succeeded")
    prod_view = view_job(plane.store, "ml", prod_key.split("/")[1], now=plane.now(), cluster="prod-eu")
    own_view = view_job(plane.store, "ml", own_key.split("/")[1], now=plane.now())
    assert (prod_view.succeeded, prod_view.completion_time is not None) == (2, True)
    assert (own_view.succeeded, own_view.active, own_view.completion_time) == (0, 2, None)


def test_a_rule_selecting_clusters_by_label_warms_those_only(two: tuple[ControlPlane, FakeCluster]) -> None:
    plane, _ = two
    apply_manifest(plane.store, rule(clusters={"matchLabels": {"env": "prod"}}), now=plane.now())
    applied = handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store, own_name="home"))
    assert [a.cluster for a in applied] == ["prod-eu"]
    # and by name, the stack's own cluster answering to its ClusterName
    apply_manifest(plane.store, rule("by-name", clusters={"names": ["home"]}), now=plane.now())
    applied = handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store, own_name="home"))
    assert sorted((a.name.split("-")[0], a.cluster) for a in applied if a.outcome == "created") == [("by", "")]


def test_a_hello_registers_its_node_in_its_cluster_and_joins_that_clusters_never_jobs(
    two: tuple[ControlPlane, FakeCluster]
) -> None:
    plane, prod = two
    never = job_doc("keep", completionPolicy={"type": "Never"}, parallelism=10)
    apply_manifest(plane.store, never, now=plane.now())
    apply_manifest(plane.store, never, now=plane.now(), cluster="prod-eu")
    agents_start(plane, "")
    plan_job(plane.store, plane.cluster, plane.queues, "default/keep", now=plane.now())
    plan_job(plane.store, prod, plane.queues, "prod-eu:default/keep", now=plane.now())
    # When a node of the same name as one of the own cluster joins prod-eu, holding the startup taint
    prod.nodes.append(make_node("ip-10-0-1-9"))
    plane.cluster.nodes.append(make_node("ip-10-0-1-9"))
    url = queues_of(plane, "prod-eu").ensure_queue("ip-10-0-1-9")
    hello = Hello(node="ip-10-0-1-9", cluster="prod-eu", warm_until=plane.now() + 600)
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster, {"prod-eu": prod}),
                            [("m1", hello)], now=plane.now())
    # Then it is registered under prod-eu, added to prod-eu's job only, and told its images in its queue
    assert outcome.hellos[0].added_to == ["prod-eu:default/keep"]
    assert plane.store.get_node("ip-10-0-1-9", "prod-eu") is not None
    assert plane.store.get_node("ip-10-0-1-9") is None
    assert [n.name for n in plane.store.list_nodes("prod-eu")] == ["ip-10-0-1-9"]
    messages = take_node_messages(plane.sqs, url)
    assert any(isinstance(m, RequiredImages) and m.cluster == "prod-eu" for m in messages)
    assert [m.job for m in messages if isinstance(m, PullTask)] == ["prod-eu:default/keep"]
    own = view_job(plane.store, "default", "keep", now=plane.now(), with_tasks=True)
    assert "ip-10-0-1-9" not in {t.node for t in own.tasks}


def test_a_cluster_whose_api_is_down_does_not_keep_the_others_from_their_sweep(
    two: tuple[ControlPlane, FakeCluster]
) -> None:
    plane, prod = two
    # Given a node gone from the own cluster, its queue and registration still there, and prod-eu's API
    # down; prod-eu has a node of the same name, registered
    own_urls = agents_start(plane, "")
    prod_urls = agents_start(plane, "prod-eu")
    for cluster in ("", "prod-eu"):
        record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster, {"prod-eu": prod}),
                      [("m", Hello(node=NODES[0], cluster=cluster))], now=plane.now())
    plane.cluster.nodes = [n for n in plane.cluster.nodes if n["metadata"]["name"] != NODES[0]]

    class Down(FakeCluster):
        def list_node_metadata(self) -> list[dict[str, Any]]:
            raise ClusterUnavailableError("connection refused")

    clusters = clusters_of(plane.store, plane.cluster, {"prod-eu": Down(nodes=prod.nodes)})
    result = sweep(plane.store, plane.queues, clusters, now=plane.now(),
                   config=SweepSettings(prefix=plane.queues.prefix))
    # Then the own cluster's departed node is forgotten, prod-eu's namesake and its queue are untouched,
    # and prod-eu is reported unreachable
    assert result.nodes_forgotten == [NODES[0]]
    assert result.unreachable == {"prod-eu": "connection refused"}
    assert plane.store.get_node(NODES[0]) is None and plane.store.get_node(NODES[0], "prod-eu") is not None
    names = set(plane.queues.list_node_queues("prod-eu"))
    assert prod_urls[NODES[0]].rsplit("/", 1)[1] in names
    assert own_urls[NODES[0]].rsplit("/", 1)[1] not in set(plane.queues.list_node_queues())
    # and once prod-eu answers without that node, only its own queue and registration go
    prod.nodes = [n for n in prod.nodes if n["metadata"]["name"] != NODES[0]]
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=plane.now(),
                   config=SweepSettings(prefix=plane.queues.prefix))
    assert result.nodes_forgotten == [f"prod-eu:{NODES[0]}"] and result.agents == {"prod-eu": 1}
    assert prod_urls[NODES[0]].rsplit("/", 1)[1] not in set(plane.queues.list_node_queues("prod-eu"))
    assert prod_urls[NODES[1]].rsplit("/", 1)[1] in set(plane.queues.list_node_queues("prod-eu"))


def test_a_job_whose_cluster_cannot_be_read_says_so(two: tuple[ControlPlane, FakeCluster]) -> None:
    plane, _ = two

    class Down(FakeCluster):
        def list_nodes(self, label_selector: str | None = None, field_selector: str | None = None
                       ) -> list[dict[str, Any]]:
            raise ClusterUnavailableError("connection refused")

    apply_manifest(plane.store, job_doc("warm"), now=plane.now(), cluster="prod-eu")
    plan(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down()}),
         job_key("default", "warm", "prod-eu"), now=plane.now())
    view = view_job(plane.store, "default", "warm", now=plane.now(), cluster="prod-eu")
    assert "cluster prod-eu cannot be read: connection refused; planned as soon as it answers" in view.message


def test_a_job_resource_belongs_to_its_cluster_and_rules_come_from_the_stacks_own(
    two: tuple[ControlPlane, FakeCluster]
) -> None:
    plane, _ = two
    resource = {**job_doc("warm"), "apiVersion": "prewarm.dev/v1alpha1",
                "metadata": {"name": "warm", "namespace": "default", "generation": 1}}
    rule_resource = {**rule(), "metadata": {"name": "models", "generation": 1}}
    api = ResourceApi({"imagepulljobs": [resource], "prewarmrules": [rule_resource]})
    report_ = sync_resources(plane.store, api, now=plane.now(), cluster="prod-eu")  # type: ignore[arg-type]
    assert report_.applied == ["ImagePullJob prod-eu:default/warm created"]
    assert plane.store.get_job("prod-eu:default/warm") is not None and plane.store.get_job("default/warm") is None
    assert plane.store.list_rules() == []
    assert api.statuses["prewarmrules/models"]["message"] == f"not applied: {RULES_FROM_OWN_CLUSTER}"
    # The own cluster's sync leaves prod-eu's job alone (it is not the own cluster's resource)
    sync_resources(plane.store, ResourceApi(), now=plane.now())  # type: ignore[arg-type]
    record = plane.store.get_job("prod-eu:default/warm")
    assert record is not None and record.state.value == "Running"


def test_a_cluster_whose_api_hangs_keeps_no_other_cluster_waiting(two: tuple[ControlPlane, FakeCluster]) -> None:
    plane, prod = two
    plane.store.put_cluster(RegisteredCluster("staging", endpoint="https://staging.example"))
    # Given prod-eu's node list answers only once staging's sweep is under way (a hung API, until its
    # timeout), prod-eu listed first, and a node gone from staging
    agents_start(plane, "staging")
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster, {"staging": prod}),
                  [("m", Hello(node=NODES[0], cluster="staging"))], now=plane.now())
    staging_under_way = threading.Event()

    class Hung(FakeCluster):
        def list_node_metadata(self) -> list[dict[str, Any]]:
            if not staging_under_way.wait(5):
                raise ClusterUnavailableError("timed out")
            return super().list_node_metadata()

    class Staging(FakeCluster):
        def list_node_metadata(self) -> list[dict[str, Any]]:
            staging_under_way.set()
            return super().list_node_metadata()

    apis = {"prod-eu": Hung(nodes=prod.nodes), "staging": Staging(nodes=prod.nodes[1:])}
    result = sweep(plane.store, plane.queues, clusters_of(plane.store, None, apis), now=plane.now(),
                   config=SweepSettings(prefix=plane.queues.prefix))
    # Then both were swept: one after the other, prod-eu would have timed out waiting for staging
    assert result.unreachable == {} and result.nodes_forgotten == [f"staging:{NODES[0]}"]
    assert result.agents == {"prod-eu": 0, "staging": 1}


class ResourceApi:
    """A cluster's prewarm.dev resources, as `sync_resources` reads and writes them."""

    def __init__(self, listed: dict[str, list[dict[str, Any]]] | None = None,
                 before_list: Any = None) -> None:
        self.listed = listed or {}
        self.before_list = before_list
        self.statuses: dict[str, dict[str, Any]] = {}

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if self.before_list is not None:
            self.before_list()
        return self.listed.get(plural, [])

    def replace_status(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                       namespace: str | None = None) -> dict[str, Any]:
        self.statuses[f"{plural}/{name}"] = body["status"]
        return body

    def delete_object(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing is deleted")

    def get_secret(self, namespace: str, name: str) -> None:
        return None


def test_clusters_are_synced_side_by_side_and_each_answer_is_recorded(two: tuple[ControlPlane, FakeCluster]) -> None:
    plane, _ = two
    plane.store.put_cluster(RegisteredCluster("staging", endpoint="https://staging.example"))
    resource = {**job_doc("warm"), "apiVersion": "prewarm.dev/v1alpha1",
                "metadata": {"name": "warm", "namespace": "default", "generation": 1}}
    staging_under_way = threading.Event()

    def hung() -> None:  # prod-eu answers only once staging's sync is under way: one after the other, it times out
        if not staging_under_way.wait(5):
            raise ClusterUnavailableError("timed out")

    apis = {"prod-eu": ResourceApi({"imagepulljobs": [resource]}, before_list=hung),
            "staging": ResourceApi({"imagepulljobs": [resource]}, before_list=staging_under_way.set)}
    clusters = clusters_of(plane.store, ClusterUnavailableError("connection refused"), apis, own_name="home")
    report = sync_clusters(plane.store, clusters, clock=plane.now)
    assert report.unreachable == {"": "connection refused"}
    assert sorted(report.applied) == ["prod-eu: ImagePullJob prod-eu:default/warm created",
                                      "staging: ImagePullJob staging:default/warm created"]
    health = {c.name: (c.reachable, c.reason, c.last_sync is not None) for c in plane.store.list_clusters()}
    assert health == {"home": (False, "connection refused", False), "prod-eu": (True, "", True),
                      "staging": (True, "", True)}


def test_each_clusters_sweep_keeps_its_own_settled_nodes(two: tuple[ControlPlane, FakeCluster]) -> None:
    plane, prod = two
    # Given nodes long past the startup taint's deadline in both clusters, none tainted
    old = "2020-01-01T00:00:00Z"
    for cluster, prefix in ((plane.cluster, "own"), (prod, "prod")):
        for node in cluster.nodes:
            node["metadata"].update(creationTimestamp=old, uid=f"{prefix}-{node['metadata']['name']}")
    settled = SettledNodes()
    # When the clusters are swept side by side, twice
    for _ in range(2):
        sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster, {"prod-eu": prod}), now=plane.now(),
              config=SweepSettings(prefix=plane.queues.prefix), settled=settled)
    # Then each cluster's nodes stay settled (read once), not wiped by the other cluster's sweep
    assert settled.by_cluster == {"": {f"own-{n}" for n in NODES}, "prod-eu": {f"prod-{n}" for n in NODES}}


def test_a_job_left_unplanned_while_its_cluster_was_down_is_planned_again_once_it_answers(
    two: tuple[ControlPlane, FakeCluster]
) -> None:
    plane, prod = two

    class Down(FakeCluster):
        def list_node_metadata(self) -> list[dict[str, Any]]:
            raise ClusterUnavailableError("connection refused")

    apply_manifest(plane.store, job_doc("warm"), now=plane.now(), cluster="prod-eu")
    before = plane.store.get_job("prod-eu:default/warm")
    assert before is not None and not before.is_planned
    later = plane.now() + 600
    # While prod-eu is down, the sweep leaves the job alone (a plan would fail again)
    down = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": Down()}), now=later,
                 config=SweepSettings(prefix=plane.queues.prefix))
    assert down.replanned == [] and down.unreachable == {"prod-eu": "connection refused"}
    # Once it answers, the job is asked to plan again: a new generation, which the table stream plans
    up = sweep(plane.store, plane.queues, clusters_of(plane.store, None, {"prod-eu": prod}), now=later,
               config=SweepSettings(prefix=plane.queues.prefix))
    after = plane.store.get_job("prod-eu:default/warm")
    assert up.replanned == ["prod-eu:default/warm"]
    assert after is not None and after.generation == before.generation + 1 and after.needs_planning(before)


def test_hellos_and_warm_ups_of_a_cluster_the_stack_does_not_serve_are_dropped(
    two: tuple[ControlPlane, FakeCluster]
) -> None:
    plane, _ = two
    hello = Hello(node=NODES[0], cluster="removed")
    warmed = Warmed(node=NODES[0], cluster="removed", joined_at=1, hello_at=2, warm_at=3, outcome="warm")
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                            [("m1", hello), ("m2", warmed)], now=plane.now())
    # Then neither is registered nor retried (it would only reach the DLQ): both are dropped, named
    assert outcome.dropped == [f"removed:{NODES[0]}"] * 2 and outcome.retry_ids == []
    assert plane.store.list_nodes("removed") == [] and plane.store.get_node(NODES[0], "removed") is None
