"""What `prewarm install` installs: valid against the API schemas (offline), least privilege, filled in
from the stack with nothing left to edit, and consistent with the agent's own settings."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest

from prewarm_agent.settings import AgentSettings
from prewarm_cli.install.render import (
    ALL_NAMESPACES,
    CONTROL_PLANE_GROUP,
    CREDENTIALS_GROUP,
    CRON_RUNS_GROUP,
    MANAGED_BY,
    NODE_WARM_GROUP,
    PULL_SECRETS_GROUP,
    RESOURCES_GROUP,
    STARTUP_TAINT_GROUP,
    InstallError,
    base_documents,
    render,
    values_from_stack,
)

KUBERNETES_VERSION = "1.33.0"
ROLE = "arn:aws:iam::210987654321:role/team-prewarm-agents"
STACK = {
    "STATUS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/210987654321/pw-StatusQueue-AbC",
    "NODE_QUEUE_PREFIX": "pw-node",
    "NODE_DLQ_ARN": "arn:aws:sqs:eu-west-1:210987654321:pw-NodeDLQ-XyZ",
    "SECRET_PREFIX": "prewarm/pw",
    "NODE_QUEUE_SENDER_ARNS": "arn:aws:iam::210987654321:role/pw-DispatchJobRole,"
                              "arn:aws:iam::210987654321:role/pw-SweepRole",
    "AGENT_ROLE_ARN": ROLE,
}
IMAGE = "210987654321.dkr.ecr.eu-west-1.amazonaws.com/prewarm-agent:0.2.0"
CREDENTIALS = json.dumps({"registries": [{"account": "210987654321", "region": "eu-west-1"}],
                          "namespaces": ["team-a", "team-b"], "secretName": "ecr-pull",
                          "serviceAccounts": ["default", "builder"]})


def documents(**overrides: Any) -> list[dict[str, Any]]:
    arguments: dict[str, Any] = {"region": "eu-west-1", "image": IMAGE, "credentials_config": CREDENTIALS,
                                 "pull_secret_namespaces": ["shop"], **overrides}
    return render(values_from_stack(STACK, **arguments))


def one(kind: str, name: str | None = None, **overrides: Any) -> dict[str, Any]:
    (found,) = [doc for doc in documents(**overrides)
                if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)]
    return found


def agent_container(**overrides: Any) -> dict[str, Any]:
    (container,) = one("DaemonSet", **overrides)["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize("doc", documents(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_every_manifest_is_valid_for_the_kubernetes_api(doc: dict[str, Any]) -> None:
    # strict: unknown fields are errors too. Runs with the network off (the schemas ship with the package).
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_install_holds_the_agent_and_the_functions_rbac_and_labels_all_of_it() -> None:
    names = sorted((doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", "")) for doc in documents())

    assert names == sorted([
        ("Namespace", "prewarm-system", ""), ("PriorityClass", "prewarm-agent", ""),
        ("ServiceAccount", "prewarm-agent", "prewarm-system"), ("ClusterRole", "prewarm-agent", ""),
        ("ClusterRoleBinding", "prewarm-agent", ""), ("ConfigMap", "prewarm-agent", "prewarm-system"),
        ("ClusterRole", "prewarm-agent-events", ""), ("RoleBinding", "prewarm-agent-events", "default"),
        ("ValidatingAdmissionPolicy", "prewarm-agent-startup-taint", ""),
        ("ValidatingAdmissionPolicyBinding", "prewarm-agent-startup-taint", ""),
        ("DaemonSet", "prewarm-agent", "prewarm-system"),
        ("ClusterRole", CONTROL_PLANE_GROUP, ""), ("ClusterRoleBinding", CONTROL_PLANE_GROUP, ""),
        ("ClusterRole", "prewarm-control-plane-agents", ""),
        ("RoleBinding", "prewarm-control-plane-agents", "prewarm-system"),
        ("ClusterRole", PULL_SECRETS_GROUP, ""), ("RoleBinding", PULL_SECRETS_GROUP, "shop"),
        ("RoleBinding", f"{RESOURCES_GROUP}-pull-secrets", "shop"),
        ("ClusterRole", "prewarm-credentials-namespaces", ""),
        ("ClusterRoleBinding", "prewarm-credentials-namespaces", ""),
        ("ClusterRole", CREDENTIALS_GROUP, ""), ("RoleBinding", CREDENTIALS_GROUP, "team-a"),
        ("RoleBinding", CREDENTIALS_GROUP, "team-b"),
        ("ClusterRole", RESOURCES_GROUP, ""), ("ClusterRoleBinding", RESOURCES_GROUP, ""),
        ("ClusterRole", CRON_RUNS_GROUP, ""), ("ClusterRoleBinding", CRON_RUNS_GROUP, ""),
        ("RoleBinding", f"{CRON_RUNS_GROUP}-pull-secrets", "shop"),
        ("ValidatingAdmissionPolicy", "prewarm-cron-time-zone", ""),
        ("ValidatingAdmissionPolicyBinding", "prewarm-cron-time-zone", ""),
        ("ClusterRole", STARTUP_TAINT_GROUP, ""), ("ClusterRoleBinding", STARTUP_TAINT_GROUP, ""),
        ("ClusterRole", "prewarm-startup-taint-config", ""),
        ("RoleBinding", "prewarm-startup-taint-config", "prewarm-system"),
        ("RoleBinding", "prewarm-startup-taint-events", "default"),
        ("ClusterRole", NODE_WARM_GROUP, ""), ("ClusterRoleBinding", NODE_WARM_GROUP, ""),
        ("ValidatingAdmissionPolicy", "prewarm-node-warm-condition", ""),
        ("ValidatingAdmissionPolicyBinding", "prewarm-node-warm-condition", ""),
        ("ValidatingAdmissionPolicy", "prewarm-node-warm-labels", ""),
        ("ValidatingAdmissionPolicyBinding", "prewarm-node-warm-labels", ""),
        ("ClusterRole", "prewarm-jobs-edit", ""), ("ClusterRole", "prewarm-jobs-view", ""),
        ("ClusterRole", "prewarm-node-classes", ""), ("ClusterRoleBinding", "prewarm-node-classes", ""),
        ("CustomResourceDefinition", "imagepulljobs.prewarm.dev", ""),
        ("CustomResourceDefinition", "imagelistpulljobs.prewarm.dev", ""),
        ("CustomResourceDefinition", "prewarmrules.prewarm.dev", ""),
        ("CustomResourceDefinition", "warmsnapshots.prewarm.dev", ""),
        ("CustomResourceDefinition", "advancedcronjobs.prewarm.dev", ""),
    ])
    assert all(doc["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1] for doc in documents())


def test_namespaces_come_before_what_lives_in_them_and_roles_before_bindings() -> None:
    kinds = [doc["kind"] for doc in documents()]

    assert kinds.index("Namespace") < min(i for i, d in enumerate(documents()) if d["metadata"].get("namespace"))
    assert kinds.index("CustomResourceDefinition") == 0
    assert max(i for i, k in enumerate(kinds) if k == "ClusterRole") < kinds.index("ClusterRoleBinding")
    assert kinds[-1] == "DaemonSet"


def test_every_stack_value_is_filled_in_and_no_example_value_is_left() -> None:
    text = json.dumps(documents())
    data = one("ConfigMap")["data"]

    assert "111122223333" not in text and "us-west-2" not in text
    assert data["AWS_REGION"] == "eu-west-1" and data["STATUS_QUEUE_URL"] == STACK["STATUS_QUEUE_URL"]
    assert data["NODE_QUEUE_PREFIX"] == "pw-node" and data["SECRET_PREFIX"] == "prewarm/pw"
    # The node queues' DLQ and policy are the control plane's: it makes the queues, no agent does
    assert "NODE_DLQ_ARN" not in data and "NODE_QUEUE_SENDER_ARNS" not in data
    assert agent_container()["image"] == IMAGE
    assert one("ServiceAccount")["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == ROLE


def test_pod_identity_drops_the_irsa_annotations() -> None:
    account = one("ServiceAccount", pod_identity=True)

    assert "annotations" not in account["metadata"]


def test_an_explicit_role_wins_over_the_stacks() -> None:
    other = "arn:aws:iam::210987654321:role/other"

    assert one("ServiceAccount", agent_role_arn=other)["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == other


def test_the_allowlist_and_bottlerocket_selinux_type_reach_the_agent() -> None:
    container = agent_container(registry_allowlist=["ghcr.io", "public.ecr.aws"], bottlerocket=True)

    assert one("ConfigMap", registry_allowlist=["ghcr.io"])["data"]["REGISTRY_ALLOWLIST"] == "ghcr.io"
    assert container["securityContext"]["seLinuxOptions"] == {"type": "super_t"}
    assert "seLinuxOptions" not in agent_container()["securityContext"]


def test_a_registered_clusters_agents_are_told_their_cluster_and_the_own_clusters_install_is_unchanged() -> None:
    assert {"name": "PREWARM_CLUSTER", "value": "gpu-east"} in agent_container(cluster="gpu-east")["env"]
    assert all(e["name"] != "PREWARM_CLUSTER" for e in agent_container()["env"])
    assert "PREWARM_CLUSTER" not in one("ConfigMap")["data"]


def test_the_startup_taint_and_warm_deadline_reach_the_agent_and_the_admission_policy() -> None:
    # The agent reads the ConfigMap's keys; the policy's binding reads the same ConfigMap as its params.
    data = one("ConfigMap", startup_taint="karpenter.example.com/cold=yes:NoExecute", max_warm_seconds=600)["data"]
    default = one("ConfigMap")["data"]

    assert (data["STARTUP_TAINT_KEY"], data["STARTUP_TAINT_EFFECT"], data["MAX_WARM_SECONDS"]) == (
        "karpenter.example.com/cold", "NoExecute", "600")
    assert (default["STARTUP_TAINT_KEY"], default["STARTUP_TAINT_EFFECT"], default["MAX_WARM_SECONDS"]) == (
        "prewarm.dev/warming", "NoSchedule", "900")
    settings = AgentSettings.model_validate({**data, "NODE_NAME": "n1"})
    assert str(settings.startup_taint) == "karpenter.example.com/cold:NoExecute" and settings.max_warm_seconds == 600


@pytest.mark.parametrize(("overrides", "message"), [
    ({"startup_taint": "prewarm.dev/warming"}, "--startup-taint: taint 'prewarm.dev/warming' must be key"),
    ({"startup_taint": "bad key!:NoSchedule"}, '--startup-taint: key "bad key!"'),
    ({"startup_taint": "x:NoWay"}, "Effect one of NoSchedule, PreferNoSchedule, NoExecute"),
    ({"max_warm_seconds": 0}, "--max-warm-seconds: 0 must be at least 1"),
])
def test_a_bad_startup_taint_or_deadline_is_refused_naming_the_option(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InstallError, match=re.escape(message)):
        documents(**overrides)


def test_every_namespace_binds_the_pull_secret_group_cluster_wide() -> None:
    binding = one("ClusterRoleBinding", PULL_SECRETS_GROUP, pull_secret_namespaces=["*"])

    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PULL_SECRETS_GROUP}]
    assert not [d for d in documents(pull_secret_namespaces=ALL_NAMESPACES) if d["kind"] == "RoleBinding"
                and d["metadata"]["name"] == PULL_SECRETS_GROUP]


def test_the_resource_sync_may_read_pull_secrets_where_dispatch_may_to_check_pull_secrets_only_jobs() -> None:
    # Before: the sync could not read a secret, so a pullSecretsOnly resource could not be checked.
    binding = one("RoleBinding", f"{RESOURCES_GROUP}-pull-secrets", pull_secret_namespaces=["shop"])
    assert binding["metadata"]["namespace"] == "shop"
    assert binding["roleRef"]["name"] == PULL_SECRETS_GROUP
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": RESOURCES_GROUP}]
    every = one("ClusterRoleBinding", f"{RESOURCES_GROUP}-pull-secrets", pull_secret_namespaces=["*"])
    assert every["roleRef"]["name"] == PULL_SECRETS_GROUP


def test_credential_rbac_names_the_configured_secret_and_service_accounts_only() -> None:
    rules = one("ClusterRole", CREDENTIALS_GROUP)["rules"]

    assert rules == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["ecr-pull"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["default", "builder"],
         "verbs": ["get", "patch"]},
    ]


def test_pattern_targets_bind_credentials_cluster_wide_and_no_targets_install_no_credential_rbac() -> None:
    patterns = json.dumps({"registries": [{"account": "210987654321", "region": "eu-west-1"}],
                           "namespaces": {"include": ["team-*"]}})
    copies_only = json.dumps({"registries": [{"account": "210987654321", "region": "eu-west-1"}]})

    binding = one("ClusterRoleBinding", CREDENTIALS_GROUP, credentials_config=patterns)
    assert binding["roleRef"]["name"] == CREDENTIALS_GROUP
    assert not [d for d in documents(credentials_config=copies_only) if "credentials" in d["metadata"]["name"]]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"image": ""}, "image is empty"),
    ({"pod_identity": True, "agent_role_arn": ROLE}, "--agent-role-arn and --pod-identity exclude each other"),
    ({"pull_secret_namespaces": ["Shop"]}, "--pull-secret-namespaces: 'Shop'"),
    ({"pull_secret_namespaces": ["*,shop"]}, "'*' (every namespace) stands alone"),
    ({"credentials_config": '{"registries": []}'}, "the stack's CredentialsConfig: registries"),
])
def test_bad_values_are_refused_naming_the_value(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InstallError) as caught:
        documents(**overrides)

    assert message in str(caught.value)


def test_no_agent_role_is_refused_with_both_ways_to_give_one() -> None:
    stack = {k: v for k, v in STACK.items() if k != "AGENT_ROLE_ARN"}

    with pytest.raises(InstallError) as caught:
        render(values_from_stack(stack, region="eu-west-1", image=IMAGE))

    assert "--agent-role-arn ARN" in str(caught.value) and "--pod-identity" in str(caught.value)


def test_the_shipped_files_keep_their_example_values_apart_from_the_code() -> None:
    # The files are readable examples; render() must change them, not the cached originals.
    before = base_documents()
    documents(bottlerocket=True, pod_identity=True)

    assert base_documents() == before


def test_the_cluster_role_allows_only_get_and_patch_on_nodes_and_events_only_in_default() -> None:
    rules = one("ClusterRole", "prewarm-agent")["rules"]
    events = one("RoleBinding", "prewarm-agent-events")

    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert one("ClusterRole", "prewarm-agent-events")["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert events["metadata"]["namespace"] == "default"
    assert events["subjects"] == [{"kind": "ServiceAccount", "name": "prewarm-agent", "namespace": "prewarm-system"}]


def test_the_role_is_bound_to_the_agents_service_account() -> None:
    binding, account = one("ClusterRoleBinding", "prewarm-agent"), one("ServiceAccount")

    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "prewarm-agent"}
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
    # The record of what the agent pulled outlives the pod: a hostPath, writable
    assert volumes["state"]["hostPath"] == {"path": env["STATE_DIR"], "type": "DirectoryOrCreate"}
    assert mounts["state"]["mountPath"] == env["STATE_DIR"] and not mounts["state"].get("readOnly")


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


def test_the_job_crds_take_kruises_spec_and_print_kruises_columns() -> None:
    crd = one("CustomResourceDefinition", "imagepulljobs.prewarm.dev")
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]

    assert (crd["spec"]["group"], crd["spec"]["scope"], version["name"]) == ("prewarm.dev", "Namespaced", "v1alpha1")
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE", "MESSAGE"]
    assert set(spec["properties"]) == {"image", "pullSecrets", "pullSecretsOnly", "selector", "podSelector",
                                       "parallelism", "pullPolicy", "completionPolicy", "sandboxConfig",
                                       "imagePullPolicy"}
    assert one("CustomResourceDefinition", "prewarmrules.prewarm.dev")["spec"]["scope"] == "Cluster"


def test_namespace_editors_may_run_jobs_and_viewers_read_them_through_the_built_in_roles() -> None:
    edit, view = one("ClusterRole", "prewarm-jobs-edit"), one("ClusterRole", "prewarm-jobs-view")

    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "prewarmrules" not in json.dumps(edit["rules"])
