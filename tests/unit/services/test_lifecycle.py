"""Ending a job sends its nodes `ReleaseImage` (unpin, remove after the grace period) where no other live job
wants the same image; a push retires the digests beyond its rule's `keepDigests`; footprints are stored."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.jobs import PIN_ANNOTATION, JobState, job_key
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.messages import CancelTask, Footprint, ReleaseImage, RemovedImage
from prewarm.domain.nodes import NodeFootprint, RegisteredNode
from prewarm.domain.push import ImagePush
from prewarm.domain.rules import KEEP_DIGESTS_MAX
from prewarm.services.jobs import apply_manifest, complete_deletion, request_deletion
from prewarm.services.lifecycle import record_footprint
from prewarm.services.push import handle_push
from prewarm.services.schedules import SweepSettings, sweep
from prewarm.services.status_batches import record_status
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import IMAGE, job_doc

NODES = ["node-a", "node-b", "node-c"]


def pinned_job(name: str, nodes: list[str], *, image: str = IMAGE, pin: bool = True, **spec: Any) -> dict[str, Any]:
    doc = job_doc(name, image=image, parallelism=len(nodes), selector={"names": nodes}, **spec)
    if pin:
        doc["metadata"]["annotations"] = {PIN_ANNOTATION: "true"}
    return doc


def warm(plane: ControlPlane, doc: dict[str, Any], *, image_id: str = "sha256:" + "c" * 64,
         failed: tuple[str, ...] = ()) -> None:
    """Applies and plans the job, and reports each of its nodes Succeeded (or Failed)."""
    apply_manifest(plane.store, doc, now=plane.now())
    name = doc["metadata"]["name"]
    plane.plan(name)
    for node in doc["spec"]["selector"]["names"]:
        plane.node_messages(node)
        if node in failed:
            plane.report(name, node, "Failed", message="boom")
        else:
            plane.report(name, node, "Succeeded", image_id=image_id)


def releases(plane: ControlPlane, nodes: list[str]) -> dict[str, list[ReleaseImage]]:
    got = {n: [m for m in plane.node_messages(n) if isinstance(m, ReleaseImage)] for n in nodes}
    return {n: m for n, m in got.items() if m}


def delete(plane: ControlPlane, name: str) -> None:
    request_deletion(plane.store, "default", name, now=plane.now())
    plane.finish_deletions()


def test_deleting_a_pinned_job_releases_its_image_on_every_node_where_it_succeeded(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job whose pull succeeded on two nodes and failed on the third
    warm(plane, pinned_job("pinned", NODES), failed=("node-c",))

    # When it is deleted
    delete(plane, "pinned")

    # Then the two nodes that have the image are told to release it, naming the job and the pulled reference
    sent = releases(plane, NODES)
    assert sorted(sent) == ["node-a", "node-b"]
    assert {(m.job, m.image) for ms in sent.values() for m in ms} == {("default/pinned", IMAGE)}


def test_an_unpinned_job_releases_nothing(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    warm(plane, pinned_job("plain", NODES, pin=False))
    delete(plane, "plain")
    assert releases(plane, NODES) == {}


def test_another_live_pinned_job_of_the_same_image_keeps_the_pin_on_its_nodes_only(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given two pinned jobs of one image: one on every node, one on node-b only
    warm(plane, pinned_job("everywhere", NODES))
    warm(plane, pinned_job("b-only", ["node-b"]))

    # When the first is deleted, only node-b keeps its pin
    delete(plane, "everywhere")
    assert sorted(releases(plane, NODES)) == ["node-a", "node-c"]

    # ... and when the second goes too, node-b is released
    delete(plane, "b-only")
    assert sorted(releases(plane, NODES)) == ["node-b"]


def test_the_same_image_under_another_name_keeps_the_pin(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    # Given two pinned jobs whose references differ but whose pulls reported the same image id
    warm(plane, pinned_job("by-tag", NODES[:1], image="registry.example/app:v1"))
    warm(plane, pinned_job("by-other-tag", NODES[:1], image="registry.example/app:stable"))
    # When one is deleted, the image stays pinned: a pin is on every name of the image at once
    delete(plane, "by-tag")
    assert releases(plane, NODES[:1]) == {}


def test_an_unpinned_job_of_the_same_image_does_not_keep_the_pin(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    warm(plane, pinned_job("pinned", NODES[:1]))
    warm(plane, pinned_job("plain", NODES[:1], pin=False))
    delete(plane, "pinned")
    assert sorted(releases(plane, NODES[:1])) == ["node-a"]


def test_a_pinned_job_in_flight_is_sent_its_cancels_and_its_releases(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:2]]
    apply_manifest(plane.store, pinned_job("pinned", NODES[:2]), now=plane.now())
    plane.plan("pinned")
    for node in NODES[:2]:
        plane.node_messages(node)
    plane.report("pinned", "node-a", "Succeeded")
    plane.report("pinned", "node-b", "Pulling")
    delete(plane, "pinned")
    assert [type(m) for m in plane.node_messages("node-a")] == [ReleaseImage]
    assert [type(m) for m in plane.node_messages("node-b")] == [CancelTask]


def test_a_pinned_job_past_its_ttl_is_released_by_the_sweep(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    warm(plane, pinned_job("pinned", NODES[:1], completionPolicy={"type": "Always", "ttlSecondsAfterFinished": 60}))
    record = plane.store.get_job("default/pinned")
    assert record is not None and record.ttl is not None
    assert sweep(plane.store, plane.queues, clusters_of(plane.store), now=record.ttl + 1,
                 config=SweepSettings(prefix="pw")).expired == ["default/pinned"]
    assert sorted(releases(plane, NODES[:1])) == ["node-a"]


# --- removal after the grace period ------------------------------------------------------------------


def delete_with_grace(plane: ControlPlane, name: str, grace: int | None) -> None:
    request_deletion(plane.store, "default", name, now=plane.now())
    complete_deletion(plane.store, plane.queues, f"default/{name}", remove_after=grace)


def test_a_deleted_jobs_image_no_other_job_wants_is_released_for_removal_after_the_grace(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:2]]
    # Given an unpinned job on two nodes, and another job of the same image on the second
    warm(plane, pinned_job("gone", NODES[:2], pin=False))
    warm(plane, pinned_job("stays", NODES[1:2], pin=False))

    delete_with_grace(plane, "gone", 60)

    # Then only the first node is told to remove it, 60 s from now, and to unpin nothing (it was not pinned)
    sent = releases(plane, NODES[:2])
    assert sorted(sent) == ["node-a"]
    assert [(m.unpin, m.remove_after) for m in sent["node-a"]] == [(False, 60)]


def test_an_unpinned_job_keeps_a_pinned_jobs_image_but_not_its_pin(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    warm(plane, pinned_job("pinned", NODES[:1]))
    warm(plane, pinned_job("plain", NODES[:1], pin=False))
    delete_with_grace(plane, "pinned", 60)
    assert [(m.unpin, m.remove_after) for m in releases(plane, NODES[:1])["node-a"]] == [(True, None)]


def test_without_a_grace_period_an_unpinned_jobs_deletion_sends_nothing(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    warm(plane, pinned_job("plain", NODES[:1], pin=False))
    delete_with_grace(plane, "plain", None)
    assert releases(plane, NODES[:1]) == {}


# --- superseded digests --------------------------------------------------------------------------------


def push(plane: ControlPlane, digest: str, tag: str | None = "v1") -> str:
    (applied,) = handle_push(plane.store, None, ImagePush(account="123456789012", region="us-west-2",
                                                           repository="ml/model", digest="sha256:" + digest * 64,
                                                           tag=tag), now=plane.now())
    return f"{applied.namespace}/{applied.name}"


def rule(keep: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"repositories": ["ml/*"]}
    if keep is not None:
        spec["keepDigests"] = keep
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "models"},
            "spec": spec}


def deleting(plane: ControlPlane) -> list[str]:
    return sorted(r.key for r in plane.store.list_jobs() if r.state is JobState.DELETING)


def test_a_push_deletes_the_jobs_of_digests_beyond_the_rules_keep_digests(plane: ControlPlane) -> None:
    apply_manifest(plane.store, rule(keep=1), now=plane.now())
    first, second = push(plane, "a"), push(plane, "b")
    assert deleting(plane) == []  # one earlier digest kept
    push(plane, "c")
    assert deleting(plane) == [first]
    push(plane, "c")  # the same digest again supersedes nothing more
    assert deleting(plane) == [first]
    assert second not in deleting(plane)


def test_keep_digests_zero_retires_every_earlier_digest_and_other_tags_are_left_alone(plane: ControlPlane) -> None:
    doc = rule(keep=0)
    doc["spec"]["includeUntagged"] = True
    apply_manifest(plane.store, doc, now=plane.now())
    other_tag, untagged = push(plane, "d", tag="v2"), push(plane, "e", tag=None)
    first = push(plane, "a")
    push(plane, "b")
    push(plane, "f", tag=None)  # an untagged push supersedes nothing
    assert deleting(plane) == [first]
    assert other_tag not in deleting(plane) and untagged not in deleting(plane)


def test_the_default_keeps_one_earlier_digest(plane: ControlPlane) -> None:
    apply_manifest(plane.store, rule(keep=None), now=plane.now())
    first = push(plane, "a")
    push(plane, "b")
    push(plane, "c")
    assert deleting(plane) == [first]


def test_a_push_to_several_clusters_lists_the_jobs_once_and_an_untagged_push_never(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a rule keeping no earlier digest (untagged pushes too), and three clusters served (the stack's own
    # and two registered)
    doc = rule(keep=0)
    doc["spec"]["includeUntagged"] = True
    apply_manifest(plane.store, doc, now=plane.now())
    for name in ("eu", "west"):
        plane.store.put_cluster(RegisteredCluster(name, endpoint=f"https://{name}.example"))
    clusters = clusters_of(plane.store, own_name="home")
    listed = plane.store.list_jobs
    lists: list[int] = []
    monkeypatch.setattr(plane.store, "list_jobs", lambda: lists.append(1) or listed())

    def push_to_all(digest: str, tag: str | None = "v1") -> None:
        handle_push(plane.store, None, ImagePush(account="123456789012", region="us-west-2", repository="ml/model",
                                                 digest="sha256:" + digest * 64, tag=tag),
                    now=plane.now(), clusters=clusters)

    # When two digests of the tag are pushed
    push_to_all("a")
    lists.clear()
    push_to_all("b")

    # Then the second push retired the first's job in each cluster, the jobs listed once for all three
    assert len(lists) == 1
    assert deleting(plane) == sorted(job_key("default", "models-" + "a" * 12, c) for c in ("", "eu", "west"))
    # ... and an untagged push, which supersedes nothing, does not list them
    lists.clear()
    push_to_all("c", tag=None)
    assert lists == [] and plane.store.get_job(job_key("default", "models-" + "c" * 12, "eu")) is not None


def test_keep_digests_must_be_a_count_in_range(plane: ControlPlane) -> None:
    with pytest.raises(JobValidationError, match=r"spec\.keepDigests"):
        apply_manifest(plane.store, rule(keep=-1), now=plane.now())
    with pytest.raises(JobValidationError, match=r"spec\.keepDigests"):
        apply_manifest(plane.store, rule(keep=KEEP_DIGESTS_MAX + 1), now=plane.now())


# --- footprint -------------------------------------------------------------------------------------------


def test_a_footprint_is_stored_on_its_node_and_an_older_one_changes_nothing(plane: ControlPlane) -> None:
    plane.store.put_node(RegisteredNode(name="node-a", labels={}, architecture="amd64", os="linux", queue_url="q",
                                        last_hello=1.0))
    removed = RemovedImage(image="r/a:v1", image_id="sha256:" + "c" * 64, bytes_freed=2048, removed_at=9.0)
    newer = Footprint(node="node-a", at=10.0, images=2, bytes=4096, freed_bytes=2048, removed=[removed])
    older = Footprint(node="node-a", at=5.0, images=3, bytes=6144, freed_bytes=0)

    outcome = record_status(plane.store, plane.queues, clusters_of(plane.store),
                            [("m1", newer), ("m2", older)], now=plane.now())

    assert outcome.footprints == ["node-a"] and outcome.retry_ids == []
    node = plane.store.get_node("node-a")
    assert node is not None and node.footprint == NodeFootprint(images=2, bytes=4096, freed_bytes=2048, at=10.0)
    # a node never registered: nothing stored, nothing retried
    assert record_footprint(plane.store, newer.model_copy(update={"node": "node-z"})) is False
