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

Here is the stack's life cycle and the state file; the nodes and their agents are `localnodes`, the
control channel's requests `localcontrol`, the registry that plays ECR `localecr`, and what `prewarm
install` puts into a local cluster `localinstall`.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import itertools
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prewarm_devtools.control import ControlError, ControlServer
from prewarm_devtools.localclusters import LocalCluster
from prewarm_devtools.localcontrol import LocalControl
from prewarm_devtools.localecr import ECR_TOKEN_LIFETIME_SECONDS, PushedToEcr, ecr_host, push_to_local_ecr
from prewarm_devtools.localinstall import grant_cluster_access, render_install
from prewarm_devtools.localnodes import LocalModeUnavailableError, LocalNode, missing_prerequisites
from prewarm_devtools.localrun import RunRecord, kubeconfig_path, run_record_path, write_run_record
from prewarm_devtools.node.process import limit_malloc_arenas
from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import ACCOUNT, REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore

__all__ = ["LocalMode", "LocalModeUnavailableError", "missing_prerequisites"]


class LocalMode(LocalControl):
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
        template_path: Path | None = None,
        clusters: int = 1,
        replica_region: str | None = None,
        registry_quotas: Mapping[str, float] | None = None,
        parameters: dict[str, str] | None = None,
    ) -> None:
        """`agent_processes`: each agent is a `python -m prewarm_agent` process (as `prewarm local up`
        runs them) rather than an `Agent` in this process (whose internals tests reach).
        `agent_image`: an OCI archive of the agent image (`make agent-image`); each agent then runs from
        it as a container on its node's containerd, set up as the installed DaemonSet's pod.
        `registry_bandwidth`: bytes per second the nodes may pull from the registry (None: unlimited).
        `control`: serve the control channel for `prewarm local fire|node|agent|status`.
        `max_warm_seconds`: install's --max-warm-seconds (the agents' ConfigMap; default 900).
        `template_path`: the SAM template to run instead of the project's `template.yaml` (a variant of it,
        e.g. a role without a grant, to see what AWS would refuse).
        `clusters`: how many EKS clusters the stack serves; the further ones (`local-2`...) are embedded APIs
        with the same nodes, registered as `prewarm cluster add` registers a cluster (`localclusters`).
        `replica_region`: the further clusters run in this Region, to which the local ECR replicates every
        push into a registry of that Region's (`localreplica`). `registry_quotas`: the registry's request
        quotas lowered (`aws_limits.quotas` names, e.g. `ecr_layer_per_s`), for as long as it runs.
        `parameters`: other parameters of the template, as a deploy's overrides (e.g. StartupTaintGraceSeconds,
        ImageRemovalGraceSeconds)."""
        if replica_region and clusters < 2:
            raise ValueError("replica_region: a replica serves the further clusters, and there are none (clusters=1)")
        self.node_count = nodes
        self.kubeconfig = kubeconfig
        self.agents_enabled = agents
        self.stack_name = stack_name
        self.agent_overrides = dict(agent_settings or {})
        self.agent_processes = agent_processes
        self.agent_image = agent_image
        self.registry_bandwidth = registry_bandwidth
        self.max_warm_seconds = max_warm_seconds
        self.control_enabled = control
        self.template_path = template_path
        self.cluster_count = clusters
        self.replica_region = replica_region or ""
        self.replica: Any = None
        self.registry_quotas = dict(registry_quotas or {})
        self._quotas_before: Any = None
        self.parameter_overrides = dict(parameters or {})
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
        self.builders: Any = None
        self.kubelets: Any = None  # LocalKubelets: each node's images in its Node's status, as its kubelet lists them

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
            self._quotas_before = self.aws.layer.ecr.quotas
            self.aws.layer.ecr.quotas = dataclasses.replace(self._quotas_before, **self.registry_quotas)
        elif self.registry_quotas:
            raise LocalModeUnavailableError("registry quotas are the AWS limits layer's: unset PREWARM_AWS_LIMITS=off")
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
        # Builders here run the agent as a process of this checkout (localbuilders), whatever the image.
        parameters["BuilderAgentImage"] = "prewarm-agent:local"
        parameters.update(self.parameter_overrides)
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
            if self.replica_region:
                from prewarm_devtools.localreplica import LocalReplica

                self.replica = LocalReplica(self.replica_region, self.base_dir, self.aws).start()
                self._record_child(f"registry of {self.replica_region}", self.replica.registry)
            self._start_builders()
            for name in self.daemonset_nodes():
                self._start_node(name)
            for cluster in self.extra_clusters.values():
                for name in sorted(n["metadata"]["name"] for n in cluster.kube.list_objects("nodes")):
                    self._start_node(name, cluster)
            self._wait_agents_consuming()
            from prewarm_devtools.node.kubelet_status import LocalKubelets

            self.kubelets = LocalKubelets(self._kubelet_nodes).start()
        self.write_state()

    def _kubelet_nodes(self) -> list[tuple[str, Any, Any]]:
        """Each running node's name, containerd and API server (none for a real cluster's)."""
        return [*((name, node.containerd, self.kube) for name, node in list(self.nodes.items())),
                *((name, node.containerd, cluster.kube) for cluster in list(self.extra_clusters.values())
                  for name, node in list(cluster.nodes.items()))]

    def _start_builders(self) -> None:
        """EC2's builders and snapshots (localbuilders), and Karpenter's EC2NodeClass in the embedded API."""
        from prewarm_devtools.localbuilders import CRD_PATH, LocalBuilders, create_builder_profile

        assert self.aws is not None and self.stack is not None
        if self.kube is not None:
            self.kube.seed_from_file(CRD_PATH)
        create_builder_profile(self.aws.client("iam"), self.stack)
        self.builders = LocalBuilders(self.base_dir, self.aws.client("ec2"), self.stack, self.nodes_registry_url,
                                      self.logs_dir, layer=self.aws.layer).start()

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
                     env, self.aws.url, region=self.replica_region)

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

    def credentials_config(self) -> dict[str, Any]:
        """`refresh_ecr_credentials`' configuration here: the ECR registry of this account and region.

        Pull secrets go into every namespace of the embedded cluster but `kube-*` (`default`, the
        sample's, any created later); never into a real cluster (`kubeconfig`), where moto's token
        would be a bogus credential on real service accounts: there only the copies are written.
        """
        config: dict[str, Any] = {"registries": [{"account": ACCOUNT, "region": region} for region in
                                                 dict.fromkeys([REGION, self.replica_region]) if region]}
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

    def stop(self) -> None:
        """Stops everything and removes what it made; returns once every child process has exited."""
        if self.control is not None:
            self.control.stop_serving()  # no new requests; the one in flight finishes
        if self.agent_daemonset is not None:
            self.agent_daemonset.stop()
            self.agent_daemonset = None
        if self.kubelets is not None:
            self.kubelets.stop()
            self.kubelets = None
        if self.aws is not None and self.aws.layer is not None:
            # A layer the test run shares goes back to moto's answer.
            self.aws.layer.ecr.token_lifetime_s = None
            self.aws.layer.ecr.issues_tokens = False
            if self._quotas_before is not None:
                self.aws.layer.ecr.quotas = self._quotas_before
        if self.builders is not None:
            self.builders.stop()
            self.builders = None
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
        if self.replica is not None:
            self.replica.stop()
            self.replica = None
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

    def push(self, repository: str, tag: str | None, *, size_mb: float = 1.0, layers: int = 1,
             replicate: bool = True, replication_first: bool = False) -> PushedToEcr:
        """Builds an image of `layers` layers, pushes it to the registry that plays ECR, and delivers ECR's
        PUSH event here; then, with a replica Region and `replicate`, replicates it (`replicate`).
        `replication_first`: the replication's event is delivered before the push's (EventBridge does not
        order events of two Regions)."""
        assert self.aws is not None and self.stack is not None and self.registry is not None
        pushed, event = push_to_local_ecr(self.registry.url, self.aws.client("ecr"), repository, tag, size_mb=size_mb,
                                          layers=layers)
        replicated = self.replicate(pushed) if self.replica is not None and replicate and replication_first else []
        results = self.stack.put_event(event)
        pushed.jobs = [*replicated, *(line for r in results for line in (r or {}).get("jobs", []))]
        if self.replica is not None and replicate and not replication_first:
            pushed.jobs += self.replicate(pushed)
        return pushed

    def replicate(self, pushed: PushedToEcr) -> list[str]:
        """Copies `pushed` into the replica Region's registry and delivers ECR's replication event here;
        returns the jobs it applied."""
        assert self.replica is not None and self.stack is not None
        results = self.stack.put_event(self.replica.replicate(pushed))
        return [line for r in results for line in (r or {}).get("jobs", [])]

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
        if self.replica is not None:
            state.env["LOCAL_REPLICA_REGISTRY_URL"] = self.replica.registry.url
            state.env["LOCAL_REPLICA_REGION"] = self.replica.region
        if self.kube is not None:
            state.env["LOCAL_KUBE_API_URL"] = self.kube.url
        if self.kubeconfig_written is not None:
            state.env["LOCAL_KUBECONFIG"] = str(self.kubeconfig_written)
        # What `prewarm --local install|doctor` reads from a deployed stack's outputs and parameters.
        outputs = self.stack.outputs()
        state.env.update({name: outputs[key] for key, name in STACK_OUTPUTS.items() if outputs.get(key)})
        state.env["CREDENTIALS_CONFIG"] = json.dumps(self.credentials_config())
        # How often the sweep and the daily round run, which `prewarm doctor` judges their last runs by, and
        # the sweep's graces on a startup taint, which `prewarm get nodes` times its removal by.
        assert self.stack.resolver is not None
        for parameter, name in (("SweepSchedule", "SWEEP_SCHEDULE"), ("RepullSchedule", "REPULL_SCHEDULE"),
                                ("StartupTaintGraceSeconds", "STARTUP_TAINT_GRACE_SECONDS"),
                                ("NoAgentGraceSeconds", "NO_AGENT_GRACE_SECONDS")):
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
