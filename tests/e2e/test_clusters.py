"""One stack, two clusters, on this machine: `LocalMode(clusters=2)` runs the own cluster `local` and
`local-2` (labelled env=prod, registered as `prewarm cluster add` registers it), each an embedded
Kubernetes API with the same node names, each node with its own containerd and agent.

A push warms matching nodes in both (one job per cluster), a rule for env=prod warms local-2 only, a job
resource applied in one cluster never reaches the other's nodes (whose names are the same), and with
local-2's API stopped the own cluster's job still completes while local-2 shows unreachable and its job
says why. The outage test stops local-2 for good: it runs last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from prewarm.adapters.kube import KubeCluster
from prewarm.services.jobs import apply_manifest, list_views
from prewarm_cli.app import cli
from prewarm_devtools.commands import local as local_commands
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode, sync_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

OTHER = "local-2"
API = "prewarm.dev/v1alpha1"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "clusters", nodes=2, clusters=2) as mode:
        if mode.aws is None or mode.aws.layer is None:
            pytest.skip("the AWS limits layer is off: it plays EKS for the second cluster")
        yield mode


def rule(name: str, repositories: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "PrewarmRule", "metadata": {"name": name},
            "spec": {"repositories": repositories, **spec, "template": {"metadata": {"namespace": "default"}, "spec": {
                "parallelism": 2, "pullPolicy": {"timeoutSeconds": 120, "backoffLimit": 0}}}}}


def views_of(local: LocalMode, name: str) -> dict[str, Any]:
    """The jobs named `name`, by key (`default/<name>` in the own cluster, `local-2:default/<name>`)."""
    return {v.record.key: v for v in list_views(local.job_store(), namespace=None, now=time.time())
            if v.record.name == name}


def wait_done(local: LocalMode, name: str, keys: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        views = views_of(local, name)
        if set(views) == keys and all(v.completion_time for v in views.values()):
            return views
        assert time.monotonic() < deadline, {k: (v.desired, v.succeeded, v.failed, v.message) for k, v in
                                             views.items()}
        time.sleep(0.5)


def present(nodes: dict[str, Any], reference: str) -> dict[str, bool]:
    return {name: node.image_present(reference) for name, node in nodes.items()}


def test_the_clusters_have_the_same_node_names_and_the_second_is_registered_with_its_labels(
    local: LocalMode,
) -> None:
    other = local.extra_clusters[OTHER]
    assert sorted(other.nodes) == sorted(local.nodes) and len(local.nodes) == 2
    # (the stack's own cluster has an item too once a schedule or a probe recorded how it answers)
    (registered,) = [c for c in local.job_store().list_clusters() if c.name != "local"]
    assert (registered.name, dict(registered.labels), registered.endpoint) == (OTHER, {"env": "prod"}, other.url)
    # `prewarm local status` shows each cluster with its nodes and their agents
    status = CliRunner().invoke(local_commands, ["status"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    assert f"cluster {OTHER}: Kubernetes API at {other.url} (serving), labels env=prod" in status.stdout
    assert "nodes of cluster local (2):" in status.stdout and f"nodes of cluster {OTHER} (2):" in status.stdout


def test_one_push_warms_matching_nodes_in_both_clusters(local: LocalMode) -> None:
    apply_manifest(local.job_store(), rule("everywhere", ["e2e/all-*"]), now=time.time())
    pushed = local.push("e2e/all-web", "v1", size_mb=1)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}

    views = wait_done(local, name, {f"default/{name}", f"{OTHER}:default/{name}"})

    # One job per cluster, each with its own cluster's two nodes only
    for view in views.values():
        assert (view.desired, view.succeeded, view.failed) == (2, 2, 0), view.message
    assert views[f"{OTHER}:default/{name}"].record.cluster == OTHER
    assert all(present(local.nodes, pushed.reference).values())
    assert all(present(local.extra_clusters[OTHER].nodes, pushed.reference).values())


def test_a_rule_for_env_prod_warms_only_that_cluster(local: LocalMode) -> None:
    apply_manifest(local.job_store(), rule("prod-only", ["e2e/prod-*"], clusters={"matchLabels": {"env": "prod"}}),
                   now=time.time())
    pushed = local.push("e2e/prod-api", "v1", size_mb=1)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}

    views = wait_done(local, name, {f"{OTHER}:default/{name}"})

    assert (views[f"{OTHER}:default/{name}"].desired, views[f"{OTHER}:default/{name}"].succeeded) == (2, 2)
    assert all(present(local.extra_clusters[OTHER].nodes, pushed.reference).values())
    assert not any(present(local.nodes, pushed.reference).values())


def test_a_job_resource_in_one_cluster_never_touches_the_other_clusters_nodes(local: LocalMode) -> None:
    other = local.extra_clusters[OTHER]
    pushed = local.push("e2e/resource-only", "v1", size_mb=1)
    nodes = sorted(other.nodes)
    job = {"apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": "in-two", "namespace": "default"},
           "spec": {"image": pushed.reference, "parallelism": 2, "selector": {"names": nodes},
                    "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 120}}}
    # Applied with the official client in local-2, as its admin
    with KubeCluster(other.url, lambda: other.kube.token, ca_data=other.kube.ca_pem) as admin:
        admin.create_object(API, "imagepulljobs", job, "default")

        def done() -> dict[str, Any] | None:
            status = admin.get_object(API, "imagepulljobs", "in-two", "default").get("status") or {}
            return status if status.get("completionTime") else None

        status = sync_until(local, done, 60, "the resource in local-2 reports its job complete")

    assert (status["desired"], status["succeeded"], status["failed"]) == (2, 2, 0)
    # The job is local-2's alone: the own cluster has no such job, and its nodes (same names) pulled nothing
    assert set(views_of(local, "in-two")) == {f"{OTHER}:default/in-two"}
    assert all(present(other.nodes, pushed.reference).values())
    assert not any(present(local.nodes, pushed.reference).values())


def test_with_one_clusters_api_down_the_other_completes_and_the_down_one_says_why(local: LocalMode) -> None:
    other = local.extra_clusters[OTHER]
    apply_manifest(local.job_store(), rule("outage", ["e2e/outage-*"]), now=time.time())
    other.kube.stop()  # local-2's API server goes away; its nodes and agents stay

    pushed = local.push("e2e/outage-web", "v1", size_mb=1)
    (name,) = {line.split("/")[1].split()[0] for line in pushed.jobs}

    # The own cluster's job completes on its nodes
    deadline = time.monotonic() + 90
    while not (own := views_of(local, name).get(f"default/{name}")) or not own.completion_time:
        assert time.monotonic() < deadline, "the own cluster's job did not complete"
        time.sleep(0.5)
    assert (own.desired, own.succeeded) == (2, 2)
    assert all(present(local.nodes, pushed.reference).values())
    assert not any(present(other.nodes, pushed.reference).values())
    # local-2's job says why it cannot go on
    down = views_of(local, name)[f"{OTHER}:default/{name}"]
    assert "local-2" in down.message and down.succeeded == 0, down.message
    # The schedules record local-2 as unreachable, and `prewarm cluster list` says so (exit 1)
    local.fire("sweep")
    local.fire("sync")
    listed = CliRunner().invoke(cli, ["--local", "cluster", "list"], catch_exceptions=False)
    assert listed.exit_code == 1, listed.output
    row = next(line for line in listed.stdout.splitlines() if line.startswith(OTHER))
    assert row.split()[:4] == [OTHER, "env=prod", "Installed", "unreachable"], listed.stdout
