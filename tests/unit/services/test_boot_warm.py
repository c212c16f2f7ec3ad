"""Issue #36, warm as a node fact, on the control plane's side: a node's first hello records which of its
required images were present at boot (by digest, from the hello's CRI image list); a tainted node that has
them all loses its startup taint at once, in the same batch, without waiting for its agent's pulls; its
`PrewarmWarm` condition follows its warm-up; and the bytes its pulls downloaded are summed from their reports."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.boot import CONDITION_TYPE, FAILED, NONE_REQUIRED, PRESENT_AT_BOOT, PULLED, PULLING
from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.messages import ALREADY_PRESENT, Hello, Warmed
from prewarm.services.boot import node_bytes_pulled
from prewarm.services.jobs import apply_manifest
from prewarm.services.nodes import view_nodes
from prewarm.services.ports import ClusterAuthError, NodeQueueError
from prewarm.services.status_batches import record_status
from prewarm_cli.node_output import node_document, nodes_table
from tests.support.cluster import FakeCluster, make_node, recorded_reads
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
IMAGE = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/torch@{DIGEST}"
SECOND = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/tokenizer@{OTHER}"
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def never_job(plane: ControlPlane, name: str, image: str) -> None:
    apply_manifest(plane.store, job_doc(name, image=image, selector={"matchLabels": {"pool": "gpu"}},
                                        completionPolicy={"type": "Never"}), now=plane.now())
    plane.plan(name)


def joins(plane: ControlPlane, name: str, *, tainted: bool = True) -> dict[str, Any]:
    node = make_node(name, pool="gpu")
    if tainted:
        node["spec"] = {"taints": [dict(TAINT), {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    plane.cluster.nodes.append(node)
    return node


def hello(plane: ControlPlane, name: str, *, images: list[str], tainted: bool = True) -> Any:
    now = plane.now()
    message = Hello(node=name, labels={"pool": "gpu"}, images=images, warm_until=now + 900 if tainted else None)
    return record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("h", message)], now=now)


def condition(node: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == CONDITION_TYPE]
    return dict(found)


def taint_keys(node: dict[str, Any]) -> list[str]:
    return [t["key"] for t in node.get("spec", {}).get("taints", [])]


def test_a_tainted_node_with_every_image_at_boot_loses_the_taint_in_the_batch_of_its_hello(plane: ControlPlane) -> None:
    # Given two running Never jobs for the gpu pool, and a node that joins with the startup taint
    never_job(plane, "torch", IMAGE)
    never_job(plane, "tokenizer", SECOND)
    node = joins(plane, "gpu-1")

    # When its first hello lists both digests (its containerd had them at boot)
    outcome = hello(plane, "gpu-1", images=[IMAGE, SECOND, "docker.io/library/busybox@" + OTHER])

    # Then the startup taint is gone (and only it), the condition says so, and the registration keeps the fact
    assert outcome.retry_ids == []
    assert taint_keys(node) == ["nvidia.com/gpu"]
    assert condition(node)["status"] == "True" and condition(node)["reason"] == PRESENT_AT_BOOT
    assert "all 2 images required were present at boot" in condition(node)["message"]
    registered = plane.store.get_node("gpu-1")
    assert registered is not None and registered.boot is not None
    assert registered.boot.required == tuple(sorted([IMAGE, SECOND])) and registered.boot.all_present
    # ... and the agent is still sent its list (it finds the taint gone and says Warmed)
    assert [m.kind for m in plane.node_messages("gpu-1")].count("required") == 1


def test_a_node_missing_an_image_keeps_the_taint_and_is_pulling_then_pulled_with_its_bytes(
    plane: ControlPlane,
) -> None:
    # Given two Never jobs, and a tainted node whose containerd holds only one of their images
    never_job(plane, "torch", IMAGE)
    never_job(plane, "tokenizer", SECOND)
    node = joins(plane, "gpu-1")
    hello(plane, "gpu-1", images=[SECOND])

    # Then it keeps the taint for its agent, and is Pulling
    assert "prewarm.dev/warming" in taint_keys(node)
    assert (condition(node)["status"], condition(node)["reason"]) == ("False", PULLING)
    assert condition(node)["message"] == "1 of 2 images required were present at boot; pulling 1"

    # When its agent pulls the missing image (2 MB), finds the other present, and removes the taint
    plane.report("torch", "gpu-1", "Pulling", bytes_done=0, bytes_total=2_000_000)
    plane.report("torch", "gpu-1", "Succeeded", bytes_done=2_000_000, bytes_total=2_000_000, size_bytes=2_000_000)
    plane.report("tokenizer", "gpu-1", "Succeeded", size_bytes=7_000_000, message=ALREADY_PRESENT)
    now = plane.now()
    warmed = Warmed(node="gpu-1", joined_at=now - 30, hello_at=now - 20, warm_at=now, outcome="warm")
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("w", warmed)], now=now)

    # Then the bytes pulled are those downloaded, not the size of the image already there, and the node is warm
    assert node_bytes_pulled(plane.store, "gpu-1") == 2_000_000
    assert (condition(node)["status"], condition(node)["reason"]) == ("True", PULLED)
    assert condition(node)["message"] == "all 2 images required present (1 present at boot)"


def test_a_node_past_its_deadline_is_failed_naming_what_is_missing(plane: ControlPlane) -> None:
    never_job(plane, "torch", IMAGE)
    node = joins(plane, "gpu-1")
    hello(plane, "gpu-1", images=[])
    now = plane.now()
    warmed = Warmed(node="gpu-1", joined_at=now - 900, hello_at=now - 890, warm_at=now, outcome="timeout",
                    missing=[IMAGE], missing_total=1)
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("w", warmed)], now=now)

    assert (condition(node)["status"], condition(node)["reason"]) == ("False", FAILED)
    assert condition(node)["message"] == f"startup taint removed at maxWarmSeconds with 1 image missing: {IMAGE}"


def test_a_restarted_agent_keeps_what_the_first_hello_found_at_boot(plane: ControlPlane) -> None:
    # Given a node whose first hello found nothing of its image
    never_job(plane, "torch", IMAGE)
    joins(plane, "gpu-1")
    hello(plane, "gpu-1", images=[])
    first = plane.store.get_node("gpu-1")
    assert first is not None and first.boot is not None and first.boot.present == ()

    # When its agent restarts (same join, so the same deadline) after the image was pulled
    now = plane.now()
    again = Hello(node="gpu-1", labels={"pool": "gpu"}, images=[IMAGE], warm_until=first.warm_until)
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("h", again)],
                            now=now)

    # Then the image still counts as pulled after boot, not present at it
    registered = plane.store.get_node("gpu-1")
    assert registered is not None and registered.boot == first.boot and outcome.hellos[0].boot is None


def test_an_untainted_node_or_one_no_job_selects_gets_its_condition_and_no_taint_write(plane: ControlPlane) -> None:
    never_job(plane, "torch", IMAGE)
    # An agent of an untainted node (or one older than the startup taint: no warm_until) with the image
    node = joins(plane, "gpu-1", tainted=False)
    hello(plane, "gpu-1", images=[IMAGE], tainted=False)
    assert condition(node)["reason"] == PRESENT_AT_BOOT and ("patch", "node", "gpu-1") not in plane.cluster.writes
    # A node no job selects
    other = make_node("cpu-1", pool="cpu")
    plane.cluster.nodes.append(other)
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster),
                  [("h", Hello(node="cpu-1", labels={"pool": "cpu"}))], now=plane.now())
    assert (condition(other)["status"], condition(other)["reason"]) == ("True", NONE_REQUIRED)


def test_a_refused_write_on_the_node_never_fails_the_hello(plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # Given an install older than the condition's RBAC: the status patch is refused
    never_job(plane, "torch", IMAGE)
    node = joins(plane, "gpu-1")

    def refused(name: str, patch: Any) -> Any:
        raise ClusterAuthError('nodes "gpu-1" is forbidden: cannot patch resource "nodes/status"', status=403)

    monkeypatch.setattr(plane.cluster, "patch_node_status", refused)
    outcome = hello(plane, "gpu-1", images=[IMAGE])

    # Then the hello is applied, the taint removed, and the agent still sent its list
    assert outcome.retry_ids == [] and outcome.hellos[0].boot is not None
    assert "prewarm.dev/warming" not in taint_keys(node)
    assert [m.kind for m in plane.node_messages("gpu-1")] .count("required") == 1


def test_get_nodes_shows_the_boot_count_and_the_condition(plane: ControlPlane) -> None:
    never_job(plane, "torch", IMAGE)
    never_job(plane, "tokenizer", SECOND)
    joins(plane, "gpu-1")
    hello(plane, "gpu-1", images=[IMAGE])
    now = plane.now()

    view = view_nodes(plane.store, plane.cluster, now=now, grace=60)
    header, row = nodes_table(view.nodes, now=now).splitlines()
    assert row[header.index("BOOT"):].split()[:2] == ["1/2", PULLING]
    (state,) = view.nodes
    document = node_document(state, now=now)["status"]
    assert document["boot"]["present"] == [IMAGE] and document["warmCondition"]["reason"] == PULLING


def test_a_batch_of_first_hellos_reads_the_agents_configmap_once_and_each_node_once(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given three tainted nodes that join with every image of their Never job
    never_job(plane, "torch", IMAGE)
    nodes = [joins(plane, f"gpu-{i}") for i in range(3)]
    node_reads = recorded_reads(plane.cluster)
    object_reads: list[str] = []
    get_object = plane.cluster.get_object

    def reading(api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        object_reads.append(plural)
        return get_object(api_version, plural, name, namespace)

    monkeypatch.setattr(plane.cluster, "get_object", reading)

    # When their first hellos come in one batch
    now = plane.now()
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [
        (f"h{i}", Hello(node=f"gpu-{i}", labels={"pool": "gpu"}, images=[IMAGE], warm_until=now + 900))
        for i in range(3)], now=now)

    # Then each loses its taint, from one read of its Node and one of the agents' ConfigMap for them all
    assert outcome.retry_ids == [] and [taint_keys(n) for n in nodes] == [["nvidia.com/gpu"]] * 3
    assert sorted(node_reads) == ["gpu-0", "gpu-1", "gpu-2"] and object_reads.count("configmaps") == 1



def test_an_unreadable_agents_configmap_leaves_the_taint_to_the_agent_and_the_others_their_condition(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a node to release and one missing its image, in one batch, and the agents' ConfigMap refused
    never_job(plane, "torch", IMAGE)
    warm, cold = joins(plane, "gpu-1"), joins(plane, "gpu-2")
    get_object = plane.cluster.get_object

    def refusing(api_version: str, plural: str, name: str, namespace: str | None = None) -> Any:
        if plural == "configmaps":
            raise ClusterAuthError('configmaps "prewarm-agent" is forbidden', status=403)
        return get_object(api_version, plural, name, namespace)

    monkeypatch.setattr(plane.cluster, "get_object", refusing)
    now = plane.now()
    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [
        ("h1", Hello(node="gpu-1", labels={"pool": "gpu"}, images=[IMAGE], warm_until=now + 900)),
        ("h2", Hello(node="gpu-2", labels={"pool": "gpu"}, images=[], warm_until=now + 900))], now=now)

    # Then both hellos are applied; the first keeps its taint for its agent, unjudged; the other is Pulling
    assert outcome.retry_ids == [] and "prewarm.dev/warming" in taint_keys(warm)
    assert CONDITION_TYPE not in [c["type"] for c in warm.get("status", {}).get("conditions", [])]
    assert condition(cold)["reason"] == PULLING

def test_a_warmed_sets_the_condition_without_reading_the_registration_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    never_job(plane, "torch", IMAGE)
    node = joins(plane, "gpu-1")
    hello(plane, "gpu-1", images=[])
    reads: list[str] = []
    get_node = plane.store.get_node

    def reading(name: str, cluster: str = "") -> Any:
        reads.append(name)
        return get_node(name, cluster)

    monkeypatch.setattr(plane.store, "get_node", reading)
    now = plane.now()
    warmed = Warmed(node="gpu-1", joined_at=now - 30, hello_at=now - 20, warm_at=now, outcome="warm")
    record_status(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), [("w", warmed)], now=now)

    # The write of the warm-up returns the registration (its images at boot): no read after it
    assert reads == []
    assert condition(node)["message"] == "all 1 image required present (0 present at boot)"


def test_a_batch_of_warm_ups_and_hellos_of_a_registered_cluster_looks_the_cluster_up_once(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given three nodes of a registered cluster, their agents' hellos recorded
    plane.store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    prod = FakeCluster(nodes=[make_node(f"p-{i}", pool="gpu") for i in range(3)])
    clusters = clusters_of(plane.store, registered={"prod-eu": prod})
    now = plane.now()
    record_status(plane.store, plane.queues, clusters,
                  [(f"h{i}", Hello(node=f"p-{i}", cluster="prod-eu", warm_until=now + 900)) for i in range(3)], now=now)
    reads: list[str] = []
    get_cluster = plane.store.get_cluster

    def reading(name: str) -> Any:
        reads.append(name)
        return get_cluster(name)

    monkeypatch.setattr(plane.store, "get_cluster", reading)

    # When one batch holds two of their warm-ups and a hello
    warm_ups = [(f"w{i}", Warmed(node=f"p-{i}", cluster="prod-eu", joined_at=now - 30, hello_at=now - 20, warm_at=now,
                                 outcome="warm")) for i in range(2)]
    outcome = record_status(plane.store, plane.queues, clusters,
                            [*warm_ups, ("h", Hello(node="p-2", cluster="prod-eu"))], now=now)

    # Then each is applied, its condition set, and the cluster's item read once to know it is served and once
    # for its API, not once more per message
    assert outcome.retry_ids == [] and outcome.warmed == ["p-0", "p-1"] and len(outcome.hellos) == 1
    assert [condition(prod.nodes[i])["reason"] for i in range(2)] == [PULLED, PULLED]
    assert reads == ["prod-eu", "prod-eu"]


def test_a_warm_node_loses_its_taint_while_its_queue_is_still_being_made(plane: ControlPlane,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a Never job and a tainted node with its image at boot, whose queue SQS does not make now
    never_job(plane, "torch", IMAGE)
    node = joins(plane, "gpu-1")

    def refused(node: str, cluster: str | None = None) -> Any:
        raise NodeQueueError("SQS is throttling CreateQueue")

    monkeypatch.setattr(plane.queues, "provide_queue", refused)

    # When its first hello comes
    outcome = hello(plane, "gpu-1", images=[IMAGE])

    # Then its taint is released all the same (the release waits on no queue), and the hello comes again for
    # its queue
    assert outcome.retry_ids == ["h"]
    assert taint_keys(node) == ["nvidia.com/gpu"] and condition(node)["reason"] == PRESENT_AT_BOOT
