"""Seeding from files (the sample EKS cluster, kubectl-style Lists, multi-document YAML, JSON)
and from generated clusters, read back through the typed client."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api

from prewarm_devtools.kubeapi import KubeApiServer, SeedError
from prewarm_devtools.kubeapi.synthetic import generate_cluster, generate_nodes
from tests.support.kube import SAMPLE_CLUSTER, call, node, pod

pytestmark = pytest.mark.integration

EKS_NODE_LABELS = (
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/hostname",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "eks.amazonaws.com/nodegroup",
    "eks.amazonaws.com/capacityType",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
)


def test_sample_cluster_is_a_small_eks_cluster(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    # Given the sample cluster file, When it is seeded and read through the typed client
    assert kube_api.seed_from_file(SAMPLE_CLUSTER) == 24
    nodes = core_v1.list_node().items
    # Then there are 12 nodes: three managed node groups and one virtual-kubelet node
    assert len(nodes) == 12
    groups = Counter(n.metadata.labels.get("eks.amazonaws.com/nodegroup") for n in nodes)
    assert groups == {"general-amd64": 5, "general-arm64": 4, "gpu": 2, None: 1}
    managed = [n for n in nodes if "eks.amazonaws.com/nodegroup" in n.metadata.labels]
    types = {
        n.metadata.labels["eks.amazonaws.com/nodegroup"]: n.metadata.labels["node.kubernetes.io/instance-type"]
        for n in managed
    }
    assert types == {"general-amd64": "m6i.2xlarge", "general-arm64": "m7g.2xlarge", "gpu": "g5.2xlarge"}
    for n in managed:
        assert all(label in n.metadata.labels for label in EKS_NODE_LABELS), n.metadata.name
        assert n.metadata.name.startswith("ip-10-0-") and n.metadata.name.endswith(".us-west-2.compute.internal")
        assert n.status.node_info.container_runtime_version.startswith("containerd://")
        assert n.status.images and all(i.size_bytes > 0 for i in n.status.images)
    virtual = [n for n in nodes if n.metadata.labels.get("type") == "virtual-kubelet"]
    assert len(virtual) == 1
    gpu_taints = {
        (t.key, t.value, t.effect)
        for n in nodes
        if n.metadata.labels.get("eks.amazonaws.com/nodegroup") == "gpu"
        for t in n.spec.taints
    }
    assert gpu_taints == {("nvidia.com/gpu", "true", "NoSchedule")}
    ready = Counter(next(c.status for c in n.status.conditions if c.type == "Ready") for n in nodes)
    assert ready == {"True": 11, "Unknown": 1}


def test_sample_cluster_pods_are_scheduled_across_nodes(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    kube_api.seed_from_file(SAMPLE_CLUSTER)
    node_names = {n.metadata.name for n in core_v1.list_node().items}
    inference = core_v1.list_namespaced_pod("ml", label_selector="app=inference").items
    web = core_v1.list_namespaced_pod("shop", label_selector="app=web").items
    assert Counter(p.status.phase for p in inference) == {"Running": 2, "Pending": 1}
    assert Counter(p.status.phase for p in web) == {"Running": 4, "Succeeded": 1}
    for p in inference + web:
        assert (p.spec.node_name in node_names) if p.status.phase != "Pending" else p.spec.node_name is None
    assert (
        core_v1.list_pod_for_all_namespaces(field_selector="status.phase=Pending").items[0].metadata.namespace == "ml"
    )
    account = core_v1.read_namespaced_service_account("web", "shop")
    assert [s.name for s in account.image_pull_secrets] == ["ecr-pull"]
    assert core_v1.read_namespaced_secret("ecr-pull", "shop").type == "kubernetes.io/dockerconfigjson"


def test_seeding_renews_resource_versions_and_keeps_identity(kube_api: KubeApiServer) -> None:
    kube_api.seed_from_file(SAMPLE_CLUSTER)
    listed = yaml.safe_load(SAMPLE_CLUSTER.read_text())["items"]
    in_file = next(o for o in listed if o["kind"] == "Namespace" and o["metadata"]["name"] == "ml")["metadata"]
    stored = kube_api.get_object("namespaces", "ml")
    assert stored is not None
    assert stored["metadata"]["uid"] == in_file["uid"]
    assert stored["metadata"]["creationTimestamp"] == in_file["creationTimestamp"]
    assert stored["metadata"]["resourceVersion"] != in_file["resourceVersion"]
    assert int(stored["metadata"]["resourceVersion"]) <= kube_api.resource_version


def test_seeding_a_kubectl_list_with_typed_lists_and_documents(
    tmp_path: Path, kube_api: KubeApiServer, core_v1: CoreV1Api
) -> None:
    # Given a kubectl-style List holding a NodeList whose items have no kind (as the API returns them)
    node_list = {
        "apiVersion": "v1",
        "kind": "NodeList",
        "items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}],
    }
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [node_list, pod("web-1", "shop", "n1")],
    }
    first = tmp_path / "cluster.yaml"
    first.write_text(yaml.safe_dump(listing) + "---\n" + yaml.safe_dump(node("n3")) + "---\n")
    second = tmp_path / "more.json"
    second.write_text(json.dumps({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "extra"}}))
    # When both files are seeded
    assert kube_api.seed_from_file(first) == 4
    assert kube_api.seed_from_file(second) == 1
    # Then everything is served, the pod's namespace made on the way
    assert [n.metadata.name for n in core_v1.list_node().items] == ["n1", "n2", "n3"]
    assert core_v1.read_namespaced_pod("web-1", "shop").status.phase == "Running"
    assert {"shop", "extra"} <= {n.metadata.name for n in core_v1.list_namespace().items}


def test_seeding_again_replaces_the_object(kube_api: KubeApiServer, core_v1: CoreV1Api) -> None:
    kube_api.seed_objects([node("n1", {"v": "1"})])
    uid = core_v1.read_node("n1").metadata.uid
    kube_api.seed_objects([node("n1", {"v": "2"})])
    again = core_v1.read_node("n1")
    assert (again.metadata.labels, again.metadata.uid) == ({"v": "2"}, uid)


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([{"kind": "Deployment", "metadata": {"name": "x"}}], "object #0 has kind 'Deployment'"),
        ([{"kind": "Node", "metadata": {}}], "Node #0 has no metadata.name"),
        (
            [{"kind": "Node", "metadata": {"name": "Bad_Name"}}],
            "Node 'Bad_Name' is invalid: metadata.name: Invalid value",
        ),
    ],
)
def test_unusable_seed_objects_are_refused_with_the_reason(
    kube_api: KubeApiServer, objects: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(SeedError, match="^" + re.escape(message)):
        kube_api.seed_objects(objects)


def test_seed_file_that_is_not_yaml_is_refused(tmp_path: Path, kube_api: KubeApiServer) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("items: [unclosed")
    with pytest.raises(SeedError, match="is not valid YAML"):
        kube_api.seed_from_file(broken)


def test_generator_makes_5000_realistic_nodes() -> None:
    # When generating 5,000 nodes
    nodes = generate_nodes(5000, seed=11)
    # Then every name is unique, nodes spread over groups, zones and architectures
    names = [n["metadata"]["name"] for n in nodes]
    assert len(nodes) == 5000 == len(set(names))
    labels = [n["metadata"]["labels"] for n in nodes]
    assert Counter(lab["eks.amazonaws.com/nodegroup"] for lab in labels) == {
        "general-amd64": 2250,
        "general-arm64": 1500,
        "gpu": 750,
        "batch-spot": 500,
    }
    assert set(Counter(lab["topology.kubernetes.io/zone"] for lab in labels)) == {
        "us-west-2a",
        "us-west-2b",
        "us-west-2c",
    }
    assert {lab["kubernetes.io/arch"] for lab in labels} == {"amd64", "arm64"}
    # And each looks like an EKS node: ~20 labels, ~10 images with digests, full status
    assert all(18 <= len(lab) <= 22 for lab in labels)
    for n in nodes[::250]:
        status = n["status"]
        assert 10 <= len(status["images"]) <= 14
        assert all(len(i["names"][0].split("@sha256:")[1]) == 64 and i["sizeBytes"] > 0 for i in status["images"])
        assert [c["type"] for c in status["conditions"]] == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        assert {a["type"] for a in status["addresses"]} == {"InternalIP", "InternalDNS", "Hostname"}
        assert set(status["capacity"]) >= {"cpu", "memory", "pods", "ephemeral-storage"}
        assert status["nodeInfo"]["kubeletVersion"].startswith("v1.")
    assert generate_nodes(3, seed=11) != generate_nodes(3, seed=12)
    assert generate_nodes(3, seed=11) == generate_nodes(3, seed=11)


def test_generated_cluster_is_served_and_deserialised_by_the_typed_client(
    kube_api: KubeApiServer, core_v1: CoreV1Api
) -> None:
    kube_api.seed_objects(generate_cluster(40, seed=2, pods_per_node=2))
    nodes = core_v1.list_node(label_selector="eks.amazonaws.com/nodegroup=gpu").items
    assert len(nodes) == 6
    assert all(n.status.capacity["nvidia.com/gpu"] == "1" for n in nodes)
    pods = core_v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={nodes[0].metadata.name}").items
    assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods)


def test_raw_list_of_a_generated_cluster_matches_the_typed_one(kube_api: KubeApiServer, kube_client: object) -> None:
    kube_api.seed_objects(generate_nodes(300, seed=5))
    raw = call(kube_client, "GET", "/api/v1/nodes").body
    assert raw["kind"] == "NodeList" and len(raw["items"]) == 300
    assert raw["items"] == kube_api.list_objects("nodes")
