"""A job with no layer count (applied by hand, not from an ECR push) has its image's layers read from ECR,
in the image's Region, at its plan and kept on the job, so its pulls take their true share of the registry's
budget; when the count stays unknown (another registry, or no answer), its message says what its registry's
budget costs each pull at, which `layersIfUnknown` sets per registry (before: an image in another Region, or
of another registry, was costed at 30 layers, silently)."""

from __future__ import annotations

from dataclasses import replace

from prewarm.domain.jobs import job_key
from prewarm.domain.registry_budget import RegistryBudget, RegistryBudgets
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.stream import plan
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.images import LayerCounts
from tests.support.manifests import job_doc

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/model:v1"


def _plan(plane: ControlPlane, image: str, images: LayerCounts, budgets: RegistryBudgets | None = None) -> None:
    plane.cluster.nodes.append(make_node("ip-10-0-1-1"))
    plane.queues.ensure_queue("ip-10-0-1-1")
    apply_manifest(plane.store, job_doc("by-hand", image=image), now=plane.now())
    plan(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), job_key("default", "by-hand"),
         now=plane.now(), images=images, budgets=budgets)


def test_a_hand_applied_ecr_job_gets_its_image_s_layer_count_at_its_plan(plane: ControlPlane) -> None:
    images = LayerCounts(layers=7)
    _plan(plane, ECR_IMAGE, images)
    assert images.asked == [("123456789012", "ml/model", "v1")] and images.regions == ["us-west-2"]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers == 7 and record.pull_task("ip-10-0-1-1").layers == 7
    assert "layer count" not in view_job(plane.store, "default", "by-hand", now=plane.now()).message


def test_an_image_in_another_region_has_its_layers_read_in_that_region(plane: ControlPlane) -> None:
    images = LayerCounts(layers=4)
    _plan(plane, "123456789012.dkr.ecr.eu-west-1.amazonaws.com/ml/model:v1", images)
    assert images.regions == ["eu-west-1"]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers == 4


def test_an_ecr_layer_count_that_cannot_be_read_costs_the_default_and_the_job_says_so(plane: ControlPlane) -> None:
    images = LayerCounts(layers=None)
    _plan(plane, ECR_IMAGE, images)
    assert images.asked == [("123456789012", "ml/model", "v1")]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers is None
    message = view_job(plane.store, "default", "by-hand", now=plane.now()).message
    assert "layer count assumed 30 for host 123456789012.dkr.ecr.us-west-2.amazonaws.com" in message


def test_another_registry_s_image_costs_its_registry_s_assumed_count_and_the_job_says_so(plane: ControlPlane) -> None:
    images = LayerCounts(layers=None)
    budgets = RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"layersIfUnknown": 8}})
    _plan(plane, "ghcr.io/org/app:v1", images, budgets)
    assert images.asked == []  # not an ECR image: the control plane does not fetch its manifest
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.layers is None
    message = view_job(plane.store, "default", "by-hand", now=plane.now()).message
    assert "layer count assumed 8 for host ghcr.io in its registry's budget" in message


def test_a_registry_without_a_budget_costs_nothing_and_the_job_says_nothing_of_layers(plane: ControlPlane) -> None:
    budgets = RegistryBudgets.parse(RegistryBudget(), {"ghcr.io": {"requestsPerSecond": 0}})
    _plan(plane, "ghcr.io/org/app:v1", LayerCounts(layers=None), budgets)
    assert "layer count" not in view_job(plane.store, "default", "by-hand", now=plane.now()).message


def test_under_a_byte_budget_the_plan_reads_the_image_s_bytes_and_its_tasks_carry_them(plane: ControlPlane) -> None:
    # Given a budget that counts bytes: the image's compressed bytes are read at the plan, kept on the job and
    # sent with each task (a pull's share of the byte budget, and the agents' disk guard)
    images = LayerCounts(layers=7, size=3_000_000_000)
    _plan(plane, ECR_IMAGE, images, RegistryBudgets(RegistryBudget(bytes_per_second=500e6)))
    assert images.sized == [("123456789012", "ml/model", "v1")]
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.image_bytes == 3_000_000_000
    assert record.pull_task("ip-10-0-1-1").size_bytes == 3_000_000_000
    (sent,) = plane.node_messages("ip-10-0-1-1")
    assert sent.size_bytes == 3_000_000_000  # type: ignore[union-attr]


def test_without_a_byte_budget_the_image_s_bytes_are_not_asked_and_a_new_image_forgets_them(
        plane: ControlPlane) -> None:
    images = LayerCounts(layers=7, size=3_000_000_000)
    _plan(plane, ECR_IMAGE, images)
    assert images.sized == []
    record = plane.store.get_job(job_key("default", "by-hand"))
    assert record is not None and record.image_bytes is None and record.pull_task("n").size_bytes is None
    sized = replace(record, image_bytes=5)
    other = job_doc("by-hand", image=ECR_IMAGE.replace(":v1", ":v2"))
    changed = sized.respecified(other, "h2", now=plane.now(), platforms=None)
    assert (changed.image_bytes, changed.layers) == (None, None)
    assert sized.respecified(job_doc("by-hand", image=ECR_IMAGE, parallelism=3), "h3", now=plane.now(),
                             platforms=None).image_bytes == 5
