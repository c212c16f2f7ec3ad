"""The ETA `watch` and `describe` show, live from progress and the registry budget, and the first one kept
for `describe` to set against the outcome; and the seed wave they show."""

from __future__ import annotations

from typing import Any

from prewarm.domain.eta import Bottleneck
from prewarm.domain.messages import Hello
from prewarm.domain.placement import ZONE_LABEL
from prewarm.domain.registry_budget import RegistryBudget, budget_key
from prewarm.services.eta import first_estimate
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.reports import register_node
from prewarm_cli.commands.watch import watch_state
from prewarm_cli.output import describe_job
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import IMAGE, job_doc

MB = 1_000_000


def nodes(plane: ControlPlane, names: list[str], **labels: str) -> None:
    for name in names:
        plane.cluster.nodes.append(make_node(name, **labels))
        plane.queues.ensure_queue(name)
        register_node(plane.store, plane.queues, None, Hello(node=name), now=plane.now())


def view(plane: ControlPlane) -> Any:
    return view_job(plane.store, "default", "warm", now=plane.now(), with_tasks=True)


def status_lines(text: str) -> dict[str, str]:
    pairs = (line.strip().split(":", 1) for line in text.splitlines() if ":" in line)
    return {key: value.strip() for key, value in pairs}


def test_node_throughput_eta_updates_from_progress_and_the_first_is_set_against_the_outcome(
        plane: ControlPlane) -> None:
    # Given four nodes pulling a 100 MB image two at a time
    nodes(plane, ["n0", "n1", "n2", "n3"])
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())
    plane.plan("warm")
    assert view(plane).estimate.seconds is None  # no progress yet, no budget reserved
    # When the first two report 20 MB each, a second apart from their start (the plane's clock ticks 1 s a call)
    plane.report("warm", "n0", "Pulling")
    plane.report("warm", "n0", "Pulling", bytes_done=20 * MB, bytes_total=100 * MB)
    first = plane.store.get_job("default/warm").first_estimate  # type: ignore[union-attr]
    assert first, "kept at the round's first byte progress"
    live = view(plane)
    # Then the ETA names node throughput, from the rate observed
    assert live.estimate.bottleneck is Bottleneck.NODE_THROUGHPUT
    assert live.first_estimate.bottleneck is Bottleneck.NODE_THROUGHPUT
    state = watch_state(live)
    assert state.eta.startswith("ETA ") and state.eta.endswith("(node throughput)")
    assert state.line().endswith(state.eta)
    shown = status_lines(describe_job(live, now=plane.now()))
    assert shown["ETA"].startswith(str(live.estimate)[:10]) and "bound by node throughput" in shown["ETA"]
    assert shown["Estimate at Start"] == live.first_estimate.summary()
    # And once it is done, describe shows the first estimate against the time the job took
    for node in ("n0", "n1", "n2", "n3"):
        plane.report("warm", node, "Succeeded", bytes_done=100 * MB, bytes_total=100 * MB)
    done = view(plane)
    assert done.completion_time is not None
    assert plane.store.get_job("default/warm").first_estimate == first  # type: ignore[union-attr]
    shown = status_lines(describe_job(done, now=plane.now()))
    assert "ETA" not in shown
    assert shown["Estimate at Start"] == done.first_estimate.against(done.completion_time)
    assert shown["Estimate at Start"].startswith("estimated ") and "(node throughput), took " in shown[
        "Estimate at Start"]
    assert watch_state(done).eta == ""


def test_the_registry_budget_bounds_the_eta_from_what_its_reservations_left(plane: ControlPlane) -> None:
    # Given a budget of 1 request a second, 120 s of it reserved by another job, and 3 nodes of a 10-layer image
    nodes(plane, ["n0", "n1", "n2"])
    apply_manifest(plane.store, job_doc(parallelism=1), now=plane.now())
    plane.plan("warm")
    plane.store.set_job_fields("default/warm", {"layers": 10})
    now = plane.now()
    plane.store.reserve_pull_starts(budget_key(IMAGE.split("/", 1)[0]), [120.0], now=now, burst_seconds=0.0,
                                    budget=RegistryBudget(requests_per_second=1.0))
    plane.report("warm", "n0", "Pulling")
    plane.report("warm", "n0", "Pulling", bytes_done=50 * MB, bytes_total=100 * MB)
    # When watch and describe read it
    live = view(plane)
    # Then the budget bounds it: two waiting pulls of 12 requests each at 1/s after what is reserved
    assert live.estimate.bottleneck is Bottleneck.REGISTRY_BUDGET
    assert "12 requests a pull at 1/s" in str(live.estimate)
    assert watch_state(live).eta.endswith("(registry budget)")
    assert "bound by registry budget" in status_lines(describe_job(live, now=plane.now()))["ETA"]


