"""A node's agent as a container on the node's own containerd, set up as the agent DaemonSet's pod is.

Everything the pod gets comes from the DaemonSet that `prewarm install` rendered into the cluster and
its ConfigMap: the image's entrypoint, the environment (`envFrom`, `env`, `fieldRef: spec.nodeName`),
the volume mounts (each `hostPath` is the node's own: its containerd socket, root and registry
config), the security context (read-only root, dropped capabilities, no privilege escalation, the
runtime's seccomp profile) and the memory limit. What the container needs and the manifests do not
give it is a bug in the manifests.

Local mode differs from a node of EKS in what a laptop cannot be, and only there:
- the pod shares the host's network namespace, as nothing else here reaches the stack's servers on
  127.0.0.1; so its HTTP server binds 127.0.0.1 on a port of its own (the DaemonSet's 0.0.0.0:9102
  would collide between nodes);
- AWS, the Kubernetes API and their credentials are the local stack's (`local`), as IRSA or Pod
  Identity and the projected service account token would be; the API's CA file is mounted read-only;
- the node's containerd keeps its root under a temporary directory, not /var/lib/containerd, and
  reports that path to the agent's disk guard, so the root is mounted there as well.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm_devtools.node.agent import agent_state
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.process import ProcessExit

# Kubernetes' `drop: [ALL]`: every capability a container gets by default (containerd's defaults, as
# `ctr run` takes them one by one).
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
NAMESPACE = "k8s.io"
# What the agent logs once it has said hello and consumes its queue.
_READY_LINE = '"consuming '
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}


class PodSpecError(ValueError):
    """The DaemonSet asks for something a container here cannot be given; names the field."""


@dataclass(frozen=True)
class ContainerRun:
    """What `ctr run` is given for one node's agent: its flags and the environment."""

    flags: tuple[str, ...]
    env: dict[str, str]


