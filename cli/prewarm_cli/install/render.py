"""What `prewarm install` puts into a cluster, filled in from a stack: pure, no I/O but reading the base
manifests shipped beside this module.

The base manifests (`manifests/*.yaml`) are complete objects with example values; `render()` replaces
every stack-specific value (queues, region, roles, image, allowlist) and adds the bindings that depend
on the stack's configuration: the functions' groups (the template's `AWS::EKS::AccessEntry` resources
name the same groups) bound to their ClusterRoles, per namespace where the stack's configuration
names namespaces. Every object carries `MANAGED_BY`, which `uninstall` selects on.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from prewarm.domain.cronjobs import ZONE_NOT_GIVEN
from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE, StartupTaint, parse_taint
from prewarm_cli.install.crds import custom_resource_definitions

__all__ = [
    "AGENT_NAME",
    "AGENT_NAMESPACE",
    "ALL_NAMESPACES",
    "CONTROL_PLANE_GROUP",
    "CREDENTIALS_GROUP",
    "CRON_RUNS_GROUP",
    "FUNCTION_GROUPS",
    "KIND_PLURALS",
    "MANAGED_BY",
    "NODE_WARM_GROUP",
    "PULL_SECRETS_GROUP",
    "RESOURCES_GROUP",
    "STARTUP_TAINT_GROUP",
    "InstallError",
    "InstallValues",
    "render",
]

Obj = dict[str, Any]

MANIFESTS = Path(__file__).resolve().parent / "manifests"
#: Label selecting what `prewarm install` made (`uninstall` deletes exactly these).
MANAGED_BY = ("app.kubernetes.io/managed-by", "prewarm-install")
#: The Kubernetes groups of the functions' access entries (template.yaml `ClusterAccess`).
CONTROL_PLANE_GROUP = "prewarm-control-plane"
PULL_SECRETS_GROUP = "prewarm-pull-secrets"
CREDENTIALS_GROUP = "prewarm-credentials"
RESOURCES_GROUP = "prewarm-resources"
CRON_RUNS_GROUP = "prewarm-cron-runs"
# The policy that warns of an AdvancedCronJob resource with no time zone (86-cron-time-zone-policy.yaml).
CRON_ZONE_POLICY = "prewarm-cron-time-zone"
STARTUP_TAINT_GROUP = "prewarm-startup-taint"
NODE_WARM_GROUP = "prewarm-node-warm"
NODE_CLASSES_GROUP = "prewarm-node-classes"
ALL_NAMESPACES = ("*",)
#: Each function role's groups, as template.yaml's access entries give them (keyed by the stack
#: setting that names the role).
FUNCTION_GROUPS: dict[str, tuple[str, ...]] = {
    "DISPATCH_JOB_ROLE_ARN": (CONTROL_PLANE_GROUP, PULL_SECRETS_GROUP),
    "RECORD_STATUS_ROLE_ARN": (CONTROL_PLANE_GROUP, STARTUP_TAINT_GROUP, NODE_WARM_GROUP),
    "SWEEP_ROLE_ARN": (CONTROL_PLANE_GROUP, STARTUP_TAINT_GROUP),
    "REFRESH_ECR_CREDENTIALS_ROLE_ARN": (CREDENTIALS_GROUP,),
    "SYNC_RESOURCES_ROLE_ARN": (RESOURCES_GROUP,),
    "RUN_CRON_JOB_ROLE_ARN": (CRON_RUNS_GROUP,),
    "BAKE_SNAPSHOTS_ROLE_ARN": (NODE_CLASSES_GROUP,),
}
#: Kind → (API version, plural, namespaced): every kind install writes.
KIND_PLURALS: dict[str, tuple[str, str, bool]] = {
    "CustomResourceDefinition": ("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Namespace": ("v1", "namespaces", False),
    "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses", False),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ConfigMap": ("v1", "configmaps", True),
    # After the ConfigMap it reads its parameters from, before the DaemonSet whose agents it constrains.
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", False),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "DaemonSet": ("apps/v1", "daemonsets", True),
}
#: The agent's setting naming its registered cluster (`prewarm_agent.settings`).
CLUSTER_ENV = "PREWARM_CLUSTER"
# Bottlerocket labels the containerd socket so that only privileged SELinux types reach it;
# `super_t` is the type its security guidance names for containers that must use host sockets.
BOTTLEROCKET_SELINUX = {"type": "super_t"}


class InstallError(ValueError):
    """A value install needs is missing or wrong; the message names it and how to give it."""


@dataclass(frozen=True)
class InstallValues:
    """Everything stack-specific in the installed objects.

    `agent_role_arn`: the agents' IAM role for IRSA (the service account's annotation); empty with
    `pod_identity` (an EKS Pod Identity association names the service account instead).
    `pull_secret_namespaces`: where `dispatch_job` may read the pull secrets jobs name
    (`ALL_NAMESPACES`: every namespace, now and later); `pull_secret_names`, when given, the only secrets
    it may read there (RBAC `resourceNames`). `credential_namespaces`, `credential_secret`
    and `credential_service_accounts`: what `refresh_ecr_credentials` writes, from the stack's
    credentials configuration (no namespaces: it writes none).
    """

    region: str
    status_queue_url: str
    node_queue_prefix: str
    node_dlq_arn: str
    secret_prefix: str
    image: str
    node_queue_sender_arns: tuple[str, ...] = ()
    agent_role_arn: str = ""
    pod_identity: bool = False
    registry_allowlist: tuple[str, ...] = ()
    bottlerocket: bool = False
    ecr_credentials: str = "shared"
    pull_secret_namespaces: tuple[str, ...] = ()
    pull_secret_names: tuple[str, ...] = ()
    credential_namespaces: tuple[str, ...] = ()
    credential_secret: str = ""
    credential_service_accounts: tuple[str, ...] = ()
    # The startup taint nodes join with (Karpenter's startupTaints, a node group's taints), as
    # `key[=value]:Effect`, and how long a node may hold it at most.
    startup_taint: str = "prewarm.dev/warming:NoSchedule"
    max_warm_seconds: int = 900
    # The registered cluster this install is for (`prewarm cluster add`), which its agents name in their
    # queues and hellos; empty for the stack's own cluster, whose install carries no such setting.
    cluster: str = ""

    def problems(self) -> list[str]:
        missing = [name for name in ("region", "status_queue_url", "node_queue_prefix", "node_dlq_arn",
                                     "secret_prefix", "image") if not getattr(self, name)]
        found = [f"{name.replace('_', '-')} is empty" for name in missing]
        if not self.agent_role_arn and not self.pod_identity:
            found.append("no role for the agents: pass --agent-role-arn ARN (IRSA; or deploy the stack with "
                         "AgentRoleArn) or --pod-identity (an EKS Pod Identity association names the service account)")
        if self.agent_role_arn and self.pod_identity:
            found.append("--agent-role-arn and --pod-identity exclude each other")
        if self.agent_role_arn and not self.agent_role_arn.startswith("arn:"):
            found.append(f"agent role {self.agent_role_arn!r} is not an IAM role ARN")
        found += self._startup_taint_problems()
        return found

    @property
    def taint(self) -> StartupTaint:
        """`startup_taint` parsed; `ValueError` naming it when it is not `key[=value]:Effect`."""
        return parse_taint(self.startup_taint)

    def _startup_taint_problems(self) -> list[str]:
        from prewarm.domain.kubernetes import qualified_name_problem

        found = []
        try:
            taint = self.taint
        except ValueError as e:
            found.append(f"--startup-taint: {e}")
        else:
            if problem := qualified_name_problem(taint.key):
                found.append(f"--startup-taint: {problem}")
        if self.max_warm_seconds < 1:
            found.append(f"--max-warm-seconds: {self.max_warm_seconds} must be at least 1")
        return found


@cache
def _base_documents() -> tuple[Obj, ...]:
    docs: list[Obj] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return tuple(docs)


def base_documents() -> list[Obj]:
    """The shipped manifests as they are on disk (a fresh copy)."""
    return copy.deepcopy(list(_base_documents()))


def render(values: InstallValues) -> list[Obj]:
    """The objects to install, in apply order (namespaces and roles before what uses them)."""
    problems = values.problems()
    if problems:
        raise InstallError("; ".join(problems))
    objects: list[Obj] = custom_resource_definitions()
    for doc in base_documents():
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "ServiceAccount" and name == AGENT_NAME:
            _service_account(doc, values)
        elif kind == "ConfigMap" and name == AGENT_NAME:
            _config_map(doc, values)
        elif kind == "DaemonSet" and name == AGENT_NAME:
            _daemon_set(doc, values)
        elif kind == "ValidatingAdmissionPolicy" and name == CRON_ZONE_POLICY:
            # The warning `prewarm apply` prints, word for word.
            doc["spec"]["validations"][0]["message"] = ZONE_NOT_GIVEN
        objects.append(doc)
    objects.extend(_group_binding(PULL_SECRETS_GROUP, values.pull_secret_namespaces))
    if values.pull_secret_names:
        # Without names dispatch_job may read every secret of the bound namespaces (service account
        # tokens, TLS keys): name the pull secrets jobs use and it reads those alone.
        (rule,) = _find(objects, "ClusterRole", PULL_SECRETS_GROUP)["rules"]
        rule["resourceNames"] = list(values.pull_secret_names)
    # sync_resources reads a pullSecretsOnly job's secrets to refuse it when one is missing, where
    # dispatch_job may read them (docs/job-spec.md, "Own pull secrets only").
    objects.extend(_group_binding(RESOURCES_GROUP, values.pull_secret_namespaces, role=PULL_SECRETS_GROUP,
                                  name=f"{RESOURCES_GROUP}-pull-secrets"))
    # run_cron_job applies a cron job resource's runs as the sync applies resources: the same check.
    objects.extend(_group_binding(CRON_RUNS_GROUP, values.pull_secret_namespaces, role=PULL_SECRETS_GROUP,
                                  name=f"{CRON_RUNS_GROUP}-pull-secrets"))
    objects.extend(_group_binding(CREDENTIALS_GROUP, values.credential_namespaces))
    if values.credential_namespaces:
        _credential_rules(_find(objects, "ClusterRole", CREDENTIALS_GROUP), values)
    else:
        unused = (CREDENTIALS_GROUP, f"{CREDENTIALS_GROUP}-namespaces")
        objects = [o for o in objects if o["metadata"]["name"] not in unused]
    for obj in objects:
        obj["metadata"].setdefault("labels", {})[MANAGED_BY[0]] = MANAGED_BY[1]
    order = list(KIND_PLURALS)
    return sorted(objects, key=lambda o: order.index(o["kind"]))


def _find(objects: Sequence[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _service_account(doc: Obj, values: InstallValues) -> None:
    annotations = doc["metadata"].setdefault("annotations", {})
    if values.pod_identity:
        annotations.pop("eks.amazonaws.com/role-arn", None)
        annotations.pop("eks.amazonaws.com/sts-regional-endpoints", None)
    else:
        annotations["eks.amazonaws.com/role-arn"] = values.agent_role_arn
    if not annotations:
        del doc["metadata"]["annotations"]


def _config_map(doc: Obj, values: InstallValues) -> None:
    doc["data"].update({
        "AWS_REGION": values.region,
        "STATUS_QUEUE_URL": values.status_queue_url,
        "NODE_QUEUE_PREFIX": values.node_queue_prefix,
        "SECRET_PREFIX": values.secret_prefix,
        "REGISTRY_ALLOWLIST": ",".join(values.registry_allowlist),
        "ECR_CREDENTIALS": values.ecr_credentials,
        "MAX_WARM_SECONDS": str(values.max_warm_seconds),
    })
    taint = values.taint  # checked by `problems`
    doc["data"].update({"STARTUP_TAINT_KEY": taint.key, "STARTUP_TAINT_EFFECT": taint.effect})


def _daemon_set(doc: Obj, values: InstallValues) -> None:
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = values.image
    if values.cluster:
        container.setdefault("env", []).append({"name": CLUSTER_ENV, "value": values.cluster})
    if values.bottlerocket:
        container["securityContext"]["seLinuxOptions"] = dict(BOTTLEROCKET_SELINUX)


def _group_binding(group: str, namespaces: tuple[str, ...], *, role: str = "", name: str = "") -> list[Obj]:
    """The group bound to its ClusterRole (or `role`): cluster-wide for `ALL_NAMESPACES`, else one
    RoleBinding each; the bindings are named `name`, by default as the group."""
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role or group}
    name = name or group
    if not namespaces:
        return []
    if namespaces == ALL_NAMESPACES:
        return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": name}, "roleRef": role_ref, "subjects": subject}]
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name, "namespace": namespace}, "roleRef": role_ref, "subjects": subject}
            for namespace in namespaces]


def _credential_rules(role: Obj, values: InstallValues) -> None:
    # Kubernetes cannot limit `create` to a name: create is on the namespace's secrets, the rest on
    # the configured secret and service accounts only.
    role["rules"] = [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [values.credential_secret],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"],
         "resourceNames": list(values.credential_service_accounts), "verbs": ["get", "patch"]},
    ]


def credential_targets(config_json: str, source: str) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """(namespaces, secret, service accounts) `refresh_ecr_credentials` writes, from its configuration.

    Namespaces given as plain names get a RoleBinding each; a wildcard or a label selector means
    namespaces that may not exist yet, so the group is bound cluster-wide (`ALL_NAMESPACES`).
    """
    from prewarm.domain.refresh import CredentialsConfig, CredentialsConfigError

    if not config_json.strip():
        return (), "", ()
    try:
        config = CredentialsConfig.parse(config_json, source)
    except CredentialsConfigError as e:
        raise InstallError(str(e)) from None
    targets = config.namespaces
    if targets is None:
        return (), config.secret_name, config.service_accounts
    literal = targets.label_selector is None and not any(set(p) & {"*", "?"} for p in targets.include)
    namespaces = tuple(n for n in targets.include if n not in targets.exclude) if literal else ALL_NAMESPACES
    return namespaces, config.secret_name, config.service_accounts


AGENT_IMAGE_REPOSITORY = "prewarm-agent"


def default_agent_image(env: Mapping[str, str], region: str) -> str:
    """The agent image of this CLI's own version, in the stack account's ECR (`make agent-image` tags it
    `prewarm-agent:<version>`; docs/operations.md pushes it there). Empty when the stack names no account."""
    from importlib.metadata import PackageNotFoundError, version

    account = env.get("NODE_DLQ_ARN", "").split(":")[4:5]
    if not account or not account[0] or not region:
        return ""
    try:
        tag = version("prewarm")
    except PackageNotFoundError:
        return ""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account[0]}.dkr.ecr.{region}.{suffix}/{AGENT_IMAGE_REPOSITORY}:{tag}"


def values_from_stack(
    env: dict[str, str] | Any,
    *,
    region: str,
    image: str,
    credentials_config: str = "",
    agent_role_arn: str = "",
    pod_identity: bool = False,
    registry_allowlist: Sequence[str] = (),
    bottlerocket: bool = False,
    pull_secret_namespaces: Sequence[str] = (),
    pull_secret_names: Sequence[str] = (),
    startup_taint: str = InstallValues.startup_taint,
    max_warm_seconds: int = InstallValues.max_warm_seconds,
    cluster: str = "",
) -> InstallValues:
    """The values of a stack whose settings `env` holds under the functions' variable names
    (`STATUS_QUEUE_URL`, ..., and `AGENT_ROLE_ARN` when the stack was given the agents' role)."""
    namespaces, secret, accounts = credential_targets(credentials_config, "the stack's CredentialsConfig")
    return InstallValues(
        region=region,
        status_queue_url=env.get("STATUS_QUEUE_URL", ""),
        node_queue_prefix=env.get("NODE_QUEUE_PREFIX", ""),
        node_dlq_arn=env.get("NODE_DLQ_ARN", ""),
        secret_prefix=env.get("SECRET_PREFIX", ""),
        node_queue_sender_arns=tuple(a for a in env.get("NODE_QUEUE_SENDER_ARNS", "").split(",") if a),
        image=image,
        agent_role_arn=agent_role_arn or ("" if pod_identity else env.get("AGENT_ROLE_ARN", "")),
        pod_identity=pod_identity,
        registry_allowlist=tuple(registry_allowlist),
        bottlerocket=bottlerocket,
        pull_secret_namespaces=_namespaces(pull_secret_namespaces),
        pull_secret_names=_secret_names(pull_secret_names),
        credential_namespaces=namespaces,
        credential_secret=secret,
        credential_service_accounts=accounts,
        startup_taint=startup_taint,
        max_warm_seconds=max_warm_seconds,
        cluster=cluster,
    )


def _secret_names(values: Sequence[str]) -> tuple[str, ...]:
    from prewarm.domain.kubernetes import dns1123_subdomain_problem

    names = tuple(dict.fromkeys(v.strip() for value in values for v in value.split(",") if v.strip()))
    for name in names:
        if problem := dns1123_subdomain_problem(name):
            raise InstallError(f"--pull-secret-names: {name!r}: {problem}")
    return names


def _namespaces(values: Sequence[str]) -> tuple[str, ...]:
    from prewarm.domain.kubernetes import dns1123_label_problem

    names = tuple(dict.fromkeys(v.strip() for value in values for v in value.split(",") if v.strip()))
    if "*" in names:
        if len(names) > 1:
            raise InstallError("--pull-secret-namespaces: '*' (every namespace) stands alone")
        return ALL_NAMESPACES
    for name in names:
        if problem := dns1123_label_problem(name):
            raise InstallError(f"--pull-secret-namespaces: {name!r}: {problem}")
    return names
