"""The table stream's use cases (`services/stream.py`): a plan and a deletion each tell the warming nodes
of their job's cluster; a registered cluster that cannot be reached holds no stream record up."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import job_key
from prewarm.domain.messages import Hello, RequiredImages
from prewarm.services.jobs import apply_manifest, request_deletion, view_job
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.reports import register_node
from prewarm.services.stream import delete, plan
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
    # Then the record does not fail: the job waits, and its message says why
    assert result.action.startswith("waiting for cluster prod-eu: cluster prod-eu has no API in this test")
    view = view_job(plane.store, "default", "warm", now=plane.now(), cluster="prod-eu")
    assert "cluster prod-eu cannot be reached: cluster prod-eu has no API in this test" in view.message


def test_the_stacks_own_cluster_failing_fails_the_record_so_the_stream_retries_it(plane: ControlPlane) -> None:
    class Down(FakeCluster):
        def list_nodes(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            raise ClusterUnavailableError("connection refused")

    apply_manifest(plane.store, job_doc("warm"), now=plane.now())
    with pytest.raises(ClusterUnavailableError):
        plan(plane.store, plane.queues, clusters_of(plane.store, Down()), job_key("default", "warm"), now=plane.now())


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
