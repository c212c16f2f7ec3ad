"""A job whose image changes on a new apply lets go of the earlier image on its earlier round's nodes, as a
deletion would (unpinned, removed after the grace period unless another live job, or the job's new image,
wants it), whether applied with the CLI or as a resource; a list job that drops an image does the same."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prewarm.domain.jobs import PIN_ANNOTATION, job_key
from prewarm.domain.lifecycle import pin_dropped
from prewarm.domain.messages import PullTask, ReleaseImage
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm.services.lifecycle import release_pin
from prewarm.services.resources import sync_resources
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc
from tests.support.resources import FakeResources

NODES = ["node-a", "node-b"]
V1, V2 = "registry.example/app:v1", "registry.example/app:v2"
V1_ID, V2_ID = "sha256:" + "1" * 64, "sha256:" + "2" * 64
GRACE = 600


def job(name: str, image: str, nodes: list[str], *, pin: bool = True) -> dict[str, Any]:
    doc = job_doc(name, image=image, parallelism=len(nodes), selector={"names": nodes})
    if pin:
        doc["metadata"]["annotations"] = {PIN_ANNOTATION: "true"}
    return doc


def succeed(plane: ControlPlane, name: str, nodes: list[str], image_id: str) -> None:
    plane.plan(name, remove_after=GRACE)
    for node in nodes:
        plane.node_messages(node)
        plane.report(name, node, "Succeeded", image_id=image_id)


def sent(plane: ControlPlane, nodes: list[str]) -> dict[str, list[Any]]:
    got = {n: plane.node_messages(n) for n in nodes}
    return {n: [(type(m).__name__, m.image) if isinstance(m, ReleaseImage | PullTask) else type(m).__name__
                for m in ms] for n, ms in got.items() if ms}


def released(plane: ControlPlane, nodes: list[str]) -> dict[str, list[tuple[str, bool, int | None]]]:
    got = {n: [(m.image, m.unpin, m.remove_after) for m in plane.node_messages(n) if isinstance(m, ReleaseImage)]
           for n in nodes}
    return {n: ms for n, ms in got.items() if ms}


def test_a_new_image_releases_the_earlier_one_on_its_nodes_at_the_new_rounds_plan(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job whose v1 pull succeeded on both nodes
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)

    # When it is applied again with v2 and planned
    apply_manifest(plane.store, job("web", V2, NODES), now=plane.now())
    plane.plan("web", remove_after=GRACE)

    # Then each node is told to unpin v1 and remove it after the grace period, and to pull v2
    assert sent(plane, NODES) == {n: [("ReleaseImage", V1), ("PullTask", V2)] for n in NODES}
    # ... once: the earlier round is gone with its node items, and the job holds no earlier image
    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and record.earlier is None
    plane.plan("web", remove_after=GRACE)
    assert released(plane, NODES) == {}


def test_the_release_unpins_and_removes_after_the_grace(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    succeed(plane, "web", NODES[:1], V1_ID)
    apply_manifest(plane.store, job("web", V2, NODES[:1]), now=plane.now())
    plane.plan("web", remove_after=GRACE)
    assert released(plane, NODES[:1]) == {"node-a": [(V1, True, GRACE)]}


def test_another_live_job_of_the_earlier_image_keeps_it_where_it_wants_it(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job of v1 on both nodes, and another pinned job of v1 on node-b
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)
    apply_manifest(plane.store, job("other", V1, NODES[1:]), now=plane.now())
    succeed(plane, "other", NODES[1:], V1_ID)

    # When the first moves to v2, only node-a lets v1 go
    apply_manifest(plane.store, job("web", V2, NODES), now=plane.now())
    plane.plan("web", remove_after=GRACE)
    assert released(plane, NODES) == {"node-a": [(V1, True, GRACE)]}


def test_a_new_tag_of_the_same_image_is_not_released_where_the_job_pulled_it(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    succeed(plane, "web", NODES[:1], V1_ID)
    # the job moves back and forth before its next plan: its nodes still hold v1, which it wants again
    apply_manifest(plane.store, job("web", V2, NODES[:1]), now=plane.now())
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    plane.plan("web", remove_after=GRACE)
    assert released(plane, NODES[:1]) == {}


def test_a_change_that_keeps_the_image_releases_nothing(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    succeed(plane, "web", NODES[:1], V1_ID)
    changed = job("web", V1, NODES[:1])
    changed["spec"]["pullPolicy"] = {"timeoutSeconds": 300}  # a new round, the same image
    apply_manifest(plane.store, changed, now=plane.now())
    plane.plan("web", remove_after=GRACE)
    assert released(plane, NODES[:1]) == {}


def test_a_deletion_before_the_new_rounds_plan_releases_the_earlier_image(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    succeed(plane, "web", NODES[:1], V1_ID)
    apply_manifest(plane.store, job("web", V2, NODES[:1]), now=plane.now())
    # deleted before the stream planned v2: the node items still say v1
    from prewarm.services.jobs import complete_deletion, request_deletion

    request_deletion(plane.store, "default", "web", now=plane.now())
    complete_deletion(plane.store, plane.queues, "default/web", remove_after=GRACE)
    assert released(plane, NODES[:1]) == {"node-a": [(V1, True, GRACE)]}


def test_a_resources_new_image_releases_the_earlier_one(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    api = FakeResources()
    spec = {"parallelism": 1, "selector": {"names": NODES[:1]}}
    api.put("ImagePullJob", "web", {"image": V1, **spec}, annotations={PIN_ANNOTATION: "true"})
    sync_resources(plane.store, api, now=plane.now())
    succeed(plane, "web", NODES[:1], V1_ID)

    api.put("ImagePullJob", "web", {"image": V2, **spec}, annotations={PIN_ANNOTATION: "true"})
    sync_resources(plane.store, api, now=plane.now())
    plane.plan("web", remove_after=GRACE)

    assert released(plane, NODES[:1]) == {"node-a": [(V1, True, GRACE)]}


def test_a_list_job_that_drops_an_image_releases_it(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    spec = {"parallelism": 1, "selector": {"names": NODES[:1]}}
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
           "metadata": {"name": "list", "namespace": "default", "annotations": {PIN_ANNOTATION: "true"}},
           "spec": {"images": [V1], **spec}}
    applied = apply_manifest(plane.store, doc, now=plane.now())
    (child,) = applied.children
    succeed(plane, child.name, NODES[:1], V1_ID)

    doc["spec"]["images"] = [V2]
    apply_manifest(plane.store, doc, now=plane.now())
    plane.finish_deletions()  # the stream's deletion of the child of v1

    assert [(m.image, m.unpin) for m in plane.node_messages("node-a") if isinstance(m, ReleaseImage)] == [(V1, True)]


def test_a_node_the_selector_no_longer_holds_lets_the_image_go(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job of v1 that succeeded on both nodes
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)

    # When it is applied again naming node-a only (the same round: nothing of the pull changed)
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    plane.plan("web", remove_after=GRACE)

    # Then node-b is told to unpin v1 and remove it after the grace period; node-a keeps it
    assert released(plane, NODES) == {"node-b": [(V1, True, GRACE)]}


def test_a_dropped_node_keeps_the_image_another_live_job_wants_there(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)
    apply_manifest(plane.store, job("other", V1, NODES[1:], pin=False), now=plane.now())
    succeed(plane, "other", NODES[1:], V1_ID)

    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    plane.plan("web", remove_after=GRACE)

    # Then node-b unpins (the other job does not pin) but keeps v1: the other job wants it
    assert released(plane, NODES) == {"node-b": [(V1, True, None)]}


def test_a_new_round_of_the_same_image_lets_it_go_on_the_nodes_it_drops(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    apply_manifest(plane.store, job("web", V1, NODES, pin=False), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)

    # When a new round (a new pull policy) names node-a only
    changed = job("web", V1, NODES[:1], pin=False)
    changed["spec"]["pullPolicy"] = {"timeoutSeconds": 300}
    apply_manifest(plane.store, changed, now=plane.now())
    plane.plan("web", remove_after=GRACE)

    # Then node-b removes v1 after the grace (nothing to unpin); node-a pulls it again, nothing released
    assert released(plane, NODES) == {"node-b": [(V1, False, GRACE)]}


def test_without_a_grace_or_a_pin_a_dropped_node_is_sent_nothing(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    apply_manifest(plane.store, job("web", V1, NODES, pin=False), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)
    apply_manifest(plane.store, job("web", V1, NODES[:1], pin=False), now=plane.now())
    plane.plan("web", remove_after=None)
    assert released(plane, NODES) == {}


def test_a_pin_removed_from_the_same_image_unpins_it_and_keeps_it(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job of v1 on both nodes, and another pinned job of v1 on node-b
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    succeed(plane, "web", NODES, V1_ID)
    apply_manifest(plane.store, job("other", V1, NODES[1:]), now=plane.now())
    succeed(plane, "other", NODES[1:], V1_ID)
    before = plane.store.get_job(job_key("default", "web"))

    # When the first is applied again without its pin annotation
    apply_manifest(plane.store, job("web", V1, NODES, pin=False), now=plane.now())
    after = plane.store.get_job(job_key("default", "web"))
    assert before is not None and after is not None and pin_dropped(after, before)
    assert release_pin(plane.store, plane.queues, before) == 1

    # Then node-a unpins v1 and keeps it (the job still wants it); node-b stays pinned by the other job
    assert released(plane, NODES) == {"node-a": [(V1, True, None)]}


def test_only_a_removed_pin_of_the_same_planned_image_is_a_dropped_pin(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES[:1]]
    apply_manifest(plane.store, job("web", V1, NODES[:1]), now=plane.now())
    unplanned = plane.store.get_job(job_key("default", "web"))
    succeed(plane, "web", NODES[:1], V1_ID)
    pinned = plane.store.get_job(job_key("default", "web"))
    apply_manifest(plane.store, job("web", V2, NODES[:1], pin=False), now=plane.now())
    other_image = plane.store.get_job(job_key("default", "web"))
    assert pinned is not None and unplanned is not None and other_image is not None
    # a new image (released at its round's plan), a job never planned, a pin kept, no job before
    assert not pin_dropped(other_image, pinned)
    assert not pin_dropped(replace(pinned, manifest=job("web", V1, NODES[:1], pin=False)), unplanned)
    assert not pin_dropped(pinned, pinned) and not pin_dropped(pinned, None)


def test_a_pull_that_pins_after_the_pin_was_dropped_is_unpinned_when_it_ends_and_at_the_jobs_end(
        plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n) for n in NODES]
    # Given a pinned job of v1 whose pull succeeded on node-a and still runs on node-b (its task says pin)
    apply_manifest(plane.store, job("web", V1, NODES), now=plane.now())
    plane.plan("web", remove_after=GRACE)
    assert all(m.pin for n in NODES for m in plane.node_messages(n) if isinstance(m, PullTask))
    plane.report("web", "node-a", "Succeeded", image_id=V1_ID)
    plane.report("web", "node-b", "Pulling")
    before = plane.store.get_job(job_key("default", "web"))

    # When it is applied again without its pin: node-a unpins at once, node-b has nothing pinned yet
    apply_manifest(plane.store, job("web", V1, NODES, pin=False), now=plane.now())
    assert before is not None and release_pin(plane.store, plane.queues, before) == 1
    assert released(plane, NODES) == {"node-a": [(V1, True, None)]}

    # Then node-b, whose pull pinned v1 as it ended, is told to unpin it (and keep it) on its Succeeded
    plane.report("web", "node-b", "Succeeded", image_id=V1_ID)
    assert released(plane, NODES) == {"node-b": [(V1, True, None)]}
    # ... and a later report of the round sends nothing again
    plane.report("web", "node-a", "Succeeded", image_id=V1_ID)
    assert released(plane, NODES) == {}

    # And at the job's end both nodes are told to unpin once more (a lost message unpins there at the latest)
    record = plane.store.get_job(job_key("default", "web"))
    assert record is not None and record.pinned_until == before.round
    request_deletion(plane.store, "default", "web", now=plane.now())
    plane.finish_deletions()
    assert released(plane, NODES) == {n: [(V1, True, None)] for n in NODES}
