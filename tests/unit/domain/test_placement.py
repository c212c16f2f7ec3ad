"""Label selectors and the choice of nodes a job pulls on."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.jobs import ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import LabelSelector
from prewarm.domain.placement import ExcludedNode, Placement, Platform, evaluate_nodes

AMD64 = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
ARM64 = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}


def node(name: str, labels: dict[str, str] | None = None, ready: str = "True", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {**AMD64, **(labels or {})}},
        "spec": spec,
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": ready, "reason": "KubeletReady"},
            ]
        },
    }


def pod(
    name: str, node_name: str | None, labels: dict[str, str], phase: str = "Running", **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop", "labels": labels, **meta},
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {"phase": phase},
    }


def placement(**spec: Any) -> Placement:
    """The placement of an ImagePullJob `shop/web` with `spec`."""
    return ImagePullJob.from_manifest(
        {
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ImagePullJob",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "nginx:1.25", **spec},
        }
    ).placement


def selector(doc: dict[str, Any]) -> LabelSelector:
    return LabelSelector.model_validate(doc)


# --- LabelSelector.matches ------------------------------------------------------------------------


def test_empty_selector_matches_everything() -> None:
    assert selector({}).matches({"a": "b"})
    assert selector({}).matches({})
    assert selector({"matchLabels": {}, "matchExpressions": []}).matches(None)


def test_match_labels_need_every_pair() -> None:
    web = selector({"matchLabels": {"pool": "web", "zone": "a"}})
    assert web.matches({"pool": "web", "zone": "a", "extra": "x"})
    assert not web.matches({"pool": "web"})
    assert not web.matches({"pool": "web", "zone": "b"})


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ["a", "b"], {"zone": "a"}, True),
        ("In", ["a", "b"], {"zone": "c"}, False),
        ("In", ["a", "b"], {}, False),
        ("NotIn", ["a", "b"], {"zone": "c"}, True),
        ("NotIn", ["a", "b"], {"zone": "a"}, False),
        ("NotIn", ["a", "b"], {}, True),
        ("Exists", None, {"zone": ""}, True),
        ("Exists", None, {}, False),
        ("DoesNotExist", None, {}, True),
        ("DoesNotExist", None, {"zone": "a"}, False),
    ],
)
def test_expressions_follow_kubernetes_semantics(
    operator: str, values: list[str] | None, labels: dict[str, str], expected: bool
) -> None:
    expression = {"key": "zone", "operator": operator, **({"values": values} if values else {})}
    assert selector({"matchExpressions": [expression]}).matches(labels) is expected


# --- LabelSelector.to_query -----------------------------------------------------------------------


def test_query_string_renders_every_operator_sorted_by_key() -> None:
    # Given a selector written in no particular order
    query = selector(
        {
            "matchLabels": {"a": "b"},
            "matchExpressions": [
                {"key": "e", "operator": "Exists"},
                {"key": "d", "operator": "DoesNotExist"},
                {"key": "c", "operator": "In", "values": ["y", "x"]},
                {"key": "f", "operator": "NotIn", "values": ["z"]},
            ],
        }
    ).to_query()
    # Then the query is Kubernetes' labelSelector syntax, sorted
    assert query == "a=b,c in (x,y),!d,e,f notin (z)"


def test_query_string_of_an_empty_selector_is_empty() -> None:
    assert selector({}).to_query() == ""


def test_query_string_keeps_prefixed_keys_and_empty_values() -> None:
    query = selector({"matchLabels": {"karpenter.sh/nodepool": "gpu", "canary": ""}}).to_query()
    assert query == "canary=,karpenter.sh/nodepool=gpu"


# --- Platform -------------------------------------------------------------------------------------


def test_platform_parses_and_prints_os_architecture_and_variant() -> None:
    assert Platform.parse("linux/arm64/v8") == Platform("linux", "arm64", "v8")
    assert str(Platform("linux", "amd64")) == "linux/amd64"
    with pytest.raises(ValueError, match="must be os/architecture"):
        Platform.parse("arm64")


# --- evaluate_nodes -------------------------------------------------------------------------------


def test_no_selector_selects_every_ready_node_sorted() -> None:
    nodes = [node("n3"), node("n1"), node("n2")]
    assert evaluate_nodes(placement(), nodes, []).selected == ["n1", "n2", "n3"]


def test_names_select_those_nodes_and_report_missing_ones() -> None:
    # Given a job naming three nodes, one of which is gone
    nodes = [node("n1"), node("n2"), node("n3")]
    selection = evaluate_nodes(placement(selector={"names": ["n2", "gone", "n1"]}), nodes)
    # Then the two present ones are selected and the missing one is excluded with a reason
    assert selection.selected == ["n1", "n2"]
    assert selection.excluded == [ExcludedNode("gone", "node not found")]


def test_label_selector_picks_matching_nodes_only() -> None:
    nodes = [node("web-1", {"pool": "web"}), node("db-1", {"pool": "db"}), node("web-2", {"pool": "web"})]
    selection = evaluate_nodes(placement(selector={"matchLabels": {"pool": "web"}}), nodes)
    assert selection.selected == ["web-1", "web-2"]
    # Nodes the selector does not match are not targeted, so they are not listed as excluded.
    assert selection.excluded == []


def test_empty_selector_selects_every_node() -> None:
    assert evaluate_nodes(placement(selector={}), [node("n1"), node("n2")]).selected == ["n1", "n2"]


@pytest.mark.parametrize("ready", ["False", "Unknown"])
def test_nodes_that_are_not_ready_are_excluded(ready: str) -> None:
    selection = evaluate_nodes(placement(), [node("ok"), node("sick", ready=ready)])
    assert selection.selected == ["ok"]
    assert selection.excluded == [ExcludedNode("sick", "node is not Ready")]


def test_node_without_a_ready_condition_is_excluded() -> None:
    bare = {"metadata": {"name": "new"}, "status": {}}
    assert evaluate_nodes(placement(), [bare]).excluded == [ExcludedNode("new", "node is not Ready")]


def test_virtual_kubelet_nodes_are_excluded() -> None:
    selection = evaluate_nodes(placement(), [node("fargate-1", {"type": "virtual-kubelet"}), node("n1")])
    assert selection.selected == ["n1"]
    assert selection.excluded == [ExcludedNode("fargate-1", "virtual-kubelet node")]


def test_cordoned_nodes_are_kept_as_kruise_does() -> None:
    assert evaluate_nodes(placement(), [node("cordoned", unschedulable=True)]).selected == ["cordoned"]


def test_nodes_of_a_platform_the_image_lacks_are_excluded() -> None:
    # Given an image built for linux/amd64 only, and a mixed cluster
    nodes = [node("x86", AMD64), node("graviton", ARM64)]
    # When nodes are chosen for it
    selection = evaluate_nodes(placement(), nodes, platforms=[Platform("linux", "amd64")])
    # Then the arm64 node is left out, saying why
    assert selection.selected == ["x86"]
    assert selection.excluded == [ExcludedNode("graviton", "image has no linux/arm64 variant")]


def test_platform_variants_do_not_restrict_nodes() -> None:
    platforms = [Platform("linux", "amd64"), Platform("linux", "arm64", "v8")]
    assert evaluate_nodes(placement(), [node("x86", AMD64), node("graviton", ARM64)], platforms=platforms).selected == [
        "graviton",
        "x86",
    ]


def test_beta_platform_labels_are_read_when_the_stable_ones_are_missing() -> None:
    old = {
        "metadata": {
            "name": "old",
            "labels": {"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "arm64"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert evaluate_nodes(placement(), [old], platforms=[Platform("linux", "amd64")]).excluded == [
        ExcludedNode("old", "image has no linux/arm64 variant")
    ]


def test_node_without_platform_labels_is_excluded_when_platforms_are_known() -> None:
    unlabelled = {
        "metadata": {"name": "odd"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    (excluded,) = evaluate_nodes(placement(), [unlabelled], platforms=[Platform("linux", "amd64")]).excluded
    assert excluded.reason == "node has no kubernetes.io/os and kubernetes.io/arch labels, so its platform is unknown"
    assert evaluate_nodes(placement(), [unlabelled]).selected == ["odd"]


def test_pod_selector_selects_nodes_of_active_scheduled_matching_pods_once() -> None:
    # Given pods of the storefront on two nodes, plus pods that must not count
    pods = [
        pod("front-a", "n1", {"app": "front"}),
        pod("front-b", "n1", {"app": "front"}),
        pod("front-c", "n2", {"app": "front"}, phase="Pending"),
        pod("front-done", "n3", {"app": "front"}, phase="Succeeded"),
        pod("front-failed", "n3", {"app": "front"}, phase="Failed"),
        pod("front-leaving", "n4", {"app": "front"}, deletionTimestamp="2024-05-01T10:00:00Z"),
        pod("front-unscheduled", None, {"app": "front"}, phase="Pending"),
        pod("back", "n5", {"app": "back"}),
        {
            **pod("other-ns", "n6", {"app": "front"}),
            "metadata": {"namespace": "blog", "labels": {"app": "front"}},
        },
    ]
    nodes = [node(f"n{i}") for i in range(1, 7)]
    # When nodes are chosen by podSelector
    selection = evaluate_nodes(placement(podSelector={"matchLabels": {"app": "front"}}), nodes, pods)
    # Then only the nodes running active, scheduled, matching pods of the job's namespace are selected
    assert selection.selected == ["n1", "n2"]
    assert selection.excluded == []


def test_pod_selector_reports_a_pods_node_that_is_gone() -> None:
    selection = evaluate_nodes(placement(podSelector={}), [node("n1")], [pod("p", "n1", {}), pod("q", "vanished", {})])
    assert selection.selected == ["n1"]
    assert selection.excluded == [ExcludedNode("vanished", "node not found")]


def test_list_jobs_select_nodes_like_pull_jobs() -> None:
    images = ImageListPullJob.from_manifest(
        {
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "ImageListPullJob",
            "metadata": {"name": "base"},
            "spec": {"images": ["nginx:1.25"], "selector": {"names": ["n2"]}},
        }
    )
    assert evaluate_nodes(images.placement, [node("n1"), node("n2")]).selected == ["n2"]


def test_every_node_needs_a_name() -> None:
    with pytest.raises(ValueError, match=r"every node must have metadata\.name"):
        evaluate_nodes(placement(), [{"metadata": {}}])


def test_a_node_listed_twice_is_selected_once() -> None:
    assert evaluate_nodes(placement(), [node("n1"), node("n1")]).selected == ["n1"]


FARGATE = {"eks.amazonaws.com/compute-type": "fargate"}
WINDOWS = {"kubernetes.io/os": "windows", "kubernetes.io/arch": "amd64"}


def test_nodes_no_agent_runs_on_are_excluded_with_their_reason() -> None:
    # Given a job with no selector over a Linux node, a Fargate node and a Windows node
    nodes = [node("linux-1"), node("fargate-ip-10-0-1-1", FARGATE), node("win-1", WINDOWS)]
    selection = evaluate_nodes(placement(), nodes)
    # Then only the Linux node pulls; the others are excluded, saying why (no agent could pull there)
    assert selection.selected == ["linux-1"]
    assert selection.excluded == [
        ExcludedNode("fargate-ip-10-0-1-1", "Fargate node: no node containerd for the agent"),
        ExcludedNode("win-1", "Windows node: the agent runs on Linux nodes only"),
    ]


def test_a_named_fargate_node_gets_its_reason_not_a_silent_skip() -> None:
    selection = evaluate_nodes(placement(selector={"names": ["fargate-ip-10-0-1-1"]}),
                               [node("fargate-ip-10-0-1-1", FARGATE)])
    assert selection.selected == []
    assert selection.excluded == [ExcludedNode("fargate-ip-10-0-1-1", "Fargate node: no node containerd for the agent")]


def test_windows_nodes_are_excluded_even_for_an_image_with_a_windows_variant() -> None:
    # No agent runs on a Windows node (the DaemonSet is Linux only): selecting one would only fail it later
    platforms = [Platform("windows", "amd64"), Platform("linux", "amd64")]
    selection = evaluate_nodes(placement(), [node("win-1", WINDOWS), node("linux-1")], platforms=platforms)
    assert selection.selected == ["linux-1"]
    assert selection.excluded == [ExcludedNode("win-1", "Windows node: the agent runs on Linux nodes only")]
