"""The whole of Prewarm on one machine, on 127.0.0.1 only.

AWS is a moto server running `template.yaml` (`LocalStack`); the cluster is the embedded Kubernetes
API (seeded from `samplefiles/cluster.yaml`, or `nodes` synthetic nodes), or a real cluster from a
kubeconfig; every node that would run the DaemonSet gets its own private containerd and its own
agent; a registry plays ECR: it answers for the ECR host name (mapped in each containerd's
`certs.d`) and wants user `AWS` with the password of the token the AWS side hands out, so pulls go
through the real credential path. Nothing is simulated: a pull that fails here fails for real.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import REGION, MotoServer, aws_environment
from prewarm_devtools.sam.stack import ACCOUNT, LocalStack

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


@dataclass
class LocalNode:
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
    ) -> None:
        self.node_count = nodes
        self.kubeconfig = kubeconfig
        self.agents_enabled = agents
        self.stack_name = stack_name
        self.agent_overrides = dict(agent_settings or {})
        # containerd's socket paths must stay short: a short directory under /tmp.
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="pw-", dir="/tmp"))
        self.aws: MotoServer | None = None
        self.kube: Any = None
        self.stack: LocalStack | None = None
        self.registry: Any = None
        self.nodes: dict[str, LocalNode] = {}
        self.ecr_password = ""
        self._env_cm: Any = None
        self._state_path: Path | None = None
        self.function_log: Any = None

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> LocalMode:
        if self.agents_enabled and (problems := missing_prerequisites()):
            raise LocalModeUnavailableError(
                "local mode runs real containerd and a real registry for its nodes; missing: " + "; ".join(problems)
            )
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.aws = MotoServer().start()
        self._env_cm = aws_environment(self.aws.url)
        self._env_cm.__enter__()
        parameters = {"ClusterName": "local"}
        if self.kubeconfig:
            os.environ["KUBECONFIG"] = self.kubeconfig
        else:
            from prewarm_devtools.kubeapi.server import KubeApiServer

            self.kube = KubeApiServer().start()
            if self.node_count:
                from prewarm_devtools.kubeapi.synthetic import generate_cluster

                self.kube.seed_objects(generate_cluster(self.node_count))
            else:
                self.kube.seed_from_file(project_files().samplefiles / "cluster.yaml")
            parameters["KubeApiEndpoint"] = self.kube.url
        parameters["CredentialsConfig"] = json.dumps(self.credentials_config())
        self.function_log = open(self.base_dir / "functions.log", "a", encoding="utf-8")  # noqa: SIM115
        self.stack = LocalStack(self.aws.url, parameters=parameters, stack_name=self.stack_name,
                                failed_visibility_seconds=1, function_output=self.function_log).deploy()
        self.stack.start()
        # The schedule first fires an hour from now: refresh at once, so pull secrets and copies exist.
        self.stack.fire("refresh_ecr_credentials")
        if self.agents_enabled:
            self._start_registry()
            for name in self.daemonset_nodes():
                self._start_node(name)
        self.write_state()

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
        from prewarm_devtools.node.registry import LocalRegistry

        assert self.aws is not None
        token = self.aws.client("ecr").get_authorization_token()["authorizationData"][0]["authorizationToken"]
        user, _, self.ecr_password = base64.b64decode(token).decode().partition(":")
        self.registry = LocalRegistry(self.base_dir / "registry", htpasswd_users={user: self.ecr_password}).start()

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

    def _start_node(self, name: str) -> None:
        from prewarm_agent.agent import Agent
        from prewarm_agent.settings import AgentSettings
        from prewarm_devtools.node.containerd import PrivateContainerd

        assert self.stack is not None and self.aws is not None and self.registry is not None
        index = len(self.nodes)
        containerd = PrivateContainerd(self.base_dir / f"n{index}")
        containerd.add_registry_mirror(ecr_host(), self.registry.url)
        containerd.add_registry_mirror(self.registry.host, self.registry.url)
        containerd.start()
        env = self.stack.env()
        values = {
            "NODE_NAME": name,
            "NODE_QUEUE_PREFIX": env["NODE_QUEUE_PREFIX"],
            "STATUS_QUEUE_URL": env["STATUS_QUEUE_URL"],
            "NODE_DLQ_ARN": env["NODE_DLQ_ARN"],
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.aws.url,
            "SECRET_PREFIX": env["SECRET_PREFIX"],
            # moto's ECR tokens are born expired (2015), so the refresher's copies would be refused.
            "ECR_CREDENTIALS": "role",
            "CRI_SOCKET": str(containerd.socket_path),
            "REGISTRY_CONFIG_PATH": str(containerd.certs_dir),
            "HTTP_BIND_ADDRESS": "127.0.0.1",
            "HTTP_PORT": "0",
            "RECEIVE_WAIT_SECONDS": "1",
            "PROGRESS_INTERVAL_SECONDS": "1",
            "SHUTDOWN_GRACE_SECONDS": "5",
            **({"KUBE_API_ENDPOINT": self.kube.url, "KUBE_BEARER_TOKEN": self.kube.token} if self.kube else {}),
            **self.agent_overrides,
        }
        agent = Agent(AgentSettings.from_env(values))
        agent.start()
        self.nodes[name] = LocalNode(name, containerd, agent)

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                node.agent.stop(2.0)
            finally:
                node.containerd.stop()
        self.nodes.clear()
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        if self.stack is not None:
            self.stack.stop()
            self.stack = None
        if self.kube is not None:
            self.kube.stop()
            self.kube = None
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
        if self._own_dir:
            from prewarm_devtools.node.containerd import unmount_all_under

            unmount_all_under(self.base_dir)
            shutil.rmtree(self.base_dir, ignore_errors=True)

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

    def push(self, repository: str, tag: str | None, *, size_mb: float = 1.0) -> PushedToEcr:
        """Builds an image, pushes it to the registry that plays ECR, and delivers ECR's PUSH event here."""
        assert self.aws is not None and self.stack is not None and self.registry is not None
        pushed, event = push_to_local_ecr(self.registry.url, self.aws.client("ecr"), repository, tag, size_mb=size_mb)
        results = self.stack.put_event(event)
        pushed.jobs = [line for r in results for line in (r or {}).get("jobs", [])]
        return pushed

    def write_state(self) -> None:
        """Tells `prewarm --local` where this stack is (`$PREWARM_LOCAL_STATE` or ~/.prewarm/local.json)."""
        from prewarm_cli.targets import LocalState, write_local_state

        assert self.stack is not None
        state = LocalState.of_stack(self.stack, pid=os.getpid())
        if self.registry is not None:
            state.env["LOCAL_REGISTRY_URL"] = self.registry.url
        self._state_path = write_local_state(state)


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
