"""A cluster registered in another Region than the push pulls its own Region's ECR replica when the registry
replicates the repository there, and its job starts only on that Region's `ECR Replication Action` event
(before: every cluster's job pulled the pushed Region's image at once, racing replication)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import job_key
from prewarm.domain.push import ImagePush
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.push import handle_push, handle_replication
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.images import LayerCounts

PUSH = ImagePush(account="123456789012", region="us-west-2", repository="ml/model", digest="sha256:" + "a" * 64,
                 tag="v1")
RULE = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "models"},
        "spec": {"repositories": ["ml/*"]}}
NAME = "models-aaaaaaaaaaaa"


class Replication:
    """`DescribeRegistry`'s answer, counted."""

    def __init__(self, *regions: str) -> None:
        self.regions = frozenset(regions)
        self.reads = 0

    def replica_regions(self, repository: str) -> frozenset[str]:
        self.reads += 1
        return self.regions


def _stack(plane: ControlPlane) -> None:
    plane.store.put_cluster(RegisteredCluster("eu", endpoint="https://eu.example", region="eu-west-1"))
    plane.store.put_cluster(RegisteredCluster("west", endpoint="https://west.example", region="us-west-2"))
    apply_manifest(plane.store, RULE, now=plane.now())


def test_a_cluster_in_a_replicated_region_waits_for_the_replication_event_then_pulls_its_replica(
    plane: ControlPlane,
) -> None:
    # Given clusters in the push's Region (the stack's own, "west") and in eu-west-1, which ECR replicates to
    _stack(plane)
    replication = Replication("eu-west-1")
    clusters = clusters_of(plane.store, own_name="home")

    # When the push arrives
    handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters, replication=replication)

    # Then the eu cluster's job pulls the eu-west-1 replica at the same digest and waits: it is not planned
    eu = plane.store.get_job(job_key("default", NAME, "eu"))
    assert eu is not None and eu.awaits_replica == "eu-west-1" and not eu.needs_planning()
    assert eu.image == f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/ml/model@{PUSH.digest}"
    assert "waiting for ECR replication to eu-west-1" in view_job(plane.store, "default", NAME, now=plane.now(),
                                                                  cluster="eu").message
    # ... while the push's Region's clusters pull the pushed image at once; DescribeRegistry was read once
    for cluster in ("", "west"):
        record = plane.store.get_job(job_key("default", NAME, cluster))
        assert record is not None and not record.awaits_replica and record.needs_planning()
        assert record.image.startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/")
    assert replication.reads == 1
    assert not eu.is_unplanned_for_long(plane.now() + 3600)  # the sweep does not plan it either

    # When ECR says the image is replicated to eu-west-1
    applied = handle_replication(plane.store, None, PUSH, "eu-west-1", now=plane.now(), clusters=clusters)

    # Then the eu job is released (the stream plans it), and nothing else changed
    assert [(a.cluster, a.outcome) for a in applied] == [("eu", "unchanged")]
    released = plane.store.get_job(job_key("default", NAME, "eu"))
    assert released is not None and not released.awaits_replica and released.needs_planning(previous=eu)
    assert "replication" not in view_job(plane.store, "default", NAME, now=plane.now(), cluster="eu").message


def test_a_replication_event_before_the_push_s_creates_the_job_released_and_the_push_leaves_it(
    plane: ControlPlane,
) -> None:
    _stack(plane)
    clusters = clusters_of(plane.store, own_name="home")
    handle_replication(plane.store, None, PUSH, "eu-west-1", now=plane.now(), clusters=clusters)
    handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters, replication=Replication("eu-west-1"))
    eu = plane.store.get_job(job_key("default", NAME, "eu"))
    assert eu is not None and not eu.awaits_replica and "eu-west-1" in eu.image


@pytest.mark.parametrize("push_first", [True, False], ids=["push-first", "replication-first"])
def test_the_replica_s_job_carries_the_index_s_platforms_whichever_event_comes_first(
    plane: ControlPlane, push_first: bool
) -> None:
    # Before: a replication event first (it says no media type) made the job with no platforms, started
    # at once on every node; the push then re-planned it with the index's platforms.
    _stack(plane)
    clusters = clusters_of(plane.store, own_name="home")
    platforms = [{"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"}]
    images = LayerCounts(12, platforms)
    index = replace(PUSH, manifest_media_type="application/vnd.oci.image.index.v1+json")
    from_replication = replace(PUSH, manifest_media_type="")  # EcrReplicationActionEvent.to_push

    events = [lambda: handle_push(plane.store, images, index, now=plane.now(), clusters=clusters,
                                  replication=Replication("eu-west-1")),
              lambda: handle_replication(plane.store, images, from_replication, "eu-west-1", now=plane.now(),
                                         clusters=clusters)]
    first, then = events if push_first else events[::-1]
    first()
    started = plane.store.get_job(job_key("default", NAME, "eu"))
    then()

    eu = plane.store.get_job(job_key("default", NAME, "eu"))
    assert eu is not None and started is not None and not eu.awaits_replica
    assert (eu.image, eu.platforms, eu.layers) == (
        f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/ml/model@{PUSH.digest}", platforms, 12)
    # the job that starts (released by the replication event) is the one the first event stored
    assert (started.platforms, started.layers, started.round) == (eu.platforms, eu.layers, eu.round)
    assert eu.generation == started.generation  # the later event changed nothing to plan again


def test_a_region_not_replicated_to_pulls_the_pushed_image_at_once(plane: ControlPlane) -> None:
    _stack(plane)
    handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store, own_name="home"),
                replication=Replication("ap-south-1"))
    eu = plane.store.get_job(job_key("default", NAME, "eu"))
    assert eu is not None and not eu.awaits_replica and eu.image.startswith("123456789012.dkr.ecr.us-west-2.")


def test_no_cluster_elsewhere_reads_no_replication_configuration(plane: ControlPlane) -> None:
    apply_manifest(plane.store, RULE, now=plane.now())
    replication = Replication("eu-west-1")
    handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store, own_name="home"),
                replication=replication)
    assert replication.reads == 0
