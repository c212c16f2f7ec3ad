"""Local mode's DaemonSet controller and kubelet for the agent DaemonSet (`prewarm_devtools.daemonset`),
against the embedded API with exactly what `prewarm install` applies: one pod per node the template
fits, Ready as that node's agent runs, and the DaemonSet's status counted as the controller counts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm_cli.doctor.checks import check_agent_daemonset
from prewarm_cli.install.apply import install
from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE, InstallValues, render
from prewarm_devtools.daemonset import AgentDaemonSet, AgentState
from prewarm_devtools.kubeapi.server import KubeApiServer

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[3] / "samplefiles" / "cluster.yaml"
FARGATE = "fargate-ip-10-0-140-7.us-west-2.compute.internal"
NOT_READY = "ip-10-0-90-150.us-west-2.compute.internal"
GPU = "ip-10-0-127-36.us-west-2.compute.internal"


def values(image: str = "prewarm-agent:local") -> InstallValues:
    return InstallValues(region="us-west-2", status_queue_url="http://sqs/1/status", node_queue_prefix="pw-node",
                         node_dlq_arn="arn:aws:sqs:us-west-2:1:dlq", secret_prefix="prewarm/pw", image=image,
                         agent_role_arn="arn:aws:iam::123456789012:role/agents")


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.seed_from_file(SAMPLE)
        with KubeCluster(server.url, lambda: server.token) as cluster:
            install(cluster, render(values()))
        yield server


@pytest.fixture
def states() -> dict[str, AgentState]:
    return {}


@pytest.fixture
def controller(api: KubeApiServer, states: dict[str, AgentState]) -> AgentDaemonSet:
    return AgentDaemonSet(api, lambda node: states.get(node, AgentState.RUNNING), namespace=AGENT_NAMESPACE,
                          name=AGENT_NAME)


def pods(api: KubeApiServer) -> dict[str, dict[str, Any]]:
    return {p["spec"]["nodeName"]: p for p in api.list_objects("pods", AGENT_NAMESPACE)}


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])


def test_every_node_the_template_fits_gets_one_pod_bound_to_it_and_owned_by_the_daemonset(
        api: KubeApiServer, controller: AgentDaemonSet) -> None:
    controller.reconcile()

    found = pods(api)
    nodes = {n["metadata"]["name"] for n in api.list_objects("nodes")}
    # The Fargate node fails the template's node affinity; the tainted GPU and unreachable nodes are tolerated.
    assert set(found) == nodes - {FARGATE} and GPU in found and NOT_READY in found
    daemon_set = api.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    assert daemon_set is not None
    pod = found[GPU]
    assert pod["metadata"]["name"].startswith(f"{AGENT_NAME}-")
    assert pod["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": AGENT_NAME, "uid": daemon_set["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == AGENT_NAME and labels["pod-template-generation"] == "1"
    assert pod["spec"]["serviceAccountName"] == AGENT_NAME and pod["spec"]["containers"][0]["name"] == "agent"


def test_a_pod_is_ready_while_its_agent_runs_and_says_how_it_stopped_otherwise(
        api: KubeApiServer, controller: AgentDaemonSet, states: dict[str, AgentState]) -> None:
    nodes = sorted(n["metadata"]["name"] for n in api.list_objects("nodes")
                   if n["metadata"]["name"] not in (FARGATE, NOT_READY))
    stopped, killed, absent = nodes[:3]
    states.update({stopped: AgentState.STOPPED, killed: AgentState.KILLED, absent: AgentState.ABSENT,
                   NOT_READY: AgentState.ABSENT})

    controller.reconcile()

    found = pods(api)
    assert ready(found[nodes[3]]) and found[nodes[3]]["status"]["phase"] == "Running"
    assert found[nodes[3]]["status"]["containerStatuses"][0]["state"].keys() == {"running"}
    assert not ready(found[stopped])
    assert found[stopped]["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert found[killed]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert found[absent]["status"]["phase"] == "Pending"

    # When the killed agent runs again, its pod is Ready and the container counts a restart
    states[killed] = AgentState.RUNNING
    controller.reconcile()
    again = pods(api)[killed]
    assert ready(again) and again["status"]["containerStatuses"][0]["restartCount"] == 1
    assert again["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137


def test_the_daemonset_status_counts_desired_scheduled_ready_and_available(
        api: KubeApiServer, controller: AgentDaemonSet, states: dict[str, AgentState]) -> None:
    states[NOT_READY] = AgentState.ABSENT
    controller.reconcile()

    daemon_set = api.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    assert daemon_set is not None
    assert daemon_set["status"] == {
        "currentNumberScheduled": 11, "numberMisscheduled": 0, "desiredNumberScheduled": 11, "numberReady": 10,
        "observedGeneration": 1, "updatedNumberScheduled": 11, "numberAvailable": 10, "numberUnavailable": 1}


def test_nothing_is_written_when_nothing_changed(api: KubeApiServer, controller: AgentDaemonSet) -> None:
    controller.reconcile()
    before = api.resource_version

    controller.reconcile()

    assert api.resource_version == before


def test_a_departed_node_loses_its_pod_and_an_uninstalled_daemonset_all_of_them(
        api: KubeApiServer, controller: AgentDaemonSet) -> None:
    controller.reconcile()
    api.remove_object("nodes", GPU)
    controller.reconcile()
    assert GPU not in pods(api) and len(pods(api)) == 10

    api.remove_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    controller.reconcile()
    assert pods(api) == {}


def test_a_new_template_replaces_every_pod(api: KubeApiServer, controller: AgentDaemonSet) -> None:
    controller.reconcile()
    first = {node: p["metadata"]["uid"] for node, p in pods(api).items()}

    with KubeCluster(api.url, lambda: api.token) as cluster:
        install(cluster, render(values(image="prewarm-agent:2")))
    controller.reconcile()

    found = pods(api)
    assert set(found) == set(first) and all(p["metadata"]["uid"] != first[n] for n, p in found.items())
    assert {p["metadata"]["labels"]["pod-template-generation"] for p in found.values()} == {"2"}
    assert {p["spec"]["containers"][0]["image"] for p in found.values()} == {"prewarm-agent:2"}
    daemon_set = api.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    assert daemon_set is not None and daemon_set["status"]["observedGeneration"] == 2


def test_the_doctor_reads_the_agents_readiness_from_the_pods(
        api: KubeApiServer, controller: AgentDaemonSet, states: dict[str, AgentState]) -> None:
    states[GPU] = AgentState.KILLED
    controller.reconcile()
    pod = pods(api)[GPU]["metadata"]["name"]

    with KubeCluster(api.url, lambda: api.token) as cluster:
        result, coverage = check_agent_daemonset(cluster, cluster.list_objects("v1", "nodes"))

    # The unreachable node is no node a job could select: only the killed agent is a problem
    assert result.line() == (
        f"FAIL  agent DaemonSet: not ready on 1 of 10 nodes: {GPU} "
        f"(pod {pod} not Ready: terminated (Error, exit 137)): "
        f"see `kubectl -n prewarm-system describe pod {pod}` and its logs; until it is ready, jobs fail that node "
        "with `no agent on node`")
    assert len(coverage.ready) == 9
