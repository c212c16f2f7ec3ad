"""A push's job knows its image's layer count, read from ECR, so each pull takes its share of the
registry's budget; its tasks carry it to the pacing of their sends."""

from __future__ import annotations

from prewarm.domain.push import ImagePush
from prewarm.services.jobs import apply_manifest
from prewarm.services.push import handle_push
from tests.support.control_plane import ControlPlane
from tests.support.images import LayerCounts

PUSH = ImagePush(account="123456789012", region="us-west-2", repository="ml/model", digest="sha256:" + "a" * 64,
                 tag="v1")
RULE = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "models"},
        "spec": {"repositories": ["ml/*"]}}


def test_a_pushed_image_s_layer_count_goes_onto_its_job_and_tasks(plane: ControlPlane) -> None:
    apply_manifest(plane.store, RULE, now=plane.now())
    images = LayerCounts(layers=30)

    (applied,) = handle_push(plane.store, images, PUSH, now=plane.now())

    assert images.asked == [("123456789012", "ml/model", PUSH.digest)]
    record = plane.store.get_job(f"{applied.namespace}/{applied.name}")
    assert record is not None and record.layers == 30
    assert record.pull_task("n1").layers == 30
    assert "layers" not in record.pull_task("n1").model_dump_json()  # never sent: agents refuse unknown fields


def test_a_layer_count_ecr_cannot_give_leaves_the_job_without_one_and_a_later_count_updates_it(
    plane: ControlPlane,
) -> None:
    apply_manifest(plane.store, RULE, now=plane.now())
    (applied,) = handle_push(plane.store, LayerCounts(layers=None), PUSH, now=plane.now())
    key = f"{applied.namespace}/{applied.name}"
    record = plane.store.get_job(key)
    assert record is not None and record.layers is None

    (again,) = handle_push(plane.store, LayerCounts(layers=12), PUSH, now=plane.now())

    record = plane.store.get_job(key)
    assert again.outcome == "configured" and record is not None and record.layers == 12
    assert record.round == 0  # the same image: the job is re-planned, not pulled again
