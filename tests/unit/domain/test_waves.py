"""Seed waves (`prewarm.dev/seed-wave`): the annotation's grammar, which nodes seed, and when the rest starts."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.jobs import ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import NodePhase
from prewarm.domain.placement import ZONE_LABEL, SeedWave
from prewarm.domain.rules import PrewarmRule
from prewarm.domain.status import NodeTaskRecord, WaveProgress

WAVE = "prewarm.dev/seed-wave"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


@pytest.mark.parametrize(
    ("text", "wave"),
    [("1", SeedWave(1, ZONE_LABEL)), ("3", SeedWave(3, ZONE_LABEL)),
     ("2 per kubernetes.io/hostname", SeedWave(2, "kubernetes.io/hostname")),
     ("10 per rack", SeedWave(10, "rack"))],
)
def test_the_annotation_is_k_nodes_per_zone_or_per_a_label(text: str, wave: SeedWave) -> None:
    assert SeedWave.parse(text) == wave
    assert SeedWave.parse(str(wave)) == wave


@pytest.mark.parametrize("text", ["0", "-1", "one", "", " 1", "1.5", "²", "1 per", "per zone", "1 by zone"])
def test_a_count_that_is_not_a_whole_number_of_at_least_one_is_refused_naming_the_annotation(text: str) -> None:
    with pytest.raises(ValueError, match=rf'annotations\.{WAVE}: .* must be "<k>" or "<k> per <label key>"'):
        SeedWave.parse(text)


def test_a_label_key_that_is_not_a_qualified_name_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=rf'annotations\.{WAVE}: label key "bad key!"'):
        SeedWave.parse("1 per bad key!")


def test_seeds_are_the_first_k_nodes_by_name_of_each_zone_and_unlabelled_nodes_are_one_zone() -> None:
    nodes = [node("b-1", **{ZONE_LABEL: "b"}), node("a-2", **{ZONE_LABEL: "a"}), node("a-1", **{ZONE_LABEL: "a"}),
             node("b-0", **{ZONE_LABEL: "b"}), node("x-1"), node("x-0"), node("c-0", **{ZONE_LABEL: "c"})]
    selected = ["a-1", "a-2", "b-0", "b-1", "x-0", "x-1"]  # c-0 is not selected: it seeds nothing
    assert SeedWave(1).seeds(nodes, selected) == ["a-1", "b-0", "x-0"]
    assert SeedWave(2).seeds(nodes, selected) == selected
    assert SeedWave(1, "other").seeds(nodes, selected) == ["a-1"]
    # A selected node not among `nodes` has no labels: it is in the unlabelled domain.
    assert SeedWave(1).seeds(nodes, [*selected, "w-0"]) == ["a-1", "b-0", "w-0"]
    # An empty value is a zone of its own, not the unlabelled nodes'.
    assert SeedWave(1).seeds([*nodes, node("e-0", **{ZONE_LABEL: ""})], [*selected, "e-0"]) == [
        "a-1", "b-0", "e-0", "x-0"]


def task(node: str, phase: NodePhase) -> NodeTaskRecord:
    return NodeTaskRecord(node=node, round=0, phase=phase, dispatched_at=None if phase is NodePhase.WAITING else 1.0)


def test_the_rest_waits_until_every_seed_has_finished_whether_it_succeeded_or_failed() -> None:
    seeds = ["a", "b", "c"]
    running = WaveProgress.of(seeds, {"a": task("a", NodePhase.SUCCEEDED), "b": task("b", NodePhase.PULLING),
                                      "c": task("c", NodePhase.WAITING)})
    assert (running.seeded, running.finished, running.succeeded) == (False, 1, 1)
    assert str(running) == "seed wave: 1/3 seeds finished"
    done = WaveProgress.of(seeds, {"a": task("a", NodePhase.SUCCEEDED), "b": task("b", NodePhase.FAILED),
                                   "c": task("c", NodePhase.CANCELLED)})
    assert (done.seeded, done.finished, done.succeeded) == (True, 3, 1)
    assert str(done) == "rest: 1/3 seeds succeeded"


def test_a_seed_no_longer_in_the_round_holds_nothing_back() -> None:
    assert WaveProgress.of(["a", "b"], {"a": task("a", NodePhase.SUCCEEDED)}).seeded
    assert not WaveProgress.of(["a", "b"], {"b": task("b", NodePhase.PULLING)}).seeded


def with_wave(doc: dict[str, Any], value: str, at: tuple[str, ...] = ("metadata",)) -> dict[str, Any]:
    target = doc
    for key in at:
        target = target.setdefault(key, {})
    target["annotations"] = {WAVE: value}
    return doc


def pull_job() -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "gpu", "namespace": "ml"}, "spec": {"image": "r.example/team/model:v1"}}


def test_a_kruise_job_takes_the_annotation_and_its_bad_value_is_refused_naming_it() -> None:
    job = parse_manifest(with_wave(pull_job(), "2"))
    assert isinstance(job, ImagePullJob) and job.seed_wave == SeedWave(2)
    assert job.to_manifest()["metadata"]["annotations"] == {WAVE: "2"}, "kept verbatim"
    parsed = parse_manifest(pull_job())
    assert isinstance(parsed, ImagePullJob) and parsed.seed_wave is None
    with pytest.raises(JobValidationError, match=rf"annotations\.{WAVE}: 'zero'"):
        parse_manifest(with_wave(pull_job(), "zero"))


def test_a_list_jobs_children_and_a_rules_jobs_carry_the_wave() -> None:
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
           "metadata": {"name": "base", "namespace": "ml"}, "spec": {"images": ["r.example/a:1", "r.example/b:1"]}}
    listed = parse_manifest(with_wave(doc, "1 per rack"))
    assert isinstance(listed, ImageListPullJob)
    assert {child.seed_wave for child in listed.child_jobs()} == {SeedWave(1, "rack")}
    rule = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "shop"},
            "spec": {"repositories": ["shop/*"]}}
    parsed = parse_manifest(with_wave(rule, "1", ("spec", "template", "metadata")))
    assert isinstance(parsed, PrewarmRule)
    with pytest.raises(JobValidationError, match=rf"spec.template.metadata.annotations.*{WAVE}: '0'"):
        parse_manifest(with_wave(rule, "0", ("spec", "template", "metadata")))