def test_describe_and_watch_show_the_seed_wave(plane: ControlPlane) -> None:
    for zone in "ab":
        nodes(plane, [f"{zone}0", f"{zone}1"], **{ZONE_LABEL: zone})
    doc = job_doc(parallelism=4)
    doc["metadata"]["annotations"] = {"prewarm.dev/seed-wave": "1"}
    apply_manifest(plane.store, doc, now=plane.now())
    plane.plan("warm")
    live = view(plane)
    assert status_lines(describe_job(live, now=plane.now()))["Wave"] == "seed wave: 0/2 seeds finished"
    seeds = sorted(plane.store.get_job("default/warm").seeds)  # type: ignore[union-attr]
    assert len(seeds) == 2 and status_lines(describe_job(live, now=plane.now()))["Seed Nodes"] == ", ".join(seeds)
    assert "; seed wave: 0/2 seeds finished" in watch_state(live).line()
    plane.report("warm", "a0", "Succeeded")
    plane.report("warm", "b0", "Failed", message="401 Unauthorized")
    assert status_lines(describe_job(view(plane), now=plane.now()))["Wave"] == "rest: 1/2 seeds succeeded"


def test_a_list_jobs_describe_shows_its_images_waves_and_the_longest_eta(plane: ControlPlane) -> None:
    nodes(plane, ["n0", "n1", "n2", "n3"])
    other = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/tok@sha256:" + "b" * 64
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
           "metadata": {"name": "bundle", "namespace": "default", "annotations": {"prewarm.dev/seed-wave": "1"}},
           "spec": {"images": [IMAGE, other], "parallelism": 2}}
    apply_manifest(plane.store, doc, now=plane.now())
    record = plane.store.get_job("default/bundle")
    assert record is not None
    first, second = record.children
    for child in record.children:
        plane.plan(child)
    # One image's seed reports bytes: its ETA is the list job's (the other has none yet)
    seed = plane.store.get_job(f"default/{first}").seeds[0]  # type: ignore[union-attr]
    plane.report(first, seed, "Pulling")
    plane.report(first, seed, "Pulling", bytes_done=20 * MB, bytes_total=100 * MB)
    parent = view_job(plane.store, "default", "bundle", now=plane.now(), with_tasks=True)
    shown = status_lines(describe_job(parent, now=plane.now()))
    child = next(c for c in parent.children if c.record.name == first)
    assert child.estimate is not None and shown["ETA"] == str(child.estimate)
    assert "bound by node throughput" in shown["ETA"]
    assert shown["Wave"].startswith(f"{first}: seed wave: 0/1 seeds finished") and f"{second}: seed wave" in shown[
        "Wave"]


def test_a_paused_job_keeps_no_first_estimate_until_it_runs_again(plane: ControlPlane) -> None:
    # Given a job pulling on one node, paused (parallelism 0) before its first byte progress, three waiting
    nodes(plane, ["n0", "n1", "n2", "n3"])
    apply_manifest(plane.store, job_doc(parallelism=1), now=plane.now())
    plane.plan("warm")
    (pulling,) = [n for n in ("n0", "n1", "n2", "n3") if plane.node_messages(n)]
    apply_manifest(plane.store, job_doc(parallelism=0), now=plane.now())
    plane.plan("warm")
    # When its node in flight reports bytes, Then no estimate is kept: there is none to give
    plane.report("warm", pulling, "Pulling")
    plane.report("warm", pulling, "Pulling", bytes_done=20 * MB, bytes_total=100 * MB)
    assert plane.store.get_job("default/warm").first_estimate == ""  # type: ignore[union-attr]
    assert view(plane).estimate.detail == "parallelism 0: 3 nodes wait until it is raised"
    # And once it runs again, the first estimate with a figure is kept
    apply_manifest(plane.store, job_doc(parallelism=2), now=plane.now())
    plane.plan("warm")
    plane.report("warm", pulling, "Pulling", bytes_done=40 * MB, bytes_total=100 * MB)
    assert first_estimate(plane.store.get_job("default/warm")).seconds  # type: ignore[arg-type, union-attr]
