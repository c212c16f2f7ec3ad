"""Local mode's nodes: each a private containerd with its own agent, as the agent DaemonSet would run it.

An agent runs in this process (`InProcessAgent`), as a `python -m prewarm_agent` process, or as a
container of the agent image on its node's containerd, set up as the installed DaemonSet's pod; it signs
as the agents' role, or one of its own (`add_node(agent_policies=)`). `LocalNodes` holds what starts,
stops and answers for them; `LocalMode` (localmode.py) builds on it.
"""

from __future__ import annotations

import itertools
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm_devtools.account import ACCOUNT, REGION
from prewarm_devtools.localclusters import LocalCluster
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.sam.aws import LocalIdentity, MotoServer
from prewarm_devtools.sam.stack import LocalStack

log = logging.getLogger(__name__)


class LocalModeUnavailableError(RuntimeError):
    """This machine cannot run local mode as asked; the message says what is missing and how to get it."""


def missing_prerequisites() -> list[str]:
    """What local mode's nodes need and this machine lacks, each with how to get it."""
    from prewarm_devtools.node.containerd import ContainerdVersionError, containerd_missing

    problems = []
    if os.geteuid() != 0:
        problems.append("root: containerd needs root to mount image layers (run as root, e.g. with sudo)")
    try:
        missing = containerd_missing()
    except ContainerdVersionError as e:
        missing = str(e)
    if missing is not None:
        problems.append(missing)
    if shutil.which("docker-registry") is None and not Path("/usr/bin/docker-registry").exists():
        problems.append("docker-registry: apt-get install -y docker-registry (the CNCF distribution registry)")
    return problems


