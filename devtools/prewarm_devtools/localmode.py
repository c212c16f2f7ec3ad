"""The whole of Prewarm on one machine, on 127.0.0.1 only.

AWS is a moto server running `template.yaml` (`LocalStack`); the cluster is the embedded Kubernetes
API (seeded from `samplefiles/cluster.yaml`, or `nodes` synthetic nodes), or a real cluster from a
kubeconfig; every node that would run the DaemonSet gets its own private containerd and its own
agent; a registry plays ECR: it answers for the ECR host name (mapped in each containerd's
`certs.d`) and admits, as ECR does, only tokens `GetAuthorizationToken` handed out, each for what its
principal's policies allow (`aws_limits.ecr`, `node/ecr_front.py`), so pulls go through the real
credential path. Nothing is simulated: a pull that fails here fails for real.

Crash safety: every child process (containerd, the registry, agents run as processes) dies with the
thread that started it, and the run record beside the state file (`localrun`) names the run
directory and every child, so `prewarm local down` cleans up after a stack killed with SIGKILL.
The running stack answers `prewarm local fire|node|agent|status` on its control channel (`control`).

In the embedded API, local mode also plays the DaemonSet controller and the kubelets for the agent
DaemonSet that `prewarm install` created (`daemonset.AgentDaemonSet`): one pod per node, Ready while
that node's agent runs. ECR tokens live 12 hours, as ECR's do, rather than moto's fixed 2015 expiry.

The embedded API serves HTTPS with a CA made at start, which every client here trusts (the functions
through `KubeCaData`, the agents through `KUBE_CA_FILE`, the CLI through the state file): kubectl
sends a kubeconfig's token over TLS only. The cluster admin's kubeconfig is written beside the state
file (`kubeconfig_path`) for kubectl; requests without a token get 401, and RBAC holds for everyone
but the admin.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import logging
import os
import platform
import secrets
import shutil
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prewarm_devtools.control import ControlError, ControlServer
from prewarm_devtools.localclusters import LocalCluster
from prewarm_devtools.localrun import RunRecord, kubeconfig_path, run_record_path, write_run_record
from prewarm_devtools.node.process import limit_malloc_arenas
from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import ACCOUNT, REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore

log = logging.getLogger(__name__)


class LocalModeUnavailableError(RuntimeError):
    """This machine cannot run local mode as asked; the message says what is missing and how to get it."""


def missing_prerequisites() -> list[str]:
    """What local mode's nodes need and this machine lacks, each with how to get it."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root: containerd needs root to mount image layers (run as root, e.g. with sudo)")
    if shutil.which("containerd") is None:
        problems.append("containerd: apt-get install -y containerd (Debian's package has the CRI plugin)")
    if shutil.which("docker-registry") is None and not Path("/usr/bin/docker-registry").exists():
        problems.append("docker-registry: apt-get install -y docker-registry (the CNCF distribution registry)")
    return problems


def ecr_host(account: str = ACCOUNT, region: str = REGION) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com"


# GetAuthorizationToken: "The authorization token is valid for 12 hours."
ECR_TOKEN_LIFETIME_SECONDS = 12 * 3600.0

# `prewarm local fire NAME`: the schedules a user fires, and the function each one runs.
SCHEDULES = {"repull": "repull_daily", "sweep": "sweep", "refresh": "refresh_ecr_credentials", "sync": "sync_resources"}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


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


@dataclass
class PushedToEcr:
    repository: str
    tag: str | None
    digest: str
    reference: str
    size_bytes: int
    pushed_at: float
    jobs: list[str] = field(default_factory=list)


