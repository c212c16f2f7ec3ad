"""What the control channel asks of a running local stack: `prewarm local fire|node|agent|cluster|status`.

`LocalControl` answers each request (`ControlServer` in control.py serves them); a request that cannot be
done raises `ControlError` with the status code and a message for the user.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prewarm_devtools.account import ACCOUNT
from prewarm_devtools.control import ControlError, ControlServer
from prewarm_devtools.localclusters import LocalCluster
from prewarm_devtools.localnodes import LocalNode, LocalNodes, node_object
from prewarm_devtools.sam.aws import LocalIdentity

# `prewarm local fire NAME`: the schedules a user fires, and the function each one runs.
SCHEDULES = {"repull": "repull_daily", "sweep": "sweep", "refresh": "refresh_ecr_credentials", "sync": "sync_resources",
             "bakes": "bake_snapshots"}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class LocalControl(LocalNodes):
    """The control channel's requests: fire a schedule, add or remove a node, stop, kill or start an agent,
    stop or start a cluster's API, set a kubelet's credential policy, and the status of every endpoint and node."""

    # Set by `LocalMode.__init__` and its start.
    control: ControlServer | None
    registry_bandwidth: int | None
    kubeconfig: str | None
    kubeconfig_written: Path | None
    extra_clusters: dict[str, LocalCluster]

    def _control_route(self, method: str, parts: list[str], body: dict[str, Any]) -> dict[str, Any]:
        match method, parts:
            case "GET", ["status"]:
                return self.status()
            case "POST", ["fire"]:
                return self.fire(str(body.get("schedule", "")))
            case "POST", ["nodes"]:
                return self.add_node(str(body.get("name", "")), labels=dict(body.get("labels") or {}),
                                     taints=list(body.get("taints") or []), agent=bool(body.get("agent", True)),
                                     node_class=body.get("node_class") or None,
                                     images=[str(i) for i in body.get("images") or []])
            case "DELETE", ["nodes", name]:
                return self.remove_node(name)
            case "POST", ["nodes", name, "kubelet"]:
                return self.set_kubelet_policy(name, body.get("policy"), list(body.get("allowlist") or []))
            case "POST", ["agents", node, action]:
                return self.agent_action(node, action)
            case "POST", ["clusters", name, action]:
                return self.cluster_action(name, action, hang=bool(body.get("hang", False)))
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
        """Fires a schedule now: `repull` (the daily re-pull), `sweep`, `refresh` (ECR credentials), `sync`
        (the prewarm.dev resources) or `bakes` (warm snapshots' sweep)."""
        if schedule not in SCHEDULES:
            raise ControlError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
        assert self.stack is not None
        function = SCHEDULES[schedule]
        result = self.stack.fire(function)
        return {"function": function, "result": result}

    def add_node(self, name: str, *, labels: dict[str, str], taints: list[dict[str, str]],
                 agent: bool = True, agent_policies: list[dict[str, Any]] | None = None,
                 node_class: str | None = None, images: Sequence[str] = ()) -> dict[str, Any]:
        """Registers a Ready node in the embedded Kubernetes API; with `agent`, starts its containerd and agent.

        `images`: pulled into the node's containerd before its agent starts (a node pre-pulled, or booted warm).

        `agent_policies`: the identity policies of this node's agent instead of the stack's AgentPolicy;
        the agent then signs as a role of its own (`<stack>-agent-<node>`), e.g. one that lacks what the
        agent needs, as a node group whose role misses the policy. An agent that exits as it starts leaves
        the node as it is, its taints included, with `agent_error` in the answer.
        `node_class`: a Karpenter EC2NodeClass; the node's containerd starts from the snapshot its data
        volume names (`snapshotID`), as an instance Karpenter launches from it does. The Node joins once its
        containerd serves, as a kubelet registers it (EKS's AMIs start kubelet after containerd)."""
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
        snapshot = self._node_class_snapshot(node_class) if node_class else None
        if snapshot is not None and not agent:
            raise ControlError("node_class: the node's volume is its containerd's: add it with an agent")
        if node_class:
            from prewarm_cli.snapshot_output import NODE_CLASS_LABEL

            labels = {**labels, NODE_CLASS_LABEL: node_class}  # as Karpenter labels the nodes it launches
        kube = self.kube

        def join() -> None:
            kube.seed_objects([node_object(name, labels, taints)])

        if not agent:
            join()
        else:
            try:
                self._start_node(name, restore=snapshot, preload=images, join=join)
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

    def cluster_action(self, name: str, action: str, *, hang: bool = False) -> dict[str, Any]:
        """`stop` or `start` local cluster `name`'s Kubernetes API, its objects kept: stopped, its port
        refuses connections, as a dead endpoint does; stopped with `hang`, it accepts them and never
        answers, as an endpoint whose packets are dropped does. Its nodes and agents go on."""
        if action not in ("stop", "start"):
            raise ControlError(f"unknown cluster action {action!r}: choose stop or start", 404)
        apis = {c.name: c.kube for c in self.extra_clusters.values()}
        if self.kube is not None and self.stack is not None:
            apis[self.stack.parameters.get("ClusterName", "local")] = self.kube
        if (kube := apis.get(name)) is None:
            raise ControlError(f'no local cluster "{name}": the embedded ones are {", ".join(sorted(apis)) or "none"}',
                               404)
        wanted = "serving" if action == "start" else "hung" if hang else "stopped"
        if kube.state == wanted:
            raise ControlError(f'the API of cluster "{name}" is already {wanted}')
        kube.start() if action == "start" else kube.hang() if hang else kube.stop()
        return {"name": name, "api": kube.state, "kubernetes": kube.url}

    def _node_status(self, name: str) -> dict[str, Any]:
        node = self.nodes.get(name)
        return {"name": name, **self._node_fields(node), **({} if node is None else {
                "agent_kind": "container" if self.agent_image is not None
                else "process" if self.agent_processes else "in-process"}),
                **({"agent_error": self._agent_errors[name]} if name in self._agent_errors else {})}

    @staticmethod
    def _node_fields(node: LocalNode | None) -> dict[str, Any]:
        from prewarm_devtools.node.agent import NONE, exit_note

        if node is None:
            return {"agent": NONE, "pid": None, "containerd_pid": None, "containerd_socket": None, "exit": None}
        state = node.agent.state
        return {"agent": state, "pid": node.agent.pid, "exit": exit_note(node.agent.last_exit, state),
                "containerd_pid": node.containerd.pid, "containerd_socket": str(node.containerd.socket_path)}

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
                **({"api": self.kube.state} if self.kube is not None else {}),
                **({"clusters": [c.status(self._node_fields) for c in self.extra_clusters.values()]}
                   if self.extra_clusters else {}),
                **({"kubeconfig": str(self.kubeconfig_written)} if self.kubeconfig_written else {})}