def node_object(name: str, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    """A Ready Linux node of this machine's architecture, as a kubelet would register it."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "creationTimestamp": now, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch,
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": arch, **labels}},
        "spec": {"taints": taints} if taints else {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "nodeInfo": {"architecture": arch, "operatingSystem": "linux"},
        },
    }


@dataclass
class LocalNode:
    """A node with its own containerd and agent (`AgentProcess`, or `InProcessAgent`)."""

    name: str
    containerd: Any
    agent: Any

    def image_present(self, reference: str) -> bool:
        client = self.containerd.cri_client()
        try:
            return client.image_status(reference) is not None
        finally:
            client.close()


class LocalNodes:
    """The nodes' containerds and agents: starting, stopping and which identity each agent signs as."""

    # Set by `LocalMode.__init__` and its start.
    base_dir: Path
    stack_name: str
    agents_enabled: bool
    agent_overrides: dict[str, str]
    agent_processes: bool
    agent_image: Path | None
    aws: MotoServer | None
    kube: Any
    stack: LocalStack | None
    registry: Any
    registry_proxy: Any
    replica: Any  # LocalReplica: the further clusters' Region's registry, or None
    nodes: dict[str, LocalNode]
    extra_clusters: dict[str, LocalCluster]
    agent_token: str
    agent_daemonset: Any
    ecr_password: str
    _node_dirs: itertools.count[int]
    _starting: bool
    _agent_identities: dict[str, LocalIdentity]
    _agent_errors: dict[str, str]
    builders: Any  # LocalBuilders: warm snapshots' builders and snapshots

    def _record_child(self, name: str, process: Any) -> None:
        raise NotImplementedError  # LocalMode's run record

    @property
    def logs_dir(self) -> Path:
        """Where the functions' log (`functions.log`) and each agent's (`agent-NODE.log`) go."""
        return self.base_dir / "logs"

    @property
    def agent_identity(self) -> LocalIdentity:
        """The agents' role (IRSA or Pod Identity on EKS): the principal every agent signs as."""
        return LocalIdentity.of_role(f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-agent", "AG")

    def agent_identity_of(self, node: str) -> LocalIdentity:
        """The role `node`'s agent signs as: the agents' role, or one of its own (`add_node(agent_policies=)`)."""
        return self._agent_identities.get(node, self.agent_identity)

    @property
    def nodes_registry_url(self) -> str:
        """Where the nodes pull from: the registry, or the proxy that limits its bandwidth."""
        return str((self.registry_proxy or self.registry).url)

    def daemonset_nodes(self) -> list[str]:
        """The nodes a DaemonSet pod would run on: real kubelets that are Ready (no virtual-kubelet)."""
        from prewarm.domain.placement import NODE_NOT_READY, VIRTUAL_KUBELET_NODE

        names = []
        for node in self.cluster_nodes():
            labels = node.get("metadata", {}).get("labels", {})
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in node.get("status", {}).get("conditions", []))
            if labels.get("type") == "virtual-kubelet" or not ready:
                log.info("no agent on %s: %s", node["metadata"]["name"],
                         VIRTUAL_KUBELET_NODE if ready else NODE_NOT_READY)
                continue
            names.append(node["metadata"]["name"])
        return sorted(names)

    def cluster_nodes(self) -> list[dict[str, Any]]:
        from prewarm import bootstrap

        if self.kube is not None:
            return list(self.kube.list_objects("nodes"))
        nodes: list[dict[str, Any]] = bootstrap.cluster().list_nodes()
        return nodes

    def _node_class_snapshot(self, node_class: str) -> str:
        """The snapshot an EC2NodeClass's data volume starts from; ControlError naming what is missing."""
        from prewarm_devtools.control import ControlError

        found = self.kube.get_object("ec2nodeclasses.karpenter.k8s.aws", node_class) if self.kube else None
        if found is None:
            raise ControlError(f'node_class: EC2NodeClass "{node_class}" does not exist', 404)
        mappings = (found.get("spec") or {}).get("blockDeviceMappings") or []
        snapshot = next(((m.get("ebs") or {}).get("snapshotID") for m in mappings
                         if not m.get("rootVolume") and (m.get("ebs") or {}).get("snapshotID")), None)
        if snapshot is None:
            raise ControlError(f'node_class: EC2NodeClass "{node_class}" names no data volume snapshot (snapshotID)')
        return str(snapshot)

    def _start_node(self, name: str, cluster: LocalCluster | None = None, restore: str | None = None,
                    preload: Sequence[str] = (), join: Callable[[], None] | None = None) -> None:
        """Starts the node's containerd (its root restored from snapshot `restore` first) and agent. `join`
        registers the Node once containerd serves, as a kubelet does (it starts after the runtime)."""
        from prewarm_devtools.node.containerd import PrivateContainerd

        assert self.stack is not None and self.aws is not None and self.registry is not None
        containerd = PrivateContainerd(self.base_dir / f"n{next(self._node_dirs)}")
        if restore is not None:
            self.builders.restore(restore, containerd.root_dir)
        containerd.add_registry_mirror(ecr_host(), self.nodes_registry_url)
        containerd.add_registry_mirror(self.registry.host, self.nodes_registry_url)
        if cluster is not None and self.replica is not None:  # the further clusters run in the replica's Region
            containerd.add_registry_mirror(self.replica.host, self.replica.registry.url)
        containerd.start()
        where = "" if cluster is None else f" in {cluster.name}"
        self._record_child(f"containerd of {name}{where}", containerd)
        node = LocalNode(name, containerd, None)
        (self.nodes if cluster is None else cluster.nodes)[name] = node
        # On the node before it joins, as on one booted from a warm volume or pre-pulled.
        if preload:
            with containerd.cri_client() as cri:
                for reference in preload:
                    cri.pull_image(reference, auth=("AWS", self.ecr_password)).result(timeout=120)
        if join is not None:
            join()
        self._report_runtime(name, containerd, self.kube if cluster is None else cluster.kube)
        node.agent = self._new_agent(name, containerd, cluster)
        self._start_agent(name, node)

    @staticmethod
    def _report_runtime(name: str, containerd: Any, kube: Any) -> None:
        """The Node's containerRuntimeVersion, as its kubelet reports the runtime it runs (CRI Version), patched
        onto its status as a kubelet does (nothing else of the Node rewritten)."""
        from kubernetes.client import CoreV1Api

        if kube is None or kube.get_object("nodes", name) is None:
            return
        with containerd.cri_client() as cri:
            runtime = cri.version()
        with kube.api_client() as client:  # the answer is not read: the client's models refuse a local nodeInfo
            CoreV1Api(client).patch_node_status(name, {"status": {"nodeInfo": {
                "containerRuntimeVersion": f"{runtime.runtime_name}://{runtime.runtime_version}"}}},
                _preload_content=False)

    def _start_agent(self, name: str, node: LocalNode) -> None:
        """Starts the node's agent. One that exits as it starts (AccessDenied on its queue) leaves the node,
        as a crash-looping pod does, with its error in the node's status; while local mode starts, it fails it."""
        try:
            node.agent.start()
        except Exception as e:
            if self._starting:
                raise
            log.warning("the agent of %s exited as it started: %s", name, e)
            self._agent_errors[name] = str(e)
            return
        self._agent_errors.pop(name, None)
        self._record_child(f"agent of {name}", node.agent)

    def _wait_agents_consuming(self, timeout: float = 30.0) -> None:
        """Waits until each in-process agent consumes its node queue (made on its hello), as an agent
        process or container is waited for as it starts: the stack is up once its agents took their
        queues, as `prewarm local up` has it. One still waiting at `timeout` is logged, not failed."""
        from prewarm_devtools.node.agent import InProcessAgent

        deadline = time.monotonic() + timeout
        # (name, agent) pairs: a further cluster's node may share a name with another cluster's
        nodes = [*self.nodes.items(), *(item for c in self.extra_clusters.values() for item in c.nodes.items())]
        waiting = [(name, node.agent) for name, node in nodes if isinstance(node.agent, InProcessAgent)]
        while waiting and time.monotonic() < deadline:
            time.sleep(0.1)
            waiting = [(name, agent) for name, agent in waiting if not agent.consuming()]
        if waiting:
            log.warning("agents not consuming their node queues %g s after the start: %s", timeout,
                        ", ".join(name for name, _ in waiting))

    def _new_agent(self, name: str, containerd: Any, cluster: LocalCluster | None = None) -> Any:
        from prewarm_devtools.node.agent import AgentProcess, InProcessAgent, agent_output_path

        assert self.stack is not None and self.aws is not None
        env = self.stack.env()
        values = {
            "NODE_NAME": name,
            "NODE_QUEUE_PREFIX": env["NODE_QUEUE_PREFIX"],
            "STATUS_QUEUE_URL": env["STATUS_QUEUE_URL"],
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.aws.url,
            "SECRET_PREFIX": env["SECRET_PREFIX"],
            # The refresher's copies carry moto's 2015 expiry until `_give_ecr_tokens_their_lifetime` (for
            # good with PREWARM_AWS_LIMITS=off), which agents would refuse: they ask ECR as their role.
            "ECR_CREDENTIALS": "role",
            "CRI_SOCKET": str(containerd.socket_path),
            "REGISTRY_CONFIG_PATH": str(containerd.certs_dir),
            "CONTAINERD_CONFIG": str(containerd.config_path),
            # The node's own /var/lib/prewarm: what its agent pulled outlives the agent, as on a node.
            "STATE_DIR": str(containerd.base_dir / "prewarm"),
            "HTTP_BIND_ADDRESS": "127.0.0.1",
            "HTTP_PORT": "0",
            "RECEIVE_WAIT_SECONDS": "1",
            "PROGRESS_INTERVAL_SECONDS": "1",
            "SHUTDOWN_GRACE_SECONDS": "5",
            **({"KUBE_API_ENDPOINT": self.kube.url, "KUBE_BEARER_TOKEN": self._agent_token_of(name),
                "KUBE_CA_FILE": str(self.base_dir / "kube-ca.crt")}
               if self.kube and cluster is None else {}),
            # A further cluster's agent: its API, its node-bound token there, and the cluster it names.
            **({"KUBE_API_ENDPOINT": cluster.url, "KUBE_BEARER_TOKEN": cluster.agent_token_of(name),
                "KUBE_CA_FILE": str(cluster.ca_file), "PREWARM_CLUSTER": cluster.name}
               if cluster is not None else {}),
            **self.agent_identity_of(name).environment(),
            **self.agent_overrides,
        }
        if self.agent_image is not None:
            return self._agent_container(name, containerd, values)
        if self.agent_processes:
            return AgentProcess(values, agent_output_path(self.logs_dir, name))
        identity, stack = self.agent_identity_of(name), self.stack
        return InProcessAgent(values, signing=lambda: stack.signing_as(identity))

    def _agent_container(self, name: str, containerd: Any, values: dict[str, str]) -> Any:
        """The agent as the installed DaemonSet's pod would run it: everything the manifests give it comes
        from them, and `values` only for what a node here provides differently (node/container.py)."""
        from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
        from prewarm_devtools.agent_image import containerd_name, default_reference
        from prewarm_devtools.node.agent import agent_output_path
        from prewarm_devtools.node.container import AgentContainer, ContainerRun, container_env, container_flags
        from prewarm_devtools.node.process import free_port

        if self.kube is None or self.agent_image is None:
            raise LocalModeUnavailableError("agents from the image need the embedded API's DaemonSet (no --kubeconfig)")
        daemon_set = self.kube.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
        if daemon_set is None:
            raise LocalModeUnavailableError(f"no DaemonSet {AGENT_NAMESPACE}/{AGENT_NAME}: prewarm install did not run")
        config_maps = {m["metadata"]["name"]: m.get("data") or {}
                       for m in self.kube.list_objects("configmaps", AGENT_NAMESPACE)}
        # The pod's own paths and name stay the DaemonSet's. What this stack sets otherwise than the ConfigMap
        # (a shorter grace and faster reports for tests, ECR as the agents' role while moto's tokens carry a
        # 2015 expiry) overrides it, as an operator editing the ConfigMap would; the rest is the ConfigMap's.
        config = config_maps.get(AGENT_NAME, {})
        local = {k: v for k, v in values.items()
                 if k not in ("NODE_NAME", "CRI_SOCKET", "REGISTRY_CONFIG_PATH", "CONTAINERD_CONFIG", "STATE_DIR")
                 and config.get(k) != v}
        local.update({"HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": str(free_port())})
        host_paths = {"/run/containerd/containerd.sock": containerd.socket_path,
                      "/var/lib/containerd": containerd.root_dir, "/etc/containerd/certs.d": containerd.certs_dir,
                      "/etc/containerd/config.toml": containerd.config_path,
                      "/var/lib/prewarm": containerd.base_dir / "prewarm"}
        host_paths["/var/lib/prewarm"].mkdir(exist_ok=True)
        extra = {containerd.root_dir: containerd.root_dir}
        if "KUBE_CA_FILE" in local:
            extra[Path(local["KUBE_CA_FILE"])] = Path(local["KUBE_CA_FILE"])
        run = ContainerRun(tuple(container_flags(daemon_set, host_paths, extra_mounts=extra)),
                           container_env(daemon_set, config_maps, name, local))
        return AgentContainer(containerd, self.agent_image, containerd_name(default_reference()), run, name,
                              agent_output_path(self.logs_dir, name))

    def _agent_token_of(self, node: str) -> str:
        """The token the kubelet would project into the node's agent pod: bound to that node, which the
        startup taint's admission policy checks."""
        from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
        from prewarm_devtools.kubeapi.auth import service_account

        assert self.kube is not None
        token = f"{self.agent_token}.{node}"
        self.kube.add_identity(token, service_account(AGENT_NAMESPACE, AGENT_NAME, node=node))
        return token

    def _stop_node(self, node: LocalNode) -> None:
        try:
            node.agent.stop(2.0)
        finally:
            node.containerd.stop()

    def _agent_state(self, name: str, cluster: LocalCluster | None = None) -> Any:
        from prewarm_devtools.daemonset import AgentState

        node = (self.nodes if cluster is None else cluster.nodes).get(name)
        if node is None:
            return AgentState.ABSENT
        if node.agent.state == "running":
            return AgentState.RUNNING
        ended = node.agent.last_exit
        if ended is not None and ended.requested == "stop":
            return AgentState.STOPPED
        if ended is not None and ended.signal_name == "SIGKILL":
            return AgentState.KILLED
        return AgentState.EXITED

    def _reconcile_agents(self) -> None:
        if self.agent_daemonset is not None:
            self.agent_daemonset.reconcile()
