"""Placement rules the node-selection tests leave implicit: platforms written and matched, nodes given in
odd shapes, pods not yet scheduled, the beta OS label, affinity on fields other than the node's name,
and the messages that name what left a node out."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.kubernetes import LabelSelector
from prewarm.domain.placement import (
    DEFAULT_TAINT_KEY,
    WINDOWS_NODE,
    AgentPlacement,
    ExcludedNode,
    NodeSelector,
    Placement,
    Platform,
    evaluate_nodes,
    named_exclusions,
)


def node(name: str = "n1", labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         linux_amd64: bool = True) -> dict[str, Any]:
    base = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"} if linux_amd64 else {}
    return {
        "metadata": {"name": name, "labels": {**base, **(labels or {})}},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


# --- Platforms -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "platform"),
    [("linux/amd64", Platform("linux", "amd64")), ("linux/arm64/v8", Platform("linux", "arm64", "v8"))],
)
def test_a_platform_is_os_architecture_and_an_optional_variant(text: str, platform: Platform) -> None:
    assert Platform.parse(text) == platform
    assert str(platform) == text


@pytest.mark.parametrize("text", ["linux", "linux/", "/amd64", "linux/arm/v7/x"])
def test_a_platform_with_a_missing_or_extra_part_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=f'platform "{text}" must be os/architecture'):
        Platform.parse(text)


@pytest.mark.parametrize(
    ("platform", "entry", "runs"),
    [
        (Platform("linux", "amd64"), {"os": "linux", "architecture": "amd64"}, True),
        (Platform("linux", "amd64"), {"os": "windows", "architecture": "amd64"}, False),
        (Platform("linux", "amd64"), {"os": "linux", "architecture": "arm64"}, False),
        # arm64's v8 is the only arm64 variant: an entry or a node may leave it out
        (Platform("linux", "arm64"), {"os": "linux", "architecture": "arm64", "variant": "v8"}, True),
        (Platform("linux", "arm64", "v8"), {"os": "linux", "architecture": "arm64"}, True),
        (Platform("linux", "arm64"), {"os": "linux", "architecture": "arm64", "variant": "v9"}, False),
        # other architectures' variants must be the same
        (Platform("linux", "arm", "v7"), {"os": "linux", "architecture": "arm", "variant": "v7"}, True),
        (Platform("linux", "arm", "v7"), {"os": "linux", "architecture": "arm", "variant": "v6"}, False),
        (Platform("linux", "arm", "v7"), {"os": "linux", "architecture": "arm"}, False),
        (Platform("linux", "arm"), {"os": "linux", "architecture": "arm", "variant": "v8"}, False),
    ],
)
def test_an_image_index_entry_runs_on_a_platform_of_the_same_os_architecture_and_variant(
    platform: Platform, entry: dict[str, str], runs: bool
) -> None:
    assert platform.matches(entry) is runs


def test_a_node_without_an_architecture_label_has_an_unknown_platform() -> None:
    bare = node(labels={"kubernetes.io/os": "linux"}, linux_amd64=False)
    selection = evaluate_nodes(Placement(), [bare], platforms=[Platform("linux", "amd64")])
    assert selection.excluded == [
        ExcludedNode("n1", "node has no kubernetes.io/os and kubernetes.io/arch labels, so its platform is unknown")
    ]


# --- Nodes and pods as the API gives them ----------------------------------------------------------


@pytest.mark.parametrize("name", [None, "", 7])
def test_a_node_without_a_string_name_is_refused(name: object) -> None:
    broken = node()
    broken["metadata"]["name"] = name
    with pytest.raises(ValueError) as caught:
        evaluate_nodes(Placement(), [broken])
    assert str(caught.value) == "every node must have metadata.name"


def test_a_pod_not_yet_scheduled_targets_no_node() -> None:
    pending = {"metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
               "spec": {"containers": [{"name": "web", "image": "nginx"}]}, "status": {"phase": "Pending"}}
    placement = Placement(pod_selector=LabelSelector.model_validate({"matchLabels": {"app": "web"}}))
    selection = evaluate_nodes(placement, [node()], pods=[pending])
    assert (selection.selected, selection.excluded) == ([], [])


def test_a_node_labelled_windows_only_by_the_beta_label_is_left_out() -> None:
    old = node(labels={"beta.kubernetes.io/os": "windows", "beta.kubernetes.io/arch": "amd64"}, linux_amd64=False)
    assert evaluate_nodes(Placement(), [old]).excluded == [ExcludedNode("n1", WINDOWS_NODE)]


# --- Where the agent runs --------------------------------------------------------------------------


def affinity_term(**term: Any) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}


def test_node_affinity_on_a_field_other_than_the_node_name_matches_no_node() -> None:
    agents = AgentPlacement.of_pod_spec(affinity_term(
        matchFields=[{"key": "metadata.namespace", "operator": "In", "values": ["n1"]}]))
    assert agents.misfit(node("n1")) == (
        "outside the agent DaemonSet's node affinity (metadata.namespace In [n1]): no agent runs here"
    )
    by_name = AgentPlacement.of_pod_spec(affinity_term(
        matchFields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}]))
    assert by_name.misfit(node("n1")) is None


def test_an_affinity_misfit_names_a_requirement_without_values_as_written() -> None:
    agents = AgentPlacement.of_pod_spec(affinity_term(matchExpressions=[{"key": "pool", "operator": "Exists"}]))
    assert agents.misfit(node()) == "outside the agent DaemonSet's node affinity (pool Exists): no agent runs here"


def test_the_transient_taints_given_with_a_pod_spec_replace_the_default() -> None:
    warming = node(taints=[{"key": DEFAULT_TAINT_KEY, "effect": "NoSchedule"}])
    other = node(taints=[{"key": "example.com/booting", "effect": "NoSchedule"}])
    agents = AgentPlacement.of_pod_spec({}, transient_taints=frozenset({"example.com/booting"}))
    assert agents.misfit(other) is None
    assert agents.misfit(warming) == (
        f"taint {DEFAULT_TAINT_KEY}:NoSchedule not tolerated by the agent DaemonSet: no agent runs here"
    )
    assert AgentPlacement.of_pod_spec({}).misfit(warming) is None


# --- The message of a job that names its nodes ----------------------------------------------------


def by_name(*names: str) -> Placement:
    return Placement(selector=NodeSelector(names=list(names)))


def test_a_job_naming_its_nodes_says_which_it_left_out_and_why() -> None:
    one = [ExcludedNode("b", "node not found")]
    assert named_exclusions(by_name("a", "b"), one) == "named node b excluded: node not found"
    several = [ExcludedNode("c", "not ready"), ExcludedNode("b", "node not found"), ExcludedNode("d", "x")]
    assert named_exclusions(by_name("b", "c", "d"), several) == (
        "3 named nodes excluded: b (node not found) and 2 more"
    )


def test_a_job_that_names_no_node_or_leaves_none_out_says_nothing() -> None:
    excluded = [ExcludedNode("b", "node not found")]
    assert named_exclusions(by_name("a"), []) == ""
    assert named_exclusions(Placement(), excluded) == ""
    labelled = Placement(selector=NodeSelector.model_validate({"matchLabels": {"pool": "gpu"}}))
    assert named_exclusions(labelled, excluded) == ""
