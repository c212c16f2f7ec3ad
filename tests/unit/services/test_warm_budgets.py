"""A namespace's warm budget at apply, through the memory store: `prewarm apply`'s path, list jobs trimmed,
rule-made jobs at a push, and resources through the sync (which copies the Namespaces' budgets)."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.push import ImagePush
from prewarm.domain.warm_budgets import BudgetPolicy, ImageCost, WarmBudget, WarmBudgetExceededError
from prewarm.services.cron_jobs import run_due
from prewarm.services.jobs import apply_manifest, kruise_status, view_job
from prewarm.services.push import handle_push
from prewarm.services.resources import sync_resources
from prewarm.services.warm_budgets import budget_usage
from tests.support.control_plane import ControlPlane
from tests.support.resources import FakeResources

MIB = 2**20
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"


class Sizes:
    """`ImageSizes` from a table of reference → MiB (absent: unknown); counts what it is asked."""

    def __init__(self, mib: dict[str, int]) -> None:
        self.mib = mib
        self.asked: list[str] = []

    def image_size(self, image: str) -> ImageCost:
        self.asked.append(image)
        if image not in self.mib:
            return ImageCost(image)
        return ImageCost(image, "sha256:" + image.rsplit(":", 1)[-1] * 8, self.mib[image] * MIB)


SIZES = Sizes({f"{ECR}/app:a": 60, f"{ECR}/app:b": 30, f"{ECR}/app:c": 20, f"{ECR}/app:d": 5})


def job(name: str, image: str, *, namespace: str = "team-a", **annotations: str) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"image": f"{ECR}/{image}", "completionPolicy": {"type": "Never"}}}


def list_job(name: str, images: list[str], **annotations: str) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
            "metadata": {"name": name, "namespace": "team-a", "annotations": annotations},
            "spec": {"images": [f"{ECR}/{i}" for i in images]}}


@pytest.fixture
def budget(plane: ControlPlane) -> None:
    plane.store.put_warm_budgets({"team-a": WarmBudget("team-a", 100 * MIB)})


@pytest.mark.usefixtures("budget")
def test_a_job_beyond_its_namespaces_budget_is_refused_naming_the_namespace_budget_and_bytes(
    plane: ControlPlane,
) -> None:
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)

    with pytest.raises(WarmBudgetExceededError) as refused:
        apply_manifest(plane.store, job("web", "app:b"), now=2.0, sizes=Sizes({f"{ECR}/app:b": 41}))

    assert str(refused.value) == (
        "ImagePullJob team-a/web refused: namespace team-a keeps at most 104857600 bytes (100.0 MiB) of images "
        "warm per node; its other jobs keep 62914560 bytes (60.0 MiB) and this job adds 42991616 bytes (41.0 MiB) "
        "(policy Refuse; annotation prewarm.dev/warm-bytes-per-node)")
    assert plane.store.get_job(job_key("team-a", "web")) is None
    apply_manifest(plane.store, job("web", "app:b"), now=2.0, sizes=SIZES)  # 30 MiB fits
    other = apply_manifest(plane.store, job("web", "app:c", namespace="team-b"), now=3.0, sizes=SIZES)
    assert other.outcome == "created"  # another namespace: no budget


@pytest.mark.usefixtures("budget")
def test_a_change_refused_keeps_the_job_accepted_before_and_the_same_spec_is_never_refused_again(
    plane: ControlPlane,
) -> None:
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)
    apply_manifest(plane.store, job("web", "app:b"), now=2.0, sizes=SIZES)
    plane.store.put_warm_budgets({"team-a": WarmBudget("team-a", 70 * MIB)})

    with pytest.raises(WarmBudgetExceededError):
        apply_manifest(plane.store, job("web", "app:c"), now=3.0, sizes=SIZES)

    record = plane.store.get_job(job_key("team-a", "web"))
    assert record is not None and record.pull_reference == f"{ECR}/app:b" and record.warm_bytes == 30 * MIB
    assert apply_manifest(plane.store, job("web", "app:b"), now=4.0, sizes=SIZES).outcome == "unchanged"


@pytest.mark.usefixtures("budget")
def test_a_digest_two_jobs_want_counts_once_and_a_deleting_job_not_at_all(plane: ControlPlane) -> None:
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)

    apply_manifest(plane.store, job("again", "app:a"), now=2.0, sizes=SIZES)  # the same digest: adds nothing
    apply_manifest(plane.store, job("web", "app:b"), now=3.0, sizes=SIZES)

    plane.store.set_job_fields(job_key("team-a", "base"), {"state": JobState.DELETING})
    plane.store.set_job_fields(job_key("team-a", "again"), {"state": JobState.DELETING})
    assert apply_manifest(plane.store, job("more", "app:c"), now=4.0, sizes=SIZES).outcome == "created"


@pytest.mark.usefixtures("budget")
def test_an_image_of_unknown_size_is_applied_and_its_message_says_it_was_not_counted(plane: ControlPlane) -> None:
    applied = apply_manifest(plane.store, job("web", "app:z"), now=1.0, sizes=SIZES)

    note = f"size unknown at apply, not counted against the budget: {ECR}/app:z"
    assert applied.note == note
    assert view_job(plane.store, "team-a", "web", now=2.0).message.endswith(f"; {note}")


def test_a_list_job_under_trim_keeps_its_images_in_order_and_its_status_names_those_trimmed(
    plane: ControlPlane,
) -> None:
    plane.store.put_warm_budgets({"team-a": WarmBudget("team-a", 100 * MIB, BudgetPolicy.TRIM)})
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)

    applied = apply_manifest(plane.store, list_job("tools", ["app:b", "app:c", "app:d"]), now=2.0, sizes=SIZES)

    assert [c.outcome for c in applied.children] == ["created", "created"]
    children = [plane.store.get_job(job_key("team-a", c.name)) for c in applied.children]
    assert [c.pull_reference for c in children if c is not None] == [f"{ECR}/app:b", f"{ECR}/app:d"]
    note = (f"trimmed by namespace team-a's budget of 104857600 bytes (100.0 MiB) per node (policy Trim): "
            f"{ECR}/app:c not pulled; 99614720 bytes (95.0 MiB) kept with this job")
    view = view_job(plane.store, "team-a", "tools", now=3.0)
    assert view.message == f"0/2 images completed; {note}"
    status = kruise_status(view).to_dict()
    assert status["failedImageStatuses"] == [{"imagePullJob": "", "name": f"{ECR}/app:c", "message": note}]
    # Applied again unchanged, the trimmed image does not come back.
    again = apply_manifest(plane.store, list_job("tools", ["app:b", "app:c", "app:d"]), now=4.0, sizes=SIZES)
    assert again.outcome == "unchanged" and len(again.children) == 2


PUSH = ImagePush(account="123456789012", region="us-west-2", repository="app", digest="sha256:" + "e" * 64,
                 tag="v2")
RULE = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "app"},
        "spec": {"repositories": ["app"], "keepDigests": 0,
                 "template": {"metadata": {"namespace": "team-a"}}}}


@pytest.mark.usefixtures("budget")
def test_a_push_job_the_budget_refuses_is_recorded_failed_and_retires_nothing(plane: ControlPlane) -> None:
    apply_manifest(plane.store, RULE, now=1.0)
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)
    pushed = f"{ECR}/app@{PUSH.digest}"

    (applied,) = handle_push(plane.store, None, PUSH, now=2.0, sizes=Sizes({pushed: 50}))

    assert applied.outcome == "refused"
    record = plane.store.get_job(job_key(applied.namespace, applied.name))
    assert record is not None and record.state is JobState.FAILED and not record.is_planned
    assert record.message.startswith(f"ImagePullJob team-a/{applied.name} refused: namespace team-a keeps at most")
    assert plane.store.get_job(job_key("team-a", "base")) is not None
    # It keeps nothing warm: a job that fits is still accepted.
    assert apply_manifest(plane.store, job("web", "app:b"), now=3.0, sizes=SIZES).outcome == "created"


@pytest.mark.usefixtures("budget")
def test_the_digest_a_push_supersedes_does_not_count_against_its_job(plane: ControlPlane) -> None:
    apply_manifest(plane.store, RULE, now=1.0)
    first = ImagePush(account=PUSH.account, region=PUSH.region, repository="app", digest="sha256:" + "f" * 64,
                      tag="v2")
    sizes = Sizes({f"{ECR}/app@{first.digest}": 70, f"{ECR}/app@{PUSH.digest}": 70})
    (old,) = handle_push(plane.store, None, first, now=2.0, sizes=sizes)

    (new,) = handle_push(plane.store, None, PUSH, now=3.0, sizes=sizes)

    assert (old.outcome, new.outcome) == ("created", "created")
    retired = plane.store.get_job(job_key("team-a", old.name))
    assert retired is not None and retired.state is JobState.DELETING


def test_a_resource_beyond_the_budget_is_not_applied_and_its_status_says_why(plane: ControlPlane) -> None:
    api = FakeResources()
    api.put_namespace("team-a", **{"prewarm.dev/warm-bytes-per-node": "100Mi"})
    api.put("ImagePullJob", "base", job("base", "app:a")["spec"], namespace="team-a")
    api.put("ImagePullJob", "web", job("web", "app:b")["spec"] | {"image": f"{ECR}/app:big"}, namespace="team-a")

    report = sync_resources(plane.store, api, now=10.0, sizes=Sizes({**SIZES.mib, f"{ECR}/app:big": 50}))

    assert plane.store.get_warm_budgets() == {"team-a": WarmBudget("team-a", 100 * MIB)}
    assert plane.store.get_job(job_key("team-a", "base")) is not None
    assert plane.store.get_job(job_key("team-a", "web")) is None
    assert [r.split(":")[0] for r in report.refused] == ["ImagePullJob team-a/web"]
    message = api.get("ImagePullJob", "web", "team-a")["status"]["message"]
    assert message.startswith("not applied: ImagePullJob team-a/web refused: namespace team-a keeps at most "
                              "104857600 bytes (100.0 MiB)")


@pytest.mark.usefixtures("budget")
def test_the_usage_shown_is_what_the_namespaces_live_jobs_keep_from_their_stored_sizes(plane: ControlPlane) -> None:
    assert budget_usage(plane.store, "team-b") is None
    apply_manifest(plane.store, job("base", "app:a"), now=1.0, sizes=SIZES)
    apply_manifest(plane.store, job("same", "app:a"), now=1.0, sizes=SIZES)
    apply_manifest(plane.store, job("web", "app:z"), now=2.0, sizes=SIZES)

    assert budget_usage(plane.store, "team-a") == (
        f"namespace team-a: 62914560 bytes (60.0 MiB) of 104857600 bytes (100.0 MiB) per node kept (policy Refuse); "
        f"size unknown: {ECR}/app:z")


def test_a_cron_run_beyond_the_budget_is_skipped_with_the_refusal(plane: ControlPlane) -> None:
    plane.store.put_warm_budgets({"team-a": WarmBudget("team-a", 50 * MIB)})
    template = {"imageListPullJobTemplate": {"spec": {"images": [f"{ECR}/app:a"]}}}
    apply_manifest(plane.store, {"apiVersion": "apps.kruise.io/v1beta1", "kind": "AdvancedCronJob",
                                 "metadata": {"name": "nightly", "namespace": "team-a"},
                                 "spec": {"schedule": "* * * * *", "template": template}}, now=1.0)

    outcome = run_due(plane.store, job_key("team-a", "nightly"), scheduled_at=60.0, now=60.0, sizes=SIZES)

    assert outcome.run == "" and outcome.skipped.startswith(
        "ImageListPullJob team-a/nightly-60 refused: namespace team-a keeps at most 52428800 bytes (50.0 MiB)")
    assert plane.store.get_job(job_key("team-a", "nightly-60")) is None


@pytest.mark.usefixtures("budget")
def test_a_job_changed_while_its_namespace_has_no_budget_keeps_no_size_of_its_old_image(plane: ControlPlane) -> None:
    apply_manifest(plane.store, job("web", "app:a"), now=1.0, sizes=SIZES)
    plane.store.put_warm_budgets({})
    apply_manifest(plane.store, job("web", "app:b"), now=2.0, sizes=SIZES)
    record = plane.store.get_job(job_key("team-a", "web"))
    assert record is not None and (record.warm_digest, record.warm_bytes) == ("", None)

    # The budget back, the job's size is read again where it is counted.
    plane.store.put_warm_budgets({"team-a": WarmBudget("team-a", 100 * MIB)})
    assert budget_usage(plane.store, "team-a") == ("namespace team-a: 0 bytes of 104857600 bytes (100.0 MiB) per "
                                                   f"node kept (policy Refuse); size unknown: {ECR}/app:b")
    with pytest.raises(WarmBudgetExceededError, match="its other jobs keep 31457280 bytes"):
        apply_manifest(plane.store, job("more", "app:x"), now=3.0, sizes=Sizes({**SIZES.mib, f"{ECR}/app:x": 71}))


@pytest.mark.usefixtures("budget")
def test_jobs_naming_disjoint_nodes_are_each_held_to_the_budget_on_their_own_nodes(plane: ControlPlane) -> None:
    def on(name: str, image: str, *nodes: str) -> dict[str, Any]:
        manifest = job(name, image)
        manifest["spec"]["selector"] = {"names": list(nodes)}
        return manifest

    apply_manifest(plane.store, on("gpu", "app:a", "gpu-1", "gpu-2"), now=1.0, sizes=SIZES)  # 60 MiB
    apply_manifest(plane.store, on("cpu", "app:b", "cpu-1"), now=2.0, sizes=SIZES)  # 30 MiB
    apply_manifest(plane.store, on("cpu-2", "app:a", "cpu-1"), now=3.0, sizes=SIZES)  # 60 MiB beside 30 on cpu-1

    with pytest.raises(WarmBudgetExceededError, match=r"on node cpu-1 its other jobs keep 94371840 bytes \(90.0 MiB\)"):
        apply_manifest(plane.store, on("both", "app:c", "gpu-1", "cpu-1"), now=4.0,
                       sizes=Sizes({f"{ECR}/app:c": 41}))


@pytest.mark.usefixtures("budget")
def test_jobs_selecting_pools_no_node_is_in_both_of_are_each_held_to_the_budget_on_their_own_pool(
        plane: ControlPlane) -> None:
    # Before: any two label selectors were taken as one node's, so the second pool's job was refused.
    def on(name: str, image: str, **selector: Any) -> dict[str, Any]:
        manifest = job(name, image)
        manifest["spec"]["selector"] = selector
        return manifest

    apply_manifest(plane.store, on("gpu", "app:a", matchLabels={"pool": "gpu"}), now=1.0, sizes=SIZES)  # 60 MiB
    apply_manifest(plane.store, on("cpu", "app:a", matchLabels={"pool": "cpu"}), now=2.0, sizes=SIZES)  # 60 MiB
    apply_manifest(plane.store, on("cpu-b", "app:b", matchLabels={"pool": "cpu"}), now=3.0, sizes=SIZES)  # 30 more

    # A job that may reach either pool is held to both pools' images together (app:a counted once)
    with pytest.raises(WarmBudgetExceededError,
                       match=r"on nodes pool in \(cpu, gpu\) its other jobs keep 94371840 bytes"):
        apply_manifest(plane.store, on("any", "app:c", matchExpressions=[
            {"key": "pool", "operator": "In", "values": ["gpu", "cpu"]}]), now=4.0, sizes=Sizes({f"{ECR}/app:c": 11}))
    assert budget_usage(plane.store, "team-a") == (
        "namespace team-a: 94371840 bytes (90.0 MiB) of 104857600 bytes (100.0 MiB) per node kept on nodes "
        "pool in (cpu) (policy Refuse)")


def test_a_cron_resource_s_run_beyond_the_budget_stays_an_object_that_says_why_and_applies_nothing(
        plane: ControlPlane) -> None:
    # Given a cron job resource whose runs warm 60 MiB, in a namespace that keeps 50 MiB a node
    api = FakeResources()
    api.put_namespace("team-a", **{"prewarm.dev/warm-bytes-per-node": "50Mi"})
    api.put("AdvancedCronJob", "nightly", {"schedule": "* * * * *", "template": {"imageListPullJobTemplate": {
        "spec": {"images": [f"{ECR}/app:a"]}}}}, namespace="team-a")
    sync_resources(plane.store, api, now=10.0, sizes=SIZES)
    assert plane.store.get_cron_job(job_key("team-a", "nightly")) is not None

    # When its run is due
    outcome = run_due(plane.store, job_key("team-a", "nightly"), scheduled_at=60.0, now=61.0, objects=lambda: api,
                      sizes=SIZES)

    # Then the run is skipped with the refusal, no job is stored; its object, which Kruise's controller too
    # would have made, stays, owned by the cron job (the garbage collector takes it with it)
    refusal = ("ImageListPullJob team-a/nightly-60 refused: namespace team-a keeps at most 52428800 bytes "
               "(50.0 MiB)")
    assert outcome.run == "" and outcome.skipped.startswith(refusal)
    assert plane.store.get_job(job_key("team-a", "nightly-60")) is None
    run = api.get("ImageListPullJob", "nightly-60", "team-a")
    assert [ref["name"] for ref in run["metadata"]["ownerReferences"]] == ["nightly"]
    # and the next sync leaves it unapplied, its status saying why; the cron job shows no active run
    report = sync_resources(plane.store, api, now=62.0, sizes=SIZES)
    assert [r.split(":")[0] for r in report.refused] == ["ImageListPullJob team-a/nightly-60"]
    assert api.get("ImageListPullJob", "nightly-60", "team-a")["status"]["message"].startswith(
        f"not applied: {refusal}")
    assert plane.store.get_job(job_key("team-a", "nightly-60")) is None
    assert "active" not in api.get("AdvancedCronJob", "nightly", "team-a")["status"]
