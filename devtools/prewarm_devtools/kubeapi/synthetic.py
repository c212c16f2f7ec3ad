"""Realistic EKS-like objects in bulk: nodes of managed node groups as the kubelet and the AWS
cloud provider label and report them, and pods scheduled on them.

Deterministic for a given `seed`. Fast: per-group templates are built once; a node is a few
fresh dicts around them (5,000 nodes take well under a second).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

ECR_SYSTEM = "602401143452.dkr.ecr.{region}.amazonaws.com"
KUBELET_VERSION = "v1.33.5-eks-113cf36"
CONTAINERD_VERSION = "containerd://1.7.27"
OS_IMAGE = "Amazon Linux 2023.8.20250818"
KERNEL = {"amd64": "6.1.147-172.266.amzn2023.x86_64", "arm64": "6.1.147-172.266.amzn2023.aarch64"}
ZONE_IDS = ("az1", "az2", "az3", "az4")
_BASE_TIME = 1_760_000_000  # 2025-10-09: creation times are spread over the 30 days before it.
_GIB_KI = 1024 * 1024


@dataclass(frozen=True)
class NodeGroup:
    """An EKS managed node group: instance type, architecture, share of the nodes, taints."""

    name: str
    instance_type: str
    arch: str
    weight: float
    vcpus: int
    memory_gib: int
    max_pods: int
    gpus: int = 0
    accelerator: str = ""
    capacity_type: str = "ON_DEMAND"
    taints: tuple[Obj, ...] = ()


DEFAULT_NODE_GROUPS: tuple[NodeGroup, ...] = (
    NodeGroup("general-amd64", "m6i.2xlarge", "amd64", 0.45, vcpus=8, memory_gib=32, max_pods=58),
    NodeGroup("general-arm64", "m7g.2xlarge", "arm64", 0.30, vcpus=8, memory_gib=32, max_pods=58),
    NodeGroup(
        "gpu",
        "g5.2xlarge",
        "amd64",
        0.15,
        vcpus=8,
        memory_gib=32,
        max_pods=58,
        gpus=1,
        accelerator="nvidia-a10g",
        taints=({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},),
    ),
    NodeGroup("batch-spot", "c6i.4xlarge", "amd64", 0.10, vcpus=16, memory_gib=32, max_pods=234, capacity_type="SPOT"),
)

# (repository, tag, size in bytes, which node groups pull it: "*" for all, or a group name prefix)
_IMAGES: tuple[tuple[str, str, int, str], ...] = (
    ("{ecr}/amazon-k8s-cni", "v1.20.1-eksbuild.3", 47_912_331, "*"),
    ("{ecr}/amazon-k8s-cni-init", "v1.20.1-eksbuild.3", 62_447_509, "*"),
    ("{ecr}/amazon/aws-network-policy-agent", "v1.2.5-eksbuild.1", 32_601_886, "*"),
    ("{ecr}/eks/kube-proxy", "v1.33.3-minimal-eksbuild.6", 31_342_806, "*"),
    ("{ecr}/eks/pause", "3.10", 318_731, "*"),
    ("{ecr}/eks/aws-ebs-csi-driver", "v1.48.0", 78_132_004, "*"),
    ("{ecr}/eks/csi-node-driver-registrar", "v2.14.0-eks-1-33-5", 9_124_887, "*"),
    ("{ecr}/eks/livenessprobe", "v2.16.0-eks-1-33-5", 8_551_210, "*"),
    ("{ecr}/eks/eks-pod-identity-agent", "v0.1.31", 16_874_223, "*"),
    ("{ecr}/eks/coredns", "v1.12.3-eksbuild.1", 23_704_112, "general"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/shop/web", "2025.10.2", 187_334_907, "general"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/shop/web", "2025.10.1", 187_290_114, "general"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/shop/cart", "3.4.0", 96_210_553, "general"),
    ("public.ecr.aws/docker/library/redis", "7.4.6", 41_023_998, "general"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/ml/inference", "1.8.0-cuda12.4", 9_874_322_101, "gpu"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/ml/inference", "1.7.3-cuda12.4", 9_866_001_448, "gpu"),
    ("nvcr.io/nvidia/k8s-device-plugin", "v0.17.4", 132_551_830, "gpu"),
    ("nvcr.io/nvidia/gpu-operator/dcgm-exporter", "4.2.3-4.1.3-ubuntu22.04", 1_201_334_008, "gpu"),
    ("123456789012.dkr.ecr.{region}.amazonaws.com/batch/etl", "0.19.2", 412_908_331, "batch"),
    ("public.ecr.aws/aws-observability/aws-for-fluent-bit", "2.34.2", 98_776_102, "*"),
)


def _hex(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _quantities(group: NodeGroup) -> tuple[Obj, Obj]:
    memory_ki = group.memory_gib * _GIB_KI * 97 // 100  # what the kernel leaves to the kubelet
    # EKS kube-reserved: 255Mi + 11Mi per pod, plus 100Mi eviction threshold.
    reserved_ki = (255 + 11 * group.max_pods + 100) * 1024
    cpu_reserved_m = 60 + 10 * max(0, group.vcpus - 1) if group.vcpus > 1 else 60
    capacity = {
        "cpu": str(group.vcpus),
        "ephemeral-storage": "83873772Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{memory_ki}Ki",
        "pods": str(group.max_pods),
    }
    allocatable = {
        "cpu": f"{group.vcpus * 1000 - cpu_reserved_m}m",
        "ephemeral-storage": "76224326324",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{memory_ki - reserved_ki}Ki",
        "pods": str(group.max_pods),
    }
    if group.gpus:
        capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(group.gpus)
    return capacity, allocatable


class _GroupTemplate:
    """What all nodes of a group share, computed once."""

    def __init__(self, group: NodeGroup, region: str, rng: random.Random, images: list[tuple[Obj, str]]) -> None:
        self.group = group
        ami = "ami-0" + _hex(rng, 64)[:16]
        launch_template = "lt-0" + _hex(rng, 64)[:16]
        self.labels = {
            "beta.kubernetes.io/arch": group.arch,
            "beta.kubernetes.io/instance-type": group.instance_type,
            "beta.kubernetes.io/os": "linux",
            "eks.amazonaws.com/capacityType": group.capacity_type,
            "eks.amazonaws.com/nodegroup": group.name,
            "eks.amazonaws.com/nodegroup-image": ami,
            "eks.amazonaws.com/sourceLaunchTemplateId": launch_template,
            "eks.amazonaws.com/sourceLaunchTemplateVersion": "1",
            "failure-domain.beta.kubernetes.io/region": region,
            "k8s.io/cloud-provider-aws": _hex(rng, 128),
            "kubernetes.io/arch": group.arch,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": group.instance_type,
            "topology.kubernetes.io/region": region,
        }
        if group.accelerator:
            self.labels["k8s.amazonaws.com/accelerator"] = group.accelerator
            self.labels["nvidia.com/gpu.present"] = "true"
        self.capacity, self.allocatable = _quantities(group)
        self.taints = [dict(t) for t in group.taints]
        prefix = group.name.split("-")[0]
        self.always = [i for i, where in images if where == "*"]
        self.optional = [i for i, where in images if where != "*" and prefix.startswith(where)]
        self.node_info = {
            "architecture": group.arch,
            "containerRuntimeVersion": CONTAINERD_VERSION,
            "kernelVersion": KERNEL[group.arch],
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "osImage": OS_IMAGE,
        }


def _image_entries(region: str, rng: random.Random) -> list[tuple[Obj, str]]:
    entries = []
    for repository, tag, size, where in _IMAGES:
        repo = repository.format(ecr=ECR_SYSTEM.format(region=region), region=region)
        digest = "sha256:" + _hex(rng, 256)
        entries.append(({"names": [f"{repo}@{digest}", f"{repo}:{tag}"], "sizeBytes": size}, where))
    return entries


def _pick_groups(n_nodes: int, groups: Sequence[NodeGroup]) -> list[NodeGroup]:
    total = sum(g.weight for g in groups)
    counts = [int(n_nodes * g.weight / total) for g in groups]
    for i in range(n_nodes - sum(counts)):
        counts[i % len(groups)] += 1
    return [g for g, count in zip(groups, counts, strict=True) for _ in range(count)]


def generate_nodes(
    n_nodes: int,
    seed: int = 0,
    *,
    node_groups: Sequence[NodeGroup] = DEFAULT_NODE_GROUPS,
    region: str = "us-west-2",
    zones: Sequence[str] = ("a", "b", "c"),
) -> list[Obj]:
    """`n_nodes` Ready nodes spread over `node_groups` (by weight) and `zones`, sorted by name."""
    if n_nodes < 0:
        raise ValueError(f"n_nodes must not be negative, got {n_nodes}")
    if not node_groups:
        raise ValueError("node_groups must name at least one node group")
    rng = random.Random(seed)
    images = _image_entries(region, rng)
    templates = {g.name: _GroupTemplate(g, region, rng, images) for g in node_groups}
    per_zone = (n_nodes + len(zones) - 1) // max(1, len(zones))
    # Each zone's subnet is a /18: 10.0.64*z.0 onwards; host addresses drawn without repeats.
    offsets = [rng.sample(range(2, 64 * 256 - 2), per_zone) for _ in zones]
    nodes = []
    for index, group in enumerate(_pick_groups(n_nodes, node_groups)):
        zone_index = index % len(zones)
        offset = offsets[zone_index][index // len(zones)]
        ip = f"10.0.{64 * zone_index + offset // 256}.{offset % 256}"
        nodes.append(_node(templates[group.name], rng, region, zones[zone_index], zone_index, ip))
    nodes.sort(key=lambda n: n["metadata"]["name"])
    return nodes


def _node(template: _GroupTemplate, rng: random.Random, region: str, zone_letter: str, zone_index: int, ip: str) -> Obj:
    zone = f"{region}{zone_letter}"
    hostname = f"ip-{ip.replace('.', '-')}.{region}.compute.internal"
    instance = "i-0" + _hex(rng, 64)[:16]
    created = _BASE_TIME - rng.randrange(30 * 86400)
    heartbeat = _time(_BASE_TIME - rng.randrange(40))
    started = _time(created + 35)
    labels = dict(template.labels)
    labels["failure-domain.beta.kubernetes.io/zone"] = zone
    labels["kubernetes.io/hostname"] = hostname
    labels["topology.ebs.csi.aws.com/zone"] = zone
    labels["topology.k8s.aws/zone-id"] = f"{region[:2]}{region.split('-')[1][0]}{region[-1]}-{ZONE_IDS[zone_index % 4]}"
    labels["topology.kubernetes.io/zone"] = zone
    chosen = template.always + rng.sample(template.optional, min(len(template.optional), rng.randint(1, 4)))
    spec: Obj = {"providerID": f"aws:///{zone}/{instance}"}
    if template.taints:
        spec["taints"] = [dict(t) for t in template.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": hostname,
            "uid": _uid(rng),
            "creationTimestamp": _time(created),
            "labels": labels,
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "csi.volume.kubernetes.io/nodeid": f'{{"ebs.csi.aws.com":"{instance}"}}',
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "InternalDNS", "address": hostname},
                {"type": "Hostname", "address": hostname},
            ],
            "allocatable": dict(template.allocatable),
            "capacity": dict(template.capacity),
            "conditions": [
                _condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                    heartbeat,
                    started,
                ),
                _condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                    heartbeat,
                    started,
                ),
                _condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                    heartbeat,
                    started,
                ),
                _condition(
                    "Ready", "True", "KubeletReady", "kubelet is posting ready status", heartbeat, _time(created + 52)
                ),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": [{"names": list(i["names"]), "sizeBytes": i["sizeBytes"]} for i in chosen],
            "nodeInfo": {
                **template.node_info,
                "bootID": _uid(rng),
                "machineID": _hex(rng, 128),
                "systemUUID": "ec2" + _uid(rng)[3:],
            },
        },
    }


def _condition(kind: str, status: str, reason: str, message: str, heartbeat: str, transition: str) -> Obj:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message,
    }


def pod(
    name: str,
    namespace: str,
    app: str,
    image: str,
    node: Obj | None,
    *,
    phase: str = "Running",
    seed: int = 0,
    requests: Obj | None = None,
    tolerations: Sequence[Obj] = (),
    service_account: str = "default",
) -> Obj:
    """A pod of `app` as the API returns it: scheduled on `node` (None: Pending, unschedulable)."""
    rng = random.Random(f"{namespace}/{name}/{seed}")
    created = _BASE_TIME - rng.randrange(7 * 86400)
    container: Obj = {
        "name": app,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": dict(requests or {"cpu": "250m", "memory": "256Mi"})},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    spec: Obj = {
        "containers": [container],
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Never" if phase == "Succeeded" else "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "serviceAccount": service_account,
        "serviceAccountName": service_account,
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            *[dict(t) for t in tolerations],
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    status: Obj = {"phase": phase, "qosClass": "Burstable"}
    if node is None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": _time(created),
                "reason": "Unschedulable",
                "message": "0/12 nodes are available: 2 Insufficient nvidia.com/gpu, 10 node(s) didn't match "
                "Pod's node affinity/selector. preemption: 0/12 nodes are available: 12 Preemption is not "
                "helpful for scheduling.",
            }
        ]
    else:
        spec["nodeName"] = node["metadata"]["name"]
        host_ip = node["status"]["addresses"][0]["address"]
        pod_ip = f"{host_ip.rsplit('.', 1)[0]}.{rng.randrange(2, 254)}"
        running = phase == "Running"
        started = _time(created + 9)
        state: Obj = (
            {"running": {"startedAt": started}}
            if running
            else {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": _time(created + 71),
                }
            }
        )
        status.update(
            hostIP=host_ip,
            hostIPs=[{"ip": host_ip}],
            podIP=pod_ip,
            podIPs=[{"ip": pod_ip}],
            startTime=_time(created),
            conditions=[
                {
                    "type": kind,
                    "status": "True" if running or kind in ("Initialized", "PodScheduled") else "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": _time(created + 9),
                }
                for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            containerStatuses=[
                {
                    "name": app,
                    "image": image,
                    "imageID": image.split(":")[0] + "@sha256:" + _hex(rng, 256),
                    "containerID": "containerd://" + _hex(rng, 256),
                    "ready": running,
                    "started": running,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid(rng),
            "creationTimestamp": _time(created),
            "labels": {"app": app, "app.kubernetes.io/name": app},
        },
        "spec": spec,
        "status": status,
    }


def generate_cluster(
    n_nodes: int,
    seed: int = 0,
    *,
    node_groups: Sequence[NodeGroup] = DEFAULT_NODE_GROUPS,
    region: str = "us-west-2",
    zones: Sequence[str] = ("a", "b", "c"),
    pods_per_node: int = 0,
    namespace: str = "workloads",
) -> list[Obj]:
    """Nodes (see `generate_nodes`), then, if `pods_per_node`, a namespace and that many Running
    pods on every node (`app` labels `app-0`... cycle over ten apps)."""
    nodes = generate_nodes(n_nodes, seed, node_groups=node_groups, region=region, zones=zones)
    if not pods_per_node:
        return nodes
    objects: list[Obj] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, *nodes]
    for n, node in enumerate(nodes):
        for p in range(pods_per_node):
            app = f"app-{(n + p) % 10}"
            image = f"123456789012.dkr.ecr.{region}.amazonaws.com/{app}:1.{p % 3}.0"
            objects.append(pod(f"{app}-{n:05d}-{p}", namespace, app, image, node, seed=seed))
    return objects