class LocalMode:
    """Starts everything with `start()` (or as a context manager) and stops it all with `stop()`."""

    def __init__(
        self,
        *,
        nodes: int | None = None,
        kubeconfig: str | None = None,
        base_dir: Path | None = None,
        agents: bool = True,
        stack_name: str = "prewarm-local",
        agent_settings: dict[str, str] | None = None,
        agent_processes: bool = False,
        agent_image: Path | None = None,
        registry_bandwidth: int | None = None,
        control: bool = True,
        max_warm_seconds: int | None = None,
        startup_taint_grace_seconds: int | None = None,
        template_path: Path | None = None,
        clusters: int = 1,
    ) -> None:
        """`agent_processes`: each agent is a `python -m prewarm_agent` process (as `prewarm local up`
        runs them) rather than an `Agent` in this process (whose internals tests reach).
        `agent_image`: an OCI archive of the agent image (`make agent-image`); each agent then runs from
        it as a container on its node's containerd, set up as the installed DaemonSet's pod.
        `registry_bandwidth`: bytes per second the nodes may pull from the registry (None: unlimited).
        `control`: serve the control channel for `prewarm local fire|node|agent|status`.
        `max_warm_seconds`: install's --max-warm-seconds (the agents' ConfigMap; default 900), and
        `startup_taint_grace_seconds` the stack's StartupTaintGraceSeconds (default 60).
        `template_path`: the SAM template to run instead of the project's `template.yaml` (a variant of it,
        e.g. a role without a grant, to see what AWS would refuse).
        `clusters`: how many EKS clusters the stack serves; the further ones (`local-2`...) are embedded APIs
        with the same nodes, registered as `prewarm cluster add` registers a cluster (`localclusters`)."""
        self.node_count = nodes
        self.kubeconfig = kubeconfig
        self.agents_enabled = agents
        self.stack_name = stack_name
        self.agent_overrides = dict(agent_settings or {})
        self.agent_processes = agent_processes
        self.agent_image = agent_image
        self.registry_bandwidth = registry_bandwidth
        self.max_warm_seconds = max_warm_seconds
        self.startup_taint_grace_seconds = startup_taint_grace_seconds
        self.control_enabled = control
        self.template_path = template_path
        self.cluster_count = clusters
        self.extra_clusters: dict[str, LocalCluster] = {}
        # containerd's socket paths must stay short: a short directory under /tmp.
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="pw-", dir="/tmp"))
        self.aws: MotoServer | None = None
        self.kube: Any = None
        self.stack: LocalStack | None = None
        self.registry: Any = None
        self.registry_proxy: Any = None
        self.control: ControlServer | None = None
        self.nodes: dict[str, LocalNode] = {}
        self.ecr_password = ""
        self._env_cm: Any = None
        self._state_path: Path | None = None
        self._record: RunRecord | None = None
        self._record_path: Path | None = None
        self.kubeconfig_written: Path | None = None
        self._node_dirs = itertools.count()
        self.function_log: Any = None
        # The agents' service account token, as the kubelet would project it into their pods.
        self.agent_token = f"agent-{secrets.token_urlsafe(24)}"
        self.agent_daemonset: Any = None
        self._starting = False
        # Nodes whose agent signs as a role of its own (`add_node(agent_policies=)`), and why agents exited.
        self._agent_identities: dict[str, LocalIdentity] = {}
        self._agent_errors: dict[str, str] = {}

    @property
    def logs_dir(self) -> Path:
        """Where the functions' log (`functions.log`) and each agent's (`agent-NODE.log`) go."""
        return self.base_dir / "logs"

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> LocalMode:
        if self.agents_enabled and (problems := missing_prerequisites()):
            raise LocalModeUnavailableError(
                "local mode runs real containerd and a real registry for its nodes; missing: " + "; ".join(problems)
            )
        if self.cluster_count > 1 and (self.kubeconfig or self.agent_image is not None):
            raise LocalModeUnavailableError("further clusters are embedded Kubernetes APIs with agents run as "
                                            "processes: not with a kubeconfig or agents from the image")
        limit_malloc_arenas()  # before any of the stack's threads start
        self._write_record()
        # Callers of `prewarm local up` take the state file for "ready": it is written once all runs.
        self._starting = True
        try:
            self._start()
            self._give_ecr_tokens_their_lifetime()
            self._start_agent_daemonset()
        except BaseException:
            self.stop()
            raise
        finally:
            self._starting = False
        self.write_state()
        return self

    def _give_ecr_tokens_their_lifetime(self) -> None:
        """ECR's 12-hour tokens from now on, and the credentials `_start` refreshed with moto's 2015 ones
        refreshed again: what the refresher writes expires as it would on AWS."""
        assert self.aws is not None and self.stack is not None
        if self.aws.layer is None:
            return  # PREWARM_AWS_LIMITS=off: moto answers as it does on its own
        self.aws.layer.ecr.token_lifetime_s = ECR_TOKEN_LIFETIME_SECONDS
        self.stack.fire("refresh_ecr_credentials")

    def _start_agent_daemonset(self) -> None:
        from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
        from prewarm_devtools.daemonset import AgentDaemonSet

        if self.kube is None:
            return  # a real cluster runs its own controller and kubelets
        self.agent_daemonset = AgentDaemonSet(self.kube, self._agent_state, namespace=AGENT_NAMESPACE,
                                              name=AGENT_NAME).start()
        for cluster in self.extra_clusters.values():
            cluster.daemonset = AgentDaemonSet(
                cluster.kube, functools.partial(self._agent_state, cluster=cluster), namespace=AGENT_NAMESPACE,
                name=AGENT_NAME).start()

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

    def _write_record(self) -> None:
        """The run record, before anything starts and again as each child does (see `localrun`)."""
        from prewarm_cli.targets import local_state_path

        if self._record is None:
            self._record = RunRecord.of_this_process(self.base_dir, own_dir=self._own_dir)
            self._record_path = run_record_path(local_state_path())
        assert self._record_path is not None
        write_run_record(self._record, self._record_path)

    def _record_child(self, name: str, process: Any) -> None:
        if self._record is not None:
            self._record.add_child(name, process.pid, process.start_time)
            self._write_record()

    def _start(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.aws = MotoServer().start()
        if self.aws.layer is not None:
            # ECR's tokens, each bound to whoever asked for it, which the registry that plays ECR checks.
            self.aws.layer.ecr.issues_tokens = True
        self._env_cm = aws_environment(self.aws.url)
        self._env_cm.__enter__()
        # The agents' role joins the node queues' senders, as docs/operations.md has a deploy pass it.
        parameters = {"ClusterName": "local", "AgentRoleArn": self.agent_identity.arn}
        if self.kubeconfig:
            os.environ["KUBECONFIG"] = self.kubeconfig
        else:
            from prewarm_devtools.kubeapi.server import KubeApiServer

            # As EKS, the API takes only EKS tokens signed for it (ClusterName).
            self.kube = KubeApiServer(tls=True, cluster_name=parameters["ClusterName"]).start()
            (self.base_dir / "kube-ca.crt").write_text(self.kube.ca_pem)
            self._seed(self.kube)
            parameters["KubeApiEndpoint"] = self.kube.url
            parameters["KubeCaData"] = base64.b64encode(self.kube.ca_pem.encode()).decode()
            parameters["ClusterAccess"] = "access-entries"
        parameters["CredentialsConfig"] = json.dumps(self.credentials_config())
        if self.startup_taint_grace_seconds is not None:
            parameters["StartupTaintGraceSeconds"] = str(self.startup_taint_grace_seconds)
        self.function_log = open(self.logs_dir / "functions.log", "a", encoding="utf-8")  # noqa: SIM115
        # A message record_status hands back comes again when its visibility runs out, as on AWS.
        self.stack = LocalStack(self.aws.url, template_path=self.template_path, parameters=parameters,
                                stack_name=self.stack_name, function_output=self.function_log).deploy()
        # The agents' role holds what the stack's AgentPolicy grants, as a deploy attaches it (docs/agent.md).
        self.agent_identity.register([self.stack.policy_document("AgentPolicy")])
        if self.kube is not None:
            grant_cluster_access(self.kube, self.stack, agent_token=self.agent_token,
                                 max_warm_seconds=self.max_warm_seconds,
                                 agent_role_arn=self.agent_identity.arn, credentials_config=self.credentials_config())
            self._write_kubeconfig()
            self._start_extra_clusters()
        self.stack.start()
        # The schedule first fires an hour from now: refresh at once, so pull secrets and copies exist.
        self.stack.fire("refresh_ecr_credentials")
        if self.control_enabled:
            self.control = ControlServer(self._control_route).start()
        if self.agents_enabled:
            self._start_registry()
            for name in self.daemonset_nodes():
                self._start_node(name)
            for cluster in self.extra_clusters.values():
                for name in sorted(n["metadata"]["name"] for n in cluster.kube.list_objects("nodes")):
                    self._start_node(name, cluster)
        self.write_state()

    def _start_extra_clusters(self) -> None:
        from prewarm_cli.targets import STACK_OUTPUTS
        from prewarm_devtools.localclusters import extra_cluster_names, register, start_cluster

        assert self.aws is not None and self.stack is not None
        names = extra_cluster_names("local", self.cluster_count)
        if names and self.aws.layer is None:
            raise LocalModeUnavailableError("further clusters need the AWS limits layer, which plays EKS for them: "
                                            "unset PREWARM_AWS_LIMITS=off")
        outputs = self.stack.outputs()
        env = {**self.stack.env(), **{n: outputs[k] for k, n in STACK_OUTPUTS.items() if outputs.get(k)},
               "CREDENTIALS_CONFIG": json.dumps(self.credentials_config())}
        for name in names:
            cluster = start_cluster(name, self.base_dir, self.stack, self.aws.layer, seed=self._seed)
            self.extra_clusters[name] = cluster
            register(cluster, self.stack, render_install(self.stack, agent_role_arn=self.agent_identity.arn,
                                                         credentials_config=self.credentials_config(),
                                                         max_warm_seconds=self.max_warm_seconds, cluster=name),
                     env, self.aws.url)

    def _seed(self, kube: Any) -> None:
        if self.node_count:
            from prewarm_devtools.kubeapi.synthetic import generate_cluster

            kube.seed_objects(generate_cluster(self.node_count))
        else:
            kube.seed_from_file(project_files().samplefiles / "cluster.yaml")

    def _write_kubeconfig(self) -> None:
        """The cluster admin's kubeconfig for kubectl, beside the state file; `stop` removes it, and
        `prewarm local down` after a crash."""
        from prewarm_cli.targets import local_state_path

        assert self.kube is not None
        self.kubeconfig_written = self.kube.write_kubeconfig(kubeconfig_path(local_state_path()), self.stack_name)

    @property
    def agent_identity(self) -> LocalIdentity:
        """The agents' role (IRSA or Pod Identity on EKS): the principal every agent signs as."""
        return LocalIdentity.of_role(f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-agent", "AG")

    def agent_identity_of(self, node: str) -> LocalIdentity:
        """The role `node`'s agent signs as: the agents' role, or one of its own (`add_node(agent_policies=)`)."""
        return self._agent_identities.get(node, self.agent_identity)

    def credentials_config(self) -> dict[str, Any]:
        """`refresh_ecr_credentials`' configuration here: the ECR registry of this account and region.

        Pull secrets go into every namespace of the embedded cluster but `kube-*` (`default`, the
        sample's, any created later); never into a real cluster (`kubeconfig`), where moto's token
        would be a bogus credential on real service accounts: there only the copies are written.
        """
        config: dict[str, Any] = {"registries": [{"account": ACCOUNT, "region": REGION}]}
        if not self.kubeconfig:
            config["namespaces"] = {"include": ["*"], "exclude": ["kube-*"]}
        return config

    def _start_registry(self) -> None:
        """The registry that plays ECR: it admits a request as ECR would, by the token's principal and that
        principal's policies (`ECRLimits.registry_refusal`); `ecr_password` is a token of the operator's."""
        from prewarm_devtools.aws_limits.ecr import moto_token_door
        from prewarm_devtools.node.registry import LocalRegistry

        assert self.aws is not None
        token = self.aws.client("ecr").get_authorization_token()["authorizationData"][0]["authorizationToken"]
        user, _, self.ecr_password = base64.b64decode(token).decode().partition(":")
        layer = self.aws.layer
        door = (functools.partial(layer.ecr.registry_refusal, account=ACCOUNT, region=REGION) if layer is not None
                else moto_token_door(ACCOUNT))
        self.registry = LocalRegistry(self.base_dir / "registry", door=door, client_auth=(user, self.ecr_password),
                                      realm=ecr_host()).start()
        self._record_child("registry", self.registry)
        if self.registry_bandwidth is not None:
            from prewarm_devtools.node.throttle import ThrottlingProxy

            self.registry_proxy = ThrottlingProxy(("127.0.0.1", self.registry.port), self.registry_bandwidth).start()

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

    def _start_node(self, name: str, cluster: LocalCluster | None = None) -> None:
        from prewarm_devtools.node.containerd import PrivateContainerd

        assert self.stack is not None and self.aws is not None and self.registry is not None
        containerd = PrivateContainerd(self.base_dir / f"n{next(self._node_dirs)}")
        containerd.add_registry_mirror(ecr_host(), self.nodes_registry_url)
        containerd.add_registry_mirror(self.registry.host, self.nodes_registry_url)
        containerd.start()
        where = "" if cluster is None else f" in {cluster.name}"
        self._record_child(f"containerd of {name}{where}", containerd)
        node = LocalNode(name, containerd, None)
        (self.nodes if cluster is None else cluster.nodes)[name] = node
        node.agent = self._new_agent(name, containerd, cluster)
        self._start_agent(name, node)

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

    def _new_agent(self, name: str, containerd: Any, cluster: LocalCluster | None = None) -> Any:
        from prewarm_devtools.node.agent import AgentProcess, InProcessAgent, agent_output_path

        assert self.stack is not None and self.aws is not None
        env = self.stack.env()
        values = {
            "NODE_NAME": name,
            "NODE_QUEUE_PREFIX": env["NODE_QUEUE_PREFIX"],
            "STATUS_QUEUE_URL": env["STATUS_QUEUE_URL"],
            "NODE_DLQ_ARN": env["NODE_DLQ_ARN"],
            # A queue the agent creates for itself gets the same policy as the control plane's.
            "NODE_QUEUE_SENDER_ARNS": env["NODE_QUEUE_SENDER_ARNS"],
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.aws.url,
            "SECRET_PREFIX": env["SECRET_PREFIX"],
            # The refresher's copies carry moto's 2015 expiry until `_give_ecr_tokens_their_lifetime` (for
            # good with PREWARM_AWS_LIMITS=off), which agents would refuse: they ask ECR as their role.
            "ECR_CREDENTIALS": "role",
            "CRI_SOCKET": str(containerd.socket_path),
            "REGISTRY_CONFIG_PATH": str(containerd.certs_dir),
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
                 if k not in ("NODE_NAME", "CRI_SOCKET", "REGISTRY_CONFIG_PATH") and config.get(k) != v}
        local.update({"HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": str(free_port())})
        host_paths = {"/run/containerd/containerd.sock": containerd.socket_path,
                      "/var/lib/containerd": containerd.root_dir, "/etc/containerd/certs.d": containerd.certs_dir}
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

    def _stop_extra_clusters(self) -> None:
        for cluster in self.extra_clusters.values():
            if cluster.daemonset is not None:
                cluster.daemonset.stop()
            for node in cluster.nodes.values():
                self._stop_node(node)
            cluster.nodes.clear()
            cluster.kube.stop()
            if self.aws is not None and self.aws.layer is not None:
                self.aws.layer.eks.forget(cluster.name)
        self.extra_clusters.clear()

    def _stop_node(self, node: LocalNode) -> None:
        try:
            node.agent.stop(2.0)
        finally:
            node.containerd.stop()

    def stop(self) -> None:
        """Stops everything and removes what it made; returns once every child process has exited."""
        if self.control is not None:
            self.control.stop_serving()  # no new requests; the one in flight finishes
        if self.agent_daemonset is not None:
            self.agent_daemonset.stop()
            self.agent_daemonset = None
        if self.aws is not None and self.aws.layer is not None:
            # A layer the test run shares goes back to moto's answer.
            self.aws.layer.ecr.token_lifetime_s = None
            self.aws.layer.ecr.issues_tokens = False
        for node in self.nodes.values():
            self._stop_node(node)
        self.nodes.clear()
        self._stop_extra_clusters()
        if self.control is not None:
            self.control.stop()
            self.control = None
        if self.registry_proxy is not None:
            self.registry_proxy.stop()
            self.registry_proxy = None
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        if self.stack is not None:
            self.stack.stop()
            self.stack = None
        if self.kube is not None:
            if self.aws is not None and self.aws.layer is not None and self.kube.authenticator.cluster_name:
                self.aws.layer.eks.forget(self.kube.authenticator.cluster_name)
            self.kube.stop()
            self.kube = None
        if self.kubeconfig_written is not None:
            self.kubeconfig_written.unlink(missing_ok=True)
            self.kubeconfig_written = None
        if self.function_log is not None:
            self.function_log.close()
            self.function_log = None
        if self._env_cm is not None:
            self._env_cm.__exit__(None, None, None)
            self._env_cm = None
        if self.aws is not None:
            self.aws.stop()
            self.aws = None
        self.remove_state()
        from prewarm_devtools.node.containerd import unmount_all_under

        unmount_all_under(self.base_dir)
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        if self._record_path is not None:
            self._record_path.unlink(missing_ok=True)
            self._record = self._record_path = None

    def __enter__(self) -> LocalMode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state for the CLI ----------------------------------------------------------------------

    def remove_state(self) -> None:
        from prewarm_cli.targets import clear_local_state

        if self._state_path is not None:
            clear_local_state(self._state_path)
            self._state_path = None

    # -- pushing images -------------------------------------------------------------------------

    def job_store(self) -> DynamoJobStore:
        """The stack's jobs table, as its functions read and write it."""
        from prewarm.adapters.dynamodb import DynamoJobStore

        if self.aws is None or self.stack is None:
            raise ControlError("local mode is not running")
        return DynamoJobStore(self.stack.env()["TABLE_NAME"], client=self.aws.client("dynamodb"))

    def push(self, repository: str, tag: str | None, *, size_mb: float = 1.0) -> PushedToEcr:
        """Builds an image, pushes it to the registry that plays ECR, and delivers ECR's PUSH event here."""
        assert self.aws is not None and self.stack is not None and self.registry is not None
        pushed, event = push_to_local_ecr(self.registry.url, self.aws.client("ecr"), repository, tag, size_mb=size_mb)
        results = self.stack.put_event(event)
        pushed.jobs = [line for r in results for line in (r or {}).get("jobs", [])]
        return pushed

    def write_state(self) -> None:
        """Tells `prewarm --local` where this stack is (`$PREWARM_LOCAL_STATE` or ~/.prewarm/local.json)."""
        from prewarm_cli.targets import STACK_OUTPUTS, LocalState, write_local_state

        if self._starting:
            return  # `start` writes it when everything runs
        assert self.stack is not None
        state = LocalState.of_stack(self.stack, pid=os.getpid())
        state.env["LOCAL_RUN_DIR"] = str(self.base_dir)
        if self.registry is not None:
            state.env["LOCAL_REGISTRY_URL"] = self.registry.url
        if self.kube is not None:
            state.env["LOCAL_KUBE_API_URL"] = self.kube.url
        if self.kubeconfig_written is not None:
            state.env["LOCAL_KUBECONFIG"] = str(self.kubeconfig_written)
        # What `prewarm --local install|doctor` reads from a deployed stack's outputs and parameters.
        outputs = self.stack.outputs()
        state.env.update({name: outputs[key] for key, name in STACK_OUTPUTS.items() if outputs.get(key)})
        state.env["CREDENTIALS_CONFIG"] = json.dumps(self.credentials_config())
        # How often the sweep and the daily round run, which `prewarm doctor` judges their last runs by, and
        # the sweep's grace on a startup taint, which `prewarm get nodes` times its removal by.
        assert self.stack.resolver is not None
        for parameter, name in (("SweepSchedule", "SWEEP_SCHEDULE"), ("RepullSchedule", "REPULL_SCHEDULE"),
                                ("StartupTaintGraceSeconds", "STARTUP_TAINT_GRACE_SECONDS")):
            state.env[name] = str(self.stack.resolver.resolve({"Ref": parameter}))
        if self.kube is not None:
            # EKS keeps access entries; here the embedded API does, so the state says what they are.
            state.env["LOCAL_ACCESS_ENTRIES"] = json.dumps(self.stack.access_entries())
        if self.extra_clusters:
            state.env["LOCAL_CLUSTERS"] = json.dumps({c.name: c.url for c in self.extra_clusters.values()})
        if self.control is not None:
            state.env["LOCAL_CONTROL_URL"] = self.control.url
            state.env["LOCAL_CONTROL_TOKEN"] = self.control.token
        self._state_path = write_local_state(state)

    # -- the control channel (`prewarm local fire|node|agent|status`) -----------------------------

    def _control_route(self, method: str, parts: list[str], body: dict[str, Any]) -> dict[str, Any]:
        match method, parts:
            case "GET", ["status"]:
                return self.status()
            case "POST", ["fire"]:
                return self.fire(str(body.get("schedule", "")))
            case "POST", ["nodes"]:
                return self.add_node(str(body.get("name", "")), labels=dict(body.get("labels") or {}),
                                     taints=list(body.get("taints") or []), agent=bool(body.get("agent", True)))
            case "DELETE", ["nodes", name]:
                return self.remove_node(name)
            case "POST", ["nodes", name, "kubelet"]:
                return self.set_kubelet_policy(name, body.get("policy"), list(body.get("allowlist") or []))
            case "POST", ["agents", node, action]:
                return self.agent_action(node, action)
        raise ControlError(f"no such request: {method} /{'/'.join(parts)}", 404)

    def set_kubelet_policy(self, name: str, policy: Any, allowlist: list[str]) -> dict[str, Any]:
        """Node `name`'s kubelet stand-in reports `imagePullCredentialsVerificationPolicy: policy` at
        `/configz` (None: KEP-2535's feature gate off)."""
        if self.kube is None:
            raise ControlError("kubelet policies are set only in the embedded Kubernetes API, not a real cluster")
        if self.kube.get_object("nodes", name) is None:
            raise ControlError(f'node "{name}" not found', 404)
        try:
            self.kube.set_image_credentials_policy(name, None if policy is None else str(policy), allowlist)
        except ValueError as e:
            raise ControlError(str(e)) from None
        return {"node": name, "policy": policy, "allowlist": allowlist}

    def fire(self, schedule: str) -> dict[str, Any]:
        """Fires a schedule now: `repull` (the daily re-pull), `sweep`, `refresh` (ECR credentials) or `sync`
        (the prewarm.dev resources)."""
        if schedule not in SCHEDULES:
            raise ControlError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
        assert self.stack is not None
        function = SCHEDULES[schedule]
        result = self.stack.fire(function)
        return {"function": function, "result": result}

    def add_node(self, name: str, *, labels: dict[str, str], taints: list[dict[str, str]],
                 agent: bool = True, agent_policies: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Registers a Ready node in the embedded Kubernetes API; with `agent`, starts its containerd and agent.

        `agent_policies`: the identity policies of this node's agent instead of the stack's AgentPolicy;
        the agent then signs as a role of its own (`<stack>-agent-<node>`), e.g. one that lacks what the
        agent needs, as a node group whose role misses the policy. An agent that exits as it starts leaves
        the node as it is, its taints included, with `agent_error` in the answer."""
        from prewarm.domain.kubernetes import dns1123_subdomain_problem, label_map_problems

        if self.kube is None:
            raise ControlError("nodes can be added only to the embedded Kubernetes API, not to a real cluster")
        problems = [f"name: {p}" for p in [dns1123_subdomain_problem(name)] if p]
        problems += [f"labels.{key}: {problem}" for key, problem in label_map_problems(labels)]
        problems += [f"taint {t.get('key')}: effect must be one of {', '.join(TAINT_EFFECTS)}"
                     for t in taints if t.get("effect") not in TAINT_EFFECTS]
        if problems:
            raise ControlError("; ".join(problems))
        if self.kube.get_object("nodes", name) is not None:
            raise ControlError(f'node "{name}" already exists', 409)
        if agent and not self.agents_enabled:
            raise ControlError("this stack runs no agents (started with --no-agents): add the node with --no-agent")
        if agent_policies is not None:
            if not agent:
                raise ControlError("agent_policies: the node has no agent to give them to")
            if self.agent_image is not None:
                raise ControlError("agent_policies: agents from the image sign as the role their DaemonSet gives them")
            identity = LocalIdentity.of_role(f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-agent-{name}", "AG")
            identity.register(agent_policies)
            self._agent_identities[name] = identity
        self.kube.seed_objects([node_object(name, labels, taints)])
        if agent:
            try:
                self._start_node(name)
            except BaseException:
                self.kube.remove_object("nodes", name)
                if (own := self._agent_identities.pop(name, None)) is not None:
                    own.unregister()
                raise
        self._reconcile_agents()
        return self._node_status(name)

    def remove_node(self, name: str) -> dict[str, Any]:
        """Stops the node's agent and containerd, removes its files and its Node object."""
        node = self.nodes.pop(name, None)
        known = self.kube is not None and self.kube.get_object("nodes", name) is not None
        if node is None and not known:
            raise ControlError(f'node "{name}" not found', 404)
        if node is not None:
            self._stop_node(node)
            node.containerd.remove_data()
            shutil.rmtree(node.containerd.base_dir, ignore_errors=True)
        if self.kube is not None:
            self.kube.remove_object("nodes", name)
        self._agent_errors.pop(name, None)
        if (identity := self._agent_identities.pop(name, None)) is not None:
            identity.unregister()
        self._reconcile_agents()
        return {"name": name, "removed": True, "had_agent": node is not None}

    def agent_action(self, name: str, action: str) -> dict[str, Any]:
        """`stop` (SIGTERM: drain, then exit), `kill` (SIGKILL) or `start` one node's agent."""
        if action not in ("stop", "kill", "start"):
            raise ControlError(f"unknown agent action {action!r}: choose stop, kill or start", 404)
        node = self.nodes.get(name)
        if node is None:
            if name not in {n["metadata"]["name"] for n in self.cluster_nodes()}:
                raise ControlError(f'node "{name}" not found', 404)
            if action != "start" or not self.agents_enabled:
                raise ControlError(f'node "{name}" has no agent' + ("" if self.agents_enabled else
                                   " (this stack was started with --no-agents)"))
            self._start_node(name)  # a node added with --no-agent gets its containerd and agent now
            self._reconcile_agents()
            return self._node_status(name)
        running = node.agent.state == "running"
        if action == "start":
            if running:
                raise ControlError(f'the agent of "{name}" is already running (pid {node.agent.pid})')
            self._start_agent(name, node)
        elif not running:
            raise ControlError(f'the agent of "{name}" is not running ({node.agent.state})')
        elif action == "stop":
            node.agent.stop(float(node.agent.settings.shutdown_grace_seconds) + 5)
        else:
            node.agent.kill()
        self._reconcile_agents()
        return self._node_status(name)

    def _node_status(self, name: str) -> dict[str, Any]:
        from prewarm_devtools.node.agent import NONE, exit_note

        node = self.nodes.get(name)
        if node is None:
            return {"name": name, "agent": NONE, "pid": None, "containerd_pid": None, "exit": None}
        state = node.agent.state
        return {"name": name, "agent": state, "pid": node.agent.pid, "exit": exit_note(node.agent.last_exit, state),
                "containerd_pid": node.containerd.pid,
                "agent_kind": "container" if self.agent_image is not None
                else "process" if self.agent_processes else "in-process",
                **({"agent_error": self._agent_errors[name]} if name in self._agent_errors else {})}

    def _cluster_status(self, cluster: LocalCluster) -> dict[str, Any]:
        from prewarm_devtools.node.agent import NONE, exit_note

        def node_status(node: LocalNode | None) -> dict[str, Any]:
            if node is None:
                return {"agent": NONE, "pid": None, "containerd_pid": None, "exit": None}
            state = node.agent.state
            return {"agent": state, "pid": node.agent.pid, "containerd_pid": node.containerd.pid,
                    "exit": exit_note(node.agent.last_exit, state)}

        return cluster.status(node_status)

    def status(self) -> dict[str, Any]:
        """Every endpoint, and every node of the cluster with its agent's state."""
        assert self.aws is not None
        endpoints = {"aws": self.aws.url,
                     "kubernetes": self.kube.url if self.kube is not None else f"kubeconfig {self.kubeconfig}"}
        if self.registry is not None:
            endpoints["registry"] = self.registry.url
        if self.registry_proxy is not None:
            endpoints["registry (nodes, limited)"] = (f"{self.registry_proxy.url} at "
                                                      f"{self.registry_bandwidth:,} bytes/s")
        if self.control is not None:
            endpoints["control"] = self.control.url
        names = sorted({n["metadata"]["name"] for n in self.cluster_nodes()} | set(self.nodes))
        return {"pid": os.getpid(), "run_dir": str(self.base_dir), "endpoints": endpoints,
                "logs": str(self.logs_dir), "nodes": [self._node_status(n) for n in names],
                **({"clusters": [self._cluster_status(c) for c in self.extra_clusters.values()]}
                   if self.extra_clusters else {}),
                **({"kubeconfig": str(self.kubeconfig_written)} if self.kubeconfig_written else {})}


def push_to_local_ecr(
    registry_url: str, ecr: Any, repository: str, tag: str | None, *, size_mb: float
) -> tuple[PushedToEcr, dict[str, Any]]:
    """Pushes a fresh image to the registry that plays ECR and returns it with ECR's PUSH event.

    moto records the manifest too (so `BatchGetImage` answers as ECR would) but emits no event on a
    push: the caller delivers the returned event, as EventBridge would.
    """
    from prewarm_devtools.node.images import RegistryPusher, build_image

    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    image = build_image(size_mb=size_mb)
    pusher = RegistryPusher(registry_url, auth=(user, password))
    pushed = pusher.push_image(repository, tag or "untagged-" + image.config.digest[7:19], image)
    with suppress(ecr.exceptions.RepositoryAlreadyExistsException):
        ecr.create_repository(repositoryName=repository)
    ecr.put_image(repositoryName=repository, imageManifest=image.manifest.data.decode(),
                  imageManifestMediaType=image.manifest.media_type, **({"imageTag": tag} if tag else {}))
    event = {
        "version": "0", "id": f"local-{pushed.digest[7:19]}", "detail-type": "ECR Image Action",
        "source": "aws.ecr", "account": ACCOUNT, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION, "resources": [],
        "detail": {"result": "SUCCESS", "repository-name": repository, "image-digest": pushed.digest,
                   "action-type": "PUSH", "manifest-media-type": image.manifest.media_type,
                   "artifact-media-type": image.config.media_type, **({"image-tag": tag} if tag else {})},
    }
    result = PushedToEcr(repository, tag, pushed.digest, f"{ecr_host()}/{repository}@{pushed.digest}",
                         image.total_size, time.time())
    return result, event


def render_install(stack: LocalStack, *, agent_role_arn: str, credentials_config: dict[str, Any],
                   max_warm_seconds: int | None = None, cluster: str = "") -> list[dict[str, Any]]:
    """What `prewarm install` installs into a local cluster (`cluster`: a further one's name)."""
    from prewarm_cli.commands.install import LOCAL_IMAGE
    from prewarm_cli.install.render import ALL_NAMESPACES, InstallValues, render, values_from_stack

    values = values_from_stack(
        {**stack.env(), "AGENT_ROLE_ARN": agent_role_arn}, region=stack.region, image=LOCAL_IMAGE,
        credentials_config=json.dumps(credentials_config), pull_secret_namespaces=ALL_NAMESPACES,
        max_warm_seconds=InstallValues.max_warm_seconds if max_warm_seconds is None else max_warm_seconds,
        cluster=cluster,
    )
    return render(values)


def grant_cluster_access(kube: Any, stack: LocalStack, *, agent_token: str, agent_role_arn: str,
                         max_warm_seconds: int | None = None,
                         credentials_config: dict[str, Any]) -> None:
    """Each function calls the embedded API as its own role, with exactly the RBAC `prewarm install` ships.

    As on EKS: the template's access entries give each function role its Kubernetes groups (created
    through the EKS API the AWS limits layer plays for the cluster, when it is on), the operator (the
    cluster's creator) is an admin, the agents are their service account (`agent_token`), and install
    binds the groups and the agents' service account.
    """
    from prewarm.adapters.kube import KubeCluster
    from prewarm_cli.install.apply import install
    from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
    from prewarm_devtools import aws_limits
    from prewarm_devtools.kubeapi.auth import AccessEntry, service_account
    from prewarm_devtools.localclusters import share_principals

    share_principals(kube, stack)
    layer = aws_limits.active()
    name = kube.authenticator.cluster_name
    if layer is not None and name:
        layer.eks.serve(name, kube.url, base64.b64encode(kube.ca_pem.encode()).decode(), kube)
    for principal, groups in stack.access_entries().items():
        if layer is not None and name:
            layer.eks.create_access_entry(name, {"principalArn": principal, "kubernetesGroups": list(groups)})
        else:
            kube.add_access_entry(principal, AccessEntry(groups=groups))
    kube.add_identity(agent_token, service_account(AGENT_NAMESPACE, AGENT_NAME))
    objects = render_install(stack, agent_role_arn=agent_role_arn, credentials_config=credentials_config,
                             max_warm_seconds=max_warm_seconds)
    with KubeCluster(kube.url, lambda: kube.token, ca_data=kube.ca_pem) as cluster:
        install(cluster, objects)
