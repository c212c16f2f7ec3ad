"""Cross-Region replicas, on this machine: `LocalMode(clusters=2, replica_region=...)` runs the own cluster
`local` in us-west-2, where images are pushed, and `local-2` registered in us-east-1, to which the local ECR
replicates every repository into a registry of that Region's own (`localreplica`), with ECR's
"ECR Replication Action" event.

A push warms the own cluster at once. local-2's job pulls the us-east-1 replica, and gets no task until that
Region's replication event: before it, the replica is not there (a pull that races replication fails) and
the job says it waits. After it, local-2's nodes pull from us-east-1's registry host, checked through CRI.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prewarm.services.jobs import apply_manifest, list_views
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

OTHER, REPLICA = "local-2", "us-east-1"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "replicas", nodes=2, clusters=2, replica_region=REPLICA,
                            registry_quotas={"ecr_manifest_per_s": 500.0}) as mode:
        if mode.aws is None or mode.aws.layer is None:
            pytest.skip("the AWS limits layer is off: it plays EKS for the second cluster")
        apply_manifest(mode.job_store(), {
            "apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "replicated"},
            "spec": {"repositories": ["e2e/replicated-*"], "template": {"metadata": {"namespace": "default"}, "spec": {
                "parallelism": 2, "pullPolicy": {"timeoutSeconds": 120, "backoffLimit": 0}}}}}, now=time.time())
        yield mode


def test_local_up_s_registry_quota_is_the_registry_s_while_it_runs(local: LocalMode) -> None:
    assert local.aws is not None and local.aws.layer is not None
    assert local.aws.layer.ecr.quotas.ecr_manifest_per_s == 500.0  # `local up --registry-quota manifest=500`


def views_of(local: LocalMode, name: str) -> dict[str, Any]:
    return {v.record.key: v for v in list_views(local.job_store(), namespace=None, now=time.time())
            if v.record.name == name}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.5)
    return found


def test_the_second_region_s_cluster_starts_on_its_replication_event_and_pulls_its_region_s_replica(
    local: LocalMode,
) -> None:
    # Given the registered cluster's Region, and ECR's replication configuration, as the stack reads them
    registered = local.job_store().get_cluster(OTHER)
    assert registered is not None and registered.region == REPLICA
    other = local.extra_clusters[OTHER]

    # When an image is pushed in us-west-2, and not replicated yet
    pushed = local.push("e2e/replicated-web", "v1", size_mb=1, replicate=False)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}
    own, theirs = f"default/{name}", f"{OTHER}:default/{name}"
    replica = f"{ecr_host(region=REPLICA)}/e2e/replicated-web@{pushed.digest}"

    # Then the own cluster's job completes from us-west-2's registry
    wait_for("the own cluster's job done", lambda: (v := views_of(local, name).get(own)) and v.completion_time)
    # ... while local-2's job, on the us-east-1 replica, has no node and says it waits for replication
    waiting = views_of(local, name)[theirs]
    assert waiting.record.image == replica and waiting.record.awaits_replica == REPLICA
    assert (waiting.desired, waiting.active) == (0, 0)
    assert f"waiting for ECR replication to {REPLICA}" in waiting.message
    local.fire("sweep")  # the sweep does not start it either
    assert views_of(local, name)[theirs].desired == 0
    # ... and a pull racing replication fails: the replica is not in us-east-1's registry yet
    node = next(iter(other.nodes.values()))
    with node.containerd.cri_client() as cri, pytest.raises(Exception, match=r"not found|404|NotFound"):
        cri.pull_image(replica, auth=local.replica.registry.auth).result(timeout=60)

    # When ECR replicates it to us-east-1 and says so
    local.replicate(pushed)

    # Then local-2's job runs on its two nodes, which pulled the image from us-east-1's registry host
    done = wait_for("local-2's job done", lambda: (v := views_of(local, name)[theirs]).completion_time and v)
    assert (done.desired, done.succeeded, done.failed) == (2, 2, 0), done.message
    assert "replication" not in done.message
    for each in other.nodes.values():
        assert each.image_present(replica), each.name
        assert not each.image_present(pushed.reference), f"{each.name} pulled from us-west-2"
    for each in local.nodes.values():
        assert each.image_present(pushed.reference) and not each.image_present(replica), each.name


def test_a_replication_event_before_the_push_s_gives_each_cluster_one_job_of_one_round(local: LocalMode) -> None:
    # When us-east-1's replication event reaches the stack before the push's own event
    pushed = local.push("e2e/replicated-early", "v1", size_mb=1, replication_first=True)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}
    own, theirs = f"default/{name}", f"{OTHER}:default/{name}"
    replica = f"{ecr_host(region=REPLICA)}/e2e/replicated-early@{pushed.digest}"
    # Then each cluster has one job, in its first round and generation (the later event changed neither), both
    # complete: local-2's from its Region's replica
    done = wait_for("both jobs done", lambda: (views := views_of(local, name)) and len(views) == 2
                    and all(v.completion_time for v in views.values()) and views)
    assert sorted(done) == sorted([own, theirs])
    for key, image in ((own, pushed.reference), (theirs, replica)):
        view = done[key]
        assert (view.record.image, view.record.round, view.record.generation) == (image, 0, 1), key
        assert (view.desired, view.succeeded, view.record.layers) == (2, 2, 1), key
    for each in local.extra_clusters[OTHER].nodes.values():
        assert each.image_present(replica), each.name


def test_doctor_finds_the_replica_region_s_rule_forwarding_replication_events(local: LocalMode) -> None:
    from prewarm_cli.doctor.replication import check_replication_events

    assert local.aws is not None
    result = check_replication_events(local.job_store().list_clusters(), stack_region="us-west-2",
                                      events=lambda region: local.aws.client("events", region_name=region),
                                      iam=local.aws.client("iam"))
    assert result.ok, result.line()
    assert result.detail == f"forwarded to us-west-2 from {REPLICA} (rule prewarm-ecr-replication)"
