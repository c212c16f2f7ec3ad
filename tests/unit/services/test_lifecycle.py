"""Ending a pinned job sends its nodes `ReleaseImage`, unless another live job pins the same image there."""

from __future__ import annotations

from typing import Any

from prewarm.domain.jobs import PIN_ANNOTATION
from prewarm.domain.messages import CancelTask, ReleaseImage
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm.services.schedules import SweepSettings, sweep
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