def agent_container(daemon_set: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The pod spec and its one container."""
    pod = daemon_set["spec"]["template"]["spec"]
    containers = pod.get("containers") or []
    if len(containers) != 1:
        raise PodSpecError(f"spec.template.spec.containers: the agent pod has one container, not {len(containers)}")
    return pod, containers[0]


def container_env(daemon_set: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, str]], node: str,
                  local: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it (`envFrom`, then `env`), then `local`'s
    values for what a laptop provides differently (see the module's docstring)."""
    _, container = agent_container(daemon_set)
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        name = (source.get("configMapRef") or {}).get("name")
        if name is None:
            raise PodSpecError(f"envFrom: only configMapRef is supported here, not {sorted(source)}")
        if name not in config_maps:
            raise PodSpecError(f"envFrom: ConfigMap {name} does not exist")
        env.update(config_maps[name])
    for item in container.get("env") or ():
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[item["name"]] = node
        else:
            raise PodSpecError(f"env {item.get('name')}: only values and fieldRef spec.nodeName are supported here")
    return {**env, **local}


def container_flags(daemon_set: Mapping[str, Any], host_paths: Mapping[str, Path], *,
                    extra_mounts: Mapping[Path, Path] = {}) -> list[str]:
    """`ctr run` flags for the pod's mounts, security context and memory limit. `host_paths` maps each
    hostPath of the DaemonSet to this node's own; `extra_mounts` adds read-only mounts (host: container)."""
    pod, container = agent_container(daemon_set)
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    flags = ["--net-host"]
    for mount in container.get("volumeMounts") or ():
        volume = volumes.get(mount["name"])
        if volume is None or "hostPath" not in volume:
            raise PodSpecError(f"volumeMounts {mount['name']}: only hostPath volumes are supported here")
        path = volume["hostPath"]["path"]
        if path not in host_paths:
            raise PodSpecError(f"volumes {mount['name']}: hostPath {path} has no counterpart on a local node")
        options = ["rbind", "ro" if mount.get("readOnly") else "rw"]
        if mount.get("mountPropagation") == "HostToContainer":
            options.append("rslave")
        flags.append(f"--mount=type=bind,src={host_paths[path]},dst={mount['mountPath']},options={':'.join(options)}")
    for src, dst in extra_mounts.items():
        flags.append(f"--mount=type=bind,src={src},dst={dst},options=rbind:ro")
    security = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if security.get("privileged"):
        flags.append("--privileged")
    if security.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if security.get("allowPrivilegeEscalation", True):
        flags.append("--allow-new-privs")
    capabilities = security.get("capabilities") or {}
    dropped = [c for name in capabilities.get("drop") or ()
               for c in (DEFAULT_CAPABILITIES if name == "ALL" else (f"CAP_{name}",))]
    flags += [f"--cap-drop={c}" for c in dropped]
    flags += [f"--cap-add=CAP_{c}" for c in capabilities.get("add") or ()]
    if (security.get("seccompProfile") or {}).get("type") == "RuntimeDefault":
        flags.append("--seccomp")
    if (limit := ((container.get("resources") or {}).get("limits") or {}).get("memory")) is not None:
        flags.append(f"--memory-limit={memory_bytes(limit)}")
    return flags


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (`256Mi`, `1G`, `1048576`) in bytes."""
    for suffix, factor in _UNITS.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


class AgentContainer:
    """The agent of one node, run from the agent image on that node's containerd (`ctr run`)."""

    def __init__(self, containerd: PrivateContainerd, archive: Path, reference: str, run: ContainerRun,
                 node: str, log_path: Path, *, start_timeout: float = 60.0) -> None:
        self.containerd = containerd
        self.archive = archive
        self.reference = reference
        self.run = run
        self.node = node
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.container_id = f"prewarm-agent-{node}"[:64]
        self._pid: int | None = None
        # How the container's last run ended (None: it has not ended yet), and whether `stop` or `kill` ended it.
        self.exit_status: int | None = None
        self._requested = ""

    @property
    def http_port(self) -> int:
        return int(self.run.env["HTTP_PORT"])

    def ctr(self, *args: str, timeout: float = 120) -> str:
        command = [self.containerd.ctr, "--address", str(self.containerd.socket_path), "--namespace", NAMESPACE, *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args[:2])} for {self.node}: {(result.stderr or result.stdout).strip()}")
        return result.stdout

    def import_image(self) -> None:
        """Imports the image into the node's containerd, as a pull from the registry would give it."""
        if self.reference not in self.ctr("images", "ls", "--quiet").split():
            self.ctr("images", "import", str(self.archive))

    def start(self) -> None:
        """Runs the container detached and waits until the agent consumes its queue."""
        self.import_image()
        self._remove_leftover()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = [f"--env={k}={v}" for k, v in self.run.env.items()]
        self.ctr("run", "--detach", f"--log-uri=file://{self.log_path}", *self.run.flags, *env,
                 self.reference, self.container_id)
        self._pid = self._task_pid()
        self.exit_status, self._requested = None, ""
        deadline = time.monotonic() + self.start_timeout
        while not self._logged_since(offset):
            if not self.running:
                raise RuntimeError(f"the agent container of {self.node} exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agent container of {self.node} did not start: {self.log_tail()}")
            time.sleep(0.1)

    def _logged_since(self, offset: int) -> bool:
        if not self.log_path.exists():
            return False
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return _READY_LINE.encode() in log.read()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _tasks(self) -> dict[str, tuple[int, str]]:
        """Each task's pid and status (RUNNING, STOPPED...)."""
        found = {}
        for line in self.ctr("tasks", "ls").splitlines()[1:]:
            words = line.split()
            if len(words) >= 3:
                found[words[0]] = (int(words[1]), words[2])
        return found

    def _task_pid(self) -> int | None:
        task = self._tasks().get(self.container_id)
        return task[0] if task is not None else None

    @property
    def running(self) -> bool:
        task = self._tasks().get(self.container_id)
        return task is not None and task[1] == "RUNNING"

    @property
    def last_exit(self) -> ProcessExit | None:
        """How the last run ended, once `stop` or `kill` removed its task (a task that died on its own
        keeps its status in containerd until then: None)."""
        if self.exit_status is None:
            return None
        return ProcessExit.of_wait_status(self.exit_status, self._requested)

    @property
    def state(self) -> str:
        return agent_state(self.running, self.last_exit)

    @property
    def pid(self) -> int | None:
        return self._pid if self.running else None

    @property
    def start_time(self) -> int | None:
        return None

    def signal(self, name: str) -> None:
        self.ctr("tasks", "kill", "--signal", name, self.container_id)

    def stop(self, grace: float) -> None:
        """SIGTERM to the agent (PID 1 of the container): it drains for its SHUTDOWN_GRACE_SECONDS and
        exits; SIGKILL after `grace` more seconds, as the kubelet does after terminationGracePeriodSeconds."""
        if not self.running:
            self._remove_leftover()
            return
        self._requested = "stop"
        self.signal("SIGTERM")
        deadline = time.monotonic() + float(self.run.env.get("SHUTDOWN_GRACE_SECONDS", "25")) + grace
        while self.running and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.running:
            self.signal("SIGKILL")
        self._remove_leftover()

    def kill(self) -> None:
        """SIGKILL, as a crashed agent (or an OOM kill)."""
        if self.running:
            self._requested = "kill"
            self.signal("SIGKILL")
        self._remove_leftover()

    def _remove_leftover(self) -> None:
        """Deletes a stopped task and the container, keeping its exit status."""
        task = self._tasks().get(self.container_id)
        if task is not None:
            deadline = time.monotonic() + 10
            while task is not None and task[1] != "STOPPED" and time.monotonic() < deadline:
                time.sleep(0.1)
                task = self._tasks().get(self.container_id)
            command = [self.containerd.ctr, "--address", str(self.containerd.socket_path), "--namespace", NAMESPACE,
                       "tasks", "delete", "--force", self.container_id]
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            self.exit_status = _exit_status(done.stdout + done.stderr)
        if self.container_id in self.ctr("containers", "ls", "--quiet").split():
            self.ctr("containers", "delete", self.container_id)


def _exit_status(out: str) -> int:
    """`ctr tasks delete` says nothing of a task that exited 0, and warns of any other exit code."""
    found = re.search(r"exit code (\d+)", out)
    return int(found.group(1)) if found else 0
