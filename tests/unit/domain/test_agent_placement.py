"""Where the agent DaemonSet runs (`AgentPlacement`), and the nodes a job leaves out because no agent runs there."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.kubernetes import requirement_holds
from prewarm.domain.placement import AgentPlacement, ExcludedNode, Placement, evaluate_nodes, tolerates
from tests.support.cluster import shipped_daemon_set

LINUX = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


def node(name: str = "n1", labels: dict[str, str] | None = None, *taints: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {**LINUX, **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def taint(key: str, effect: str = "NoSchedule", value: str | None = None) -> dict[str, str]:
    return {"key": key, "effect": effect, **({"value": value} if value is not None else {})}


def daemon_set(**pod_spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "prewarm-agent"},
            "spec": {"template": {"spec": {"containers": [{"name": "agent"}], **pod_spec}}}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def misfit(ds: dict[str, Any], n: dict[str, Any]) -> str | None:
    return AgentPlacement.of_daemon_set(ds).misfit(n)


# --- requirement_holds: one rule for label selectors and node affinity ----------------------------


@pytest.mark.parametrize(("operator", "values", "value", "holds"), [
    ("In", ["a", "b"], "a", True),
    ("In", ["a", "b"], None, False),
    ("NotIn", ["a"], None, True),
    ("NotIn", ["a"], "a", False),
    ("Exists", [], "", True),
    ("DoesNotExist", [], None, True),
    ("Gt", ["4"], "8", True),
    ("Gt", ["8"], "8", False),
    ("Lt", ["8"], "-2", True),
    ("Lt", ["8"], "+9", False),
    ("Gt", ["4"], None, False),  # a missing label is no number
    ("Gt", ["4"], "eight", False),
    ("Gt", ["4"], " 8", False),  # Go's ParseInt takes no spaces
    ("Gt", ["4", "5"], "8", False),  # Gt and Lt take exactly one value
    ("Gt", ["four"], "8", False),
    ("Near", ["a"], "a", False),
])
def test_requirements_follow_kubernetes_label_semantics(operator: str, values: list[str], value: str | None,
                                                         holds: bool) -> None:
    assert requirement_holds(operator, values, value) is holds


# --- tolerations ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("toleration", "node_taint", "tolerated"), [
    ({"operator": "Exists"}, taint("any", "NoExecute", "x"), True),
    ({"key": "gpu", "operator": "Exists"}, taint("gpu", "NoSchedule", "true"), True),
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, taint("gpu", "NoSchedule"), False),
    ({"key": "gpu", "value": "true"}, taint("gpu", "NoSchedule", "true"), True),  # Equal is the default
    ({"key": "gpu", "operator": "Equal", "value": "true"}, taint("gpu", "NoSchedule", "false"), False),
    ({"key": "gpu", "operator": "Equal"}, taint("gpu", "NoSchedule"), True),  # empty value equals no value
    ({"key": "tpu", "operator": "Exists"}, taint("gpu"), False),
])
def test_a_toleration_tolerates_a_taint_as_kubernetes_says(toleration: dict[str, str], node_taint: dict[str, str],
                                                           tolerated: bool) -> None:
    assert tolerates(toleration, node_taint) is tolerated


# --- AgentPlacement.misfit: a table of DaemonSets and nodes -------------------------------------------

GENERAL = {"nodeSelector": {"pool": "general"}}
ONE_TERM = {"affinity": affinity({"matchExpressions": [expression("pool", "In", "general", "batch")]})}
TWO_TERMS = {"affinity": affinity({"matchExpressions": [expression("pool", "In", "general")]},
                                  {"matchExpressions": [expression("gpus", "Gt", "3")]})}
BY_NAME = {"affinity": affinity({"matchFields": [expression("metadata.name", "NotIn", "n9")]})}
NO_NAME_FIELD = {"affinity": affinity({"matchFields": [expression("spec.providerID", "In", "aws:///i-1")]})}
BOTH = {"affinity": affinity({"matchExpressions": [expression("pool", "Exists")],
                              "matchFields": [expression("metadata.name", "In", "n1")]})}
EMPTY_TERM = {"affinity": affinity({})}
GPU_ONLY = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
NONE = "no agent runs here"


@pytest.mark.parametrize(("pod_spec", "the_node", "reason"), [
    # nodeSelector: every pair must be a label of the node
    (GENERAL, node(labels={"pool": "general"}), None),
    (GENERAL, node(labels={"pool": "gpu"}), f"outside the agent DaemonSet's nodeSelector (pool=general): {NONE}"),
    (GENERAL, node(), f"outside the agent DaemonSet's nodeSelector (pool=general): {NONE}"),
    # required node affinity: one term must match; its failing requirement is named
    (ONE_TERM, node(labels={"pool": "batch"}), None),
    (ONE_TERM, node(labels={"pool": "gpu"}),
     f"outside the agent DaemonSet's node affinity (pool In [general, batch]): {NONE}"),
    (TWO_TERMS, node(labels={"gpus": "8"}), None),
    (TWO_TERMS, node(labels={"gpus": "2"}),
     f"outside the agent DaemonSet's node affinity (none of its 2 terms): {NONE}"),
    (BY_NAME, node("n1"), None),
    (BY_NAME, node("n9"), f"outside the agent DaemonSet's node affinity (metadata.name NotIn [n9]): {NONE}"),
    (NO_NAME_FIELD, node(), f"outside the agent DaemonSet's node affinity (spec.providerID In [aws:///i-1]): {NONE}"),
    (BOTH, node("n1", {"pool": "x"}), None),
    (BOTH, node("n2", {"pool": "x"}), f"outside the agent DaemonSet's node affinity (metadata.name In [n1]): {NONE}"),
    (EMPTY_TERM, node(), f"outside the agent DaemonSet's node affinity: {NONE}"),  # an empty term matches nothing
    # taints: NoSchedule and NoExecute need a toleration; PreferNoSchedule does not
    ({}, node("n1", None, taint("dedicated", "NoSchedule", "ml")),
     f"taint dedicated=ml:NoSchedule not tolerated by the agent DaemonSet: {NONE}"),
    ({}, node("n1", None, taint("dedicated", "NoExecute")),
     f"taint dedicated:NoExecute not tolerated by the agent DaemonSet: {NONE}"),
    ({}, node("n1", None, taint("dedicated", "PreferNoSchedule")), None),
    (GPU_ONLY, node("n1", None, taint("nvidia.com/gpu", "NoSchedule", "present")), None),
    (GPU_ONLY, node("n1", None, taint("nvidia.com/gpu", "NoSchedule"), taint("spot", "NoSchedule")),
     f"taint spot:NoSchedule not tolerated by the agent DaemonSet: {NONE}"),
    # the DaemonSet controller's own tolerations, whatever the template says
    ({}, node("n1", None, taint("node.kubernetes.io/not-ready", "NoExecute"),
              taint("node.kubernetes.io/unreachable", "NoExecute"), taint("node.kubernetes.io/disk-pressure"),
              taint("node.kubernetes.io/memory-pressure"), taint("node.kubernetes.io/pid-pressure"),
              taint("node.kubernetes.io/unschedulable")), None),
    # network-unavailable only for pods with host networking
    ({}, node("n1", None, taint("node.kubernetes.io/network-unavailable")),
     f"taint node.kubernetes.io/network-unavailable:NoSchedule not tolerated by the agent DaemonSet: {NONE}"),
    ({"hostNetwork": True}, node("n1", None, taint("node.kubernetes.io/network-unavailable")), None),
    # Prewarm's startup taint goes away (the agent or the sweep removes it): never a reason
    ({}, node("n1", None, taint("prewarm.dev/warming", "NoSchedule", "true")), None),
    ({}, node("n1", None, taint("prewarm.dev/warming", "NoExecute")), None),
    # an empty template fits every node
    ({}, node(), None),
])
def test_misfit_names_why_the_daemonset_puts_no_agent_on_a_node(pod_spec: dict[str, Any], the_node: dict[str, Any],
                                                                reason: str | None) -> None:
    assert misfit(daemon_set(**pod_spec), the_node) == reason


def test_the_shipped_daemonset_fits_every_linux_node_whatever_its_taints() -> None:
    tainted = node("gpu-1", {"pool": "gpu"}, taint("nvidia.com/gpu", "NoSchedule", "present"),
                   taint("dedicated", "NoExecute", "ml"))
    assert misfit(shipped_daemon_set(), tainted) is None
    assert misfit(shipped_daemon_set(), node("win", {"kubernetes.io/os": "windows"})) is not None


def test_a_node_failing_several_rules_gets_the_node_selector_first() -> None:
    ds = daemon_set(nodeSelector={"pool": "general"}, **ONE_TERM)
    assert misfit(ds, node("n1", {"pool": "gpu"}, taint("x"))) == \
        f"outside the agent DaemonSet's nodeSelector (pool=general): {NONE}"


# --- evaluate_nodes with the DaemonSet ------------------------------------------------------------------

GENERAL_POOL = daemon_set(nodeSelector={"pool": "general"})


def test_nodes_outside_the_daemonset_are_excluded_with_their_reason() -> None:
    # Given a DaemonSet on the general pool, a general node, a GPU node and a tainted general node
    nodes = [node("general-1", {"pool": "general"}), node("gpu-1", {"pool": "gpu"}),
             node("general-2", {"pool": "general"}, taint("maintenance", "NoExecute"))]
    ds = daemon_set(nodeSelector={"pool": "general"}, tolerations=[{"key": "other", "operator": "Exists"}])

    selection = evaluate_nodes(Placement(), nodes, agents=AgentPlacement.of_daemon_set(ds))

    # Then only the general node with no taint pulls; the others say why no agent runs there
    assert selection.selected == ["general-1"]
    assert selection.excluded == [
        ExcludedNode("general-2", f"taint maintenance:NoExecute not tolerated by the agent DaemonSet: {NONE}"),
        ExcludedNode("gpu-1", f"outside the agent DaemonSet's nodeSelector (pool=general): {NONE}"),
    ]


def test_without_the_daemonset_nodes_are_selected_as_before() -> None:
    nodes = [node("general-1", {"pool": "general"}), node("gpu-1", {"pool": "gpu"})]
    assert evaluate_nodes(Placement(), nodes).selected == ["general-1", "gpu-1"]


def test_a_named_node_outside_the_daemonset_gets_its_reason_not_a_silent_skip() -> None:
    from prewarm.domain.jobs import ImagePullJob

    job = ImagePullJob.from_manifest({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                                      "metadata": {"name": "web"},
                                      "spec": {"image": "nginx:1.27", "selector": {"names": ["gpu-1", "general-1"]}}})
    nodes = [node("general-1", {"pool": "general"}), node("gpu-1", {"pool": "gpu"})]

    selection = evaluate_nodes(job.placement, nodes, agents=AgentPlacement.of_daemon_set(GENERAL_POOL))

    assert selection.selected == ["general-1"]
    assert selection.excluded == [
        ExcludedNode("gpu-1", f"outside the agent DaemonSet's nodeSelector (pool=general): {NONE}")]


def test_fargate_and_windows_keep_their_own_reason_before_the_daemonsets() -> None:
    nodes = [node("fargate-1", {"eks.amazonaws.com/compute-type": "fargate"}),
             node("win-1", {"kubernetes.io/os": "windows"})]
    selection = evaluate_nodes(Placement(), nodes, agents=AgentPlacement.of_daemon_set(shipped_daemon_set()))
    assert [e.reason for e in selection.excluded] == [
        "Fargate node: no node containerd for the agent", "Windows node: the agent runs on Linux nodes only"]


def test_a_node_that_is_not_ready_says_so_rather_than_name_the_taints_that_come_with_it() -> None:
    unreachable = node("arm-1", {"pool": "general"}, taint("node.kubernetes.io/unreachable", "NoSchedule"),
                       taint("node.kubernetes.io/unreachable", "NoExecute"))
    unreachable["status"]["conditions"][0]["status"] = "Unknown"
    ds = daemon_set(tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert misfit(ds, unreachable) == \
        f"taint node.kubernetes.io/unreachable:NoSchedule not tolerated by the agent DaemonSet: {NONE}"
    selection = evaluate_nodes(Placement(), [unreachable], agents=AgentPlacement.of_daemon_set(ds))
    assert selection.excluded == [ExcludedNode("arm-1", "node is not Ready")]
