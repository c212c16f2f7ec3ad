"""A job leaves out the nodes the agent DaemonSet does not run on, read as dispatch reads it; and when it
cannot be read, the job selects as before and its message says so."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import ClusterAuthError, ClusterUnavailableError
from prewarm_cli.output import describe_job
from tests.support.cluster import make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

AGENTS = ("prewarm-system", "prewarm-agent")
NO_AGENT = "no agent runs here"


def plan(plane: ControlPlane) -> Any:
    plane.start_agents()
    return plan_job(plane.store, plane.cluster, plane.queues, "default/warm", now=plane.now())


def on_pools(plane: ControlPlane, *pools: str) -> None:
    """The agent DaemonSet runs on nodes of these pools only (its nodeSelector, or node affinity for several)."""
    spec = plane.cluster.daemon_sets[AGENTS]["spec"]["template"]["spec"]
    if len(pools) == 1:
        spec["nodeSelector"] = {"pool": pools[0]}
    else:
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
            "matchExpressions"].append({"key": "pool", "operator": "In", "values": list(pools)})


def excluded(plane: ControlPlane) -> dict[str, str]:
    return {e.name: e.reason for e in plane.store.get_excluded("default/warm")}


def test_nodes_outside_the_daemonset_get_no_task_and_are_excluded_with_their_reason(plane: ControlPlane) -> None:
    # Given agents on the general pool only, and a GPU node tainted for its own pods
    plane.cluster.nodes += [make_node("general-1", pool="general"), make_node("gpu-1", pool="gpu")]
    tainted = make_node("general-2", pool="general")
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
    plane.cluster.nodes.append(tainted)
    on_pools(plane, "general")
    plane.cluster.daemon_sets[AGENTS]["spec"]["template"]["spec"]["tolerations"] = []
    apply_manifest(plane.store, job_doc(parallelism=5), now=plane.now())

    result = plan(plane)

    # Then only the general node gets a task; the others are excluded, each saying why no agent runs there
    assert (result.selected, result.excluded) == (1, 2)
    assert [m.node for m in plane.node_messages("general-1")] == ["general-1"]
    assert plane.node_messages("gpu-1") == [] and plane.node_messages("general-2") == []
    assert excluded(plane) == {
        "gpu-1": f"outside the agent DaemonSet's nodeSelector (pool=general): {NO_AGENT}",
        "general-2": f"taint dedicated=ml:NoSchedule not tolerated by the agent DaemonSet: {NO_AGENT}"}
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job is running, progress 0.0%"


def test_the_shipped_daemonset_takes_every_linux_node_whatever_its_taints(plane: ControlPlane) -> None:
    tainted = make_node("gpu-1", pool="gpu")
    tainted["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                  {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}]}
    plane.cluster.nodes += [make_node("general-1"), tainted]
    apply_manifest(plane.store, job_doc(parallelism=5), now=plane.now())

    assert plan(plane).selected == 2
    assert excluded(plane) == {}


def test_named_nodes_no_agent_runs_on_get_their_reason_in_the_jobs_message_and_describe(plane: ControlPlane) -> None:
    # Given a job that names a general node, a GPU node outside the DaemonSet, a Fargate node and a Windows node
    fargate = make_node("fargate-ip-10-0-1-1", **{"eks.amazonaws.com/compute-type": "fargate"})
    windows = make_node("win-1", **{"kubernetes.io/os": "windows"})
    plane.cluster.nodes += [make_node("general-1", pool="general"), make_node("gpu-1", pool="gpu"), fargate, windows]
    on_pools(plane, "general", "batch")
    names = ["general-1", "gpu-1", "fargate-ip-10-0-1-1", "win-1"]
    apply_manifest(plane.store, job_doc(selector={"names": names}, parallelism=5), now=plane.now())

    plan(plane)

    # Then each named node no agent runs on is excluded with its reason, not skipped in silence
    assert excluded(plane) == {
        "gpu-1": f"outside the agent DaemonSet's node affinity (pool In [general, batch]): {NO_AGENT}",
        "fargate-ip-10-0-1-1": "Fargate node: no node containerd for the agent",
        "win-1": "Windows node: the agent runs on Linux nodes only"}
    view = view_job(plane.store, "default", "warm", now=plane.now(), with_tasks=True)
    assert view.desired == 1
    assert view.message == ("job is running, progress 0.0%; 3 named nodes excluded: fargate-ip-10-0-1-1 "
                            "(Fargate node: no node containerd for the agent) and 2 more")
    text = describe_job(view, now=plane.now())
    assert "Excluded Nodes (3):" in text
    gpu_row = next(line for line in text.splitlines() if line.strip().startswith("gpu-1"))
    assert f"outside the agent DaemonSet's node affinity (pool In [general, batch]): {NO_AGENT}" in gpu_row


def test_one_named_node_outside_the_daemonset_is_the_jobs_message(plane: ControlPlane) -> None:
    plane.cluster.nodes += [make_node("gpu-1", pool="gpu")]
    on_pools(plane, "general")
    apply_manifest(plane.store, job_doc(selector={"names": ["gpu-1"]}), now=plane.now())

    plan(plane)

    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert (view.desired, view.message) == (0, "job has completed; named node gpu-1 excluded: outside the agent "
                                                f"DaemonSet's nodeSelector (pool=general): {NO_AGENT}")


@pytest.mark.parametrize(("broken", "note"), [
    (ClusterAuthError('daemonsets.apps "prewarm-agent" is forbidden', status=403, reason="Forbidden"),
     "nodes without an agent not excluded: cannot read DaemonSet prewarm-system/prewarm-agent "
     "(Forbidden; run prewarm install)"),
    (None, "nodes without an agent not excluded: no DaemonSet prewarm-system/prewarm-agent (run prewarm install)"),
])
def test_an_unreadable_daemonset_selects_as_before_and_says_so_in_the_jobs_message(
        plane: ControlPlane, broken: ClusterAuthError | None, note: str) -> None:
    # Given agents on the general pool, but a DaemonSet the dispatch function cannot read (or none)
    plane.cluster.nodes += [make_node("general-1", pool="general"), make_node("gpu-1", pool="gpu")]
    on_pools(plane, "general")
    if broken is None:
        plane.cluster.daemon_sets.clear()
    plane.cluster.daemon_set_error = broken
    apply_manifest(plane.store, job_doc(parallelism=5), now=plane.now())

    result = plan(plane)

    # Then the job selects as it did before the check (a node with no agent fails `no agent on node` later)
    assert (result.selected, result.excluded) == (2, 0)
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == f"job is running, progress 0.0%; {note}"

    # And once the DaemonSet can be read, the next plan leaves the GPU node out and the note goes
    plane.cluster.daemon_set_error = None
    plane.cluster.daemon_sets[AGENTS] = plane.cluster.daemon_sets.get(AGENTS) or _general_pool_daemon_set()
    apply_manifest(plane.store, job_doc(parallelism=4), now=plane.now())
    plan(plane)
    assert excluded(plane) == {"gpu-1": f"outside the agent DaemonSet's nodeSelector (pool=general): {NO_AGENT}"}
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job is running, progress 0.0%"


def _general_pool_daemon_set() -> dict[str, Any]:
    from tests.support.cluster import shipped_daemon_set

    daemon_set = shipped_daemon_set()
    daemon_set["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "general"}
    return daemon_set


def test_a_daemonset_read_that_is_throttled_fails_the_plan_for_a_retry(plane: ControlPlane) -> None:
    plane.cluster.nodes.append(make_node("general-1"))
    plane.cluster.daemon_set_error = ClusterUnavailableError("429 TooManyRequests", status=429)
    apply_manifest(plane.store, job_doc(), now=plane.now())

    with pytest.raises(ClusterUnavailableError):
        plan(plane)

    record = plane.store.get_job("default/warm")
    assert record is not None and not record.is_planned
