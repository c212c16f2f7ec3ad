"""A job with no layer count (applied by hand, not from an ECR push) has its image's layers read from ECR
at its plan and kept on the job, so its pulls take their true share of the registry's budget; when ECR cannot
say (another registry, or no answer), its message says its pulls are costed at the default (before: every
such job was costed at 30 layers, silently)."""

from __future__ import annotations

from prewarm.domain.jobs import job_key
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.stream import plan
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.images import LayerCounts
from tests.support.manifests import job_doc

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/model:v1"


def _plan(plane: ControlPlane, image: str, images: LayerCounts) -> None:
    plane.cluster.nodes.append(make_node("ip-10-0-1-1"))
    plane.queues.ensure_queue("ip-10-0-1-1")
    apply_manifest(plane.store, job_doc("by-hand", image=image), now=plane.now())
    plan(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), job_key("default", "by-hand"),
         now=plane.now(), images=images)


def test_a_hand_applied_ecr_job_gets_its_image_s_layer_count_at_its_plan(plane: ControlPlane) -> None:
    images = LayerCounts(layers=7)
    _plan(plane, ECR_IMAGE, images)
    assert images.asked == [("123456789012", "ml/model", "v1")]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers == 7 and record.pull_task("ip-10-0-1-1").layers == 7
    assert "layer count" not in view_job(plane.store, "default", "by-hand", now=plane.now()).message


def test_an_ecr_layer_count_that_cannot_be_read_costs_the_default_and_the_job_says_so(plane: ControlPlane) -> None:
    images = LayerCounts(layers=None)
    _plan(plane, ECR_IMAGE, images)
    assert images.asked == [("123456789012", "ml/model", "v1")]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers is None
    message = view_job(plane.store, "default", "by-hand", now=plane.now()).message
    assert f"layer count of {ECR_IMAGE} unknown: each pull is costed at 30 layers" in message


def test_another_registrys_image_costs_the_default_without_a_note(plane: ControlPlane) -> None:
    images = LayerCounts(layers=None)
    _plan(plane, "ghcr.io/org/app:v1", images)
    assert images.asked == []  # not an ECR image: nothing to ask
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers is None
    assert "layer count" not in view_job(plane.store, "default", "by-hand", now=plane.now()).message
