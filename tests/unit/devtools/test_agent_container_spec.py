"""Local mode's containerized agent takes its settings from the DaemonSet `prewarm install` renders."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from prewarm_cli.install.render import render, values_from_stack
from prewarm_devtools.node.container import (
    DEFAULT_CAPABILITIES,
    PodSpecError,
    container_env,
    container_flags,
    memory_bytes,
)

STACK = {
    "STATUS_QUEUE_URL": "http://127.0.0.1:5000/123456789012/status", "NODE_QUEUE_PREFIX": "pw-node",
    "NODE_DLQ_ARN": "arn:aws:sqs:us-west-2:123456789012:dlq", "SECRET_PREFIX": "prewarm/pw",
    "NODE_QUEUE_SENDER_ARNS": "arn:aws:iam::123456789012:role/dispatch",
    "AGENT_ROLE_ARN": "arn:aws:iam::123456789012:role/agents",
}
HOST = {"/run/containerd/containerd.sock": Path("/tmp/n0/containerd.sock"),
        "/var/lib/containerd": Path("/tmp/n0/root"), "/etc/containerd/certs.d": Path("/tmp/n0/certs.d"),
        "/etc/containerd/config.toml": Path("/tmp/n0/config.toml"),
        "/var/lib/prewarm": Path("/tmp/n0/prewarm")}


def rendered() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    docs = render(values_from_stack(STACK, region="us-west-2", image="prewarm-agent:0.1.0"))
    (daemon_set,) = [d for d in docs if d["kind"] == "DaemonSet"]
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    return daemon_set, config_maps


def test_the_environment_is_the_config_map_then_the_pods_env_then_the_nodes_own() -> None:
    daemon_set, config_maps = rendered()
    env = container_env(daemon_set, config_maps, "node-a", {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
                                                            "HTTP_PORT": "41000"})
    assert env["NODE_NAME"] == "node-a"  # fieldRef spec.nodeName
    assert env["CRI_SOCKET"] == "/run/containerd/containerd.sock"  # the pod's env
    assert env["STATUS_QUEUE_URL"] == STACK["STATUS_QUEUE_URL"]  # envFrom the ConfigMap
    assert env["SHUTDOWN_GRACE_SECONDS"] == "25"
    assert (env["AWS_ENDPOINT_URL"], env["HTTP_PORT"]) == ("http://127.0.0.1:5000", "41000")  # the node's own


def test_the_security_context_mounts_and_memory_limit_become_run_flags() -> None:
    daemon_set, _ = rendered()
    flags = container_flags(daemon_set, HOST, extra_mounts={Path("/tmp/ca.crt"): Path("/tmp/ca.crt")})
    assert "--read-only" in flags and "--seccomp" in flags and "--net-host" in flags
    assert "--allow-new-privs" not in flags and "--privileged" not in flags  # allowPrivilegeEscalation: false
    assert [f for f in flags if f.startswith("--cap-drop=")] == [f"--cap-drop={c}" for c in DEFAULT_CAPABILITIES]
    assert "--memory-limit=268435456" in flags  # limits.memory 256Mi
    assert "--mount=type=bind,src=/tmp/n0/containerd.sock,dst=/run/containerd/containerd.sock,options=rbind:rw" in flags
    assert "--mount=type=bind,src=/tmp/n0/root,dst=/var/lib/containerd,options=rbind:ro:rslave" in flags
    assert "--mount=type=bind,src=/tmp/n0/certs.d,dst=/etc/containerd/certs.d,options=rbind:ro" in flags
    assert "--mount=type=bind,src=/tmp/n0/config.toml,dst=/etc/containerd/config.toml,options=rbind:ro" in flags
    # the record of pulls, writable: it outlives the agent
    assert "--mount=type=bind,src=/tmp/n0/prewarm,dst=/var/lib/prewarm,options=rbind:rw" in flags
    assert "--mount=type=bind,src=/tmp/ca.crt,dst=/tmp/ca.crt,options=rbind:ro" in flags


def test_a_pod_that_escalates_or_mounts_what_a_node_lacks_is_named() -> None:
    daemon_set, config_maps = rendered()
    escalating = copy.deepcopy(daemon_set)
    container = escalating["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"] = {"allowPrivilegeEscalation": True, "privileged": True}
    assert {"--allow-new-privs", "--privileged"} <= set(container_flags(escalating, HOST))
    assert "--read-only" not in container_flags(escalating, HOST)
    with pytest.raises(PodSpecError, match="hostPath /var/lib/containerd has no counterpart"):
        container_flags(daemon_set, {k: v for k, v in HOST.items() if k != "/var/lib/containerd"})
    with pytest.raises(PodSpecError, match="envFrom: ConfigMap prewarm-agent does not exist"):
        container_env(daemon_set, {}, "node-a", {})
    secret_env = copy.deepcopy(daemon_set)
    secret_env["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
    with pytest.raises(PodSpecError, match=r"env TOKEN: only values and fieldRef spec\.nodeName"):
        container_env(secret_env, config_maps, "node-a", {})


@pytest.mark.parametrize(("quantity", "expected"), [("256Mi", 268435456), ("1Gi", 2**30), ("500M", 500_000_000),
                                                    ("1048576", 1048576), ("1.5Gi", 1610612736)])
def test_memory_quantities_are_read_as_kubernetes_writes_them(quantity: str, expected: int) -> None:
    assert memory_bytes(quantity) == expected
