"""A job's seed wave (`prewarm.dev/seed-wave`): seeds start first, the rest once every seed has finished."""

from __future__ import annotations

from typing import Any

from prewarm.domain.messages import PullTask, StatusReport
from prewarm.domain.placement import ZONE_LABEL
from prewarm.services.dispatch import plan_job, wave_progress
from prewarm.services.jobs import apply_manifest
from prewarm.services.reports import record_report
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

# Two zones of three nodes: a-0..a-2 in zone a, b-0..b-2 in zone b.
NODES = [f"{zone}-{i}" for zone in "ab" for i in range(3)]


def zoned_plane(plane: ControlPlane, *, seed_wave: str = "1", parallelism: int = 10) -> None:
    plane.cluster.nodes += [make_node(n, **{ZONE_LABEL: f"zone-{n[0]}"}) for n in NODES]
    doc: dict[str, Any] = job_doc(parallelism=parallelism)
    doc["metadata"]["annotations"] = {"prewarm.dev/seed-wave": seed_wave}
    assert apply_manifest(plane.store, doc, now=plane.now()).outcome == "created"
    plane.start_agents()
    plan_job(plane.store, plane.cluster, plane.queues, "default/warm", now=plane.now())


def pulls_sent(plane: ControlPlane) -> dict[str, PullTask]:
    return {n: m for n in NODES for m in plane.node_messages(n) if isinstance(m, PullTask)}


def finish(plane: ControlPlane, task: PullTask, phase: str) -> None:
    for seq, step in enumerate(("Pulling", phase)):
        report = dict(job=task.job, job_uid=task.job_uid, round=task.round, node=task.node, phase=step, seq=seq,
                      attempt=1)
        assert record_report(plane.store, plane.queues, StatusReport(**report), now=plane.now()).applied


def test_only_one_seed_per_zone_starts_though_parallelism_allows_all(plane: ControlPlane) -> None:
    zoned_plane(plane)
    assert sorted(pulls_sent(plane)) == ["a-0", "b-0"]
    record = plane.store.get_job("default/warm")
    assert record is not None and record.seeds == ["a-0", "b-0"]
    assert str(wave_progress(plane.store, record)) == "seed wave: 0/2 seeds finished"


def test_the_rest_starts_only_once_every_seed_has_finished(plane: ControlPlane) -> None:
    zoned_plane(plane)
    seeds = pulls_sent(plane)
    finish(plane, seeds["a-0"], "Succeeded")
    assert pulls_sent(plane) == {}, "one zone's seed done is not the wave done"
    finish(plane, seeds["b-0"], "Succeeded")
    assert sorted(pulls_sent(plane)) == ["a-1", "a-2", "b-1", "b-2"]
    record = plane.store.get_job("default/warm")
    assert record is not None
    assert str(wave_progress(plane.store, record)) == "rest: 2/2 seeds succeeded"


def test_a_failed_seed_still_lets_the_rest_start(plane: ControlPlane) -> None:
    zoned_plane(plane)
    seeds = pulls_sent(plane)
    finish(plane, seeds["a-0"], "Failed")
    finish(plane, seeds["b-0"], "Succeeded")
    assert sorted(pulls_sent(plane)) == ["a-1", "a-2", "b-1", "b-2"]
    record = plane.store.get_job("default/warm")
    assert record is not None
    assert str(wave_progress(plane.store, record)) == "rest: 1/2 seeds succeeded"


def test_seeds_beyond_parallelism_wait_for_a_slot_and_non_seeds_never_take_it(plane: ControlPlane) -> None:
    zoned_plane(plane, seed_wave="2", parallelism=1)
    first = pulls_sent(plane)
    assert sorted(first) == ["a-0"]
    finish(plane, first["a-0"], "Succeeded")
    assert sorted(pulls_sent(plane)) == ["a-1"]


def test_a_job_without_the_annotation_has_no_wave(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node(n, **{ZONE_LABEL: f"zone-{n[0]}"}) for n in NODES]
    apply_manifest(plane.store, job_doc(parallelism=10), now=plane.now())
    plane.start_agents()
    plan_job(plane.store, plane.cluster, plane.queues, "default/warm", now=plane.now())
    assert sorted(pulls_sent(plane)) == NODES
    record = plane.store.get_job("default/warm")
    assert record is not None and record.seeds == [] and wave_progress(plane.store, record) is None
