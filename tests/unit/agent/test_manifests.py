"""The agent's Kubernetes manifests: valid against the API schemas (offline), least privilege, and
consistent with the agent's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from prewarm_agent.settings import AgentSettings

DEPLOY = Path(__file__).resolve().parents[3] / "agent" / "deploy"
KUBERNETES_VERSION = "1.33.0"


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return docs


def one(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in documents() if doc["kind"] == kind]
    return found


def agent_container() -> dict[str, Any]:
    (container,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize("doc", documents(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_every_manifest_is_valid_for_the_kubernetes_api(doc: dict[str, Any]) -> None:
    # strict: unknown fields are errors too. Runs with the network off (the schemas ship with the package).
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_files_hold_what_the_agent_needs() -> None:
    kinds = sorted(doc["kind"] for doc in documents())

    assert kinds == sorted(["Namespace", "PriorityClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "ConfigMap", "DaemonSet"])


def test_the_cluster_role_allows_only_get_on_nodes() -> None:
    assert one("ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_the_role_is_bound_to_the_agents_service_account() -> None:
    binding, account = one("ClusterRoleBinding"), one("ServiceAccount")

    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one("ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]


def test_the_daemonset_runs_on_every_node_with_its_own_priority() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]

    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == one("PriorityClass")["metadata"]["name"]
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    assert one("PriorityClass")["preemptionPolicy"] == "Never"


def test_the_node_name_comes_from_the_downward_api() -> None:
    env = {item["name"]: item for item in agent_container()["env"]}

    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_containerd_socket_is_mounted_from_the_host_at_the_configured_path() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in agent_container()["volumeMounts"]}
    env = {item["name"]: item.get("value") for item in agent_container()["env"]}

    assert volumes["containerd-socket"]["hostPath"] == {"path": env["CRI_SOCKET"], "type": "Socket"}
    assert mounts["containerd-socket"]["mountPath"] == env["CRI_SOCKET"]
    assert mounts["registry-config"]["mountPath"] == env["REGISTRY_CONFIG_PATH"]
    assert mounts["containerd-root"]["readOnly"] is True


def test_probes_and_metrics_use_the_agents_port() -> None:
    container = agent_container()
    env = {item["name"]: item.get("value") for item in container["env"]}
    (port,) = container["ports"]

    assert port == {"name": "metrics", "containerPort": int(env["HTTP_PORT"]), "protocol": "TCP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert env["HTTP_BIND_ADDRESS"] == "0.0.0.0"


def test_settings_in_the_manifests_are_valid_and_the_grace_period_outlasts_the_drain() -> None:
    env = {item["name"]: item["value"] for item in agent_container()["env"] if "value" in item}
    environment = {**one("ConfigMap")["data"], **env, "NODE_NAME": "ip-10-0-1-5.ec2.internal"}

    settings = AgentSettings.from_env(environment)

    pod = one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_seconds + 5
    known = {str(field.alias) for field in AgentSettings.model_fields.values()}
    assert set(environment) <= known


def test_the_container_keeps_only_what_root_needs() -> None:
    security = agent_container()["securityContext"]

    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert "limits" in agent_container()["resources"] and "requests" in agent_container()["resources"]
