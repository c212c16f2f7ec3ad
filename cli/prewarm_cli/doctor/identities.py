"""Who each function is in the cluster, and what it must be allowed there.

An IAM role reaches the Kubernetes API as the user and groups its access entry gives it: an EKS access
entry (`eks:DescribeAccessEntry`), or in a cluster whose authentication mode is `CONFIG_MAP`, its
`mapRoles` entry in the `aws-auth` ConfigMap of `kube-system`; in local mode, the embedded API's entries
as the state file lists them (`LOCAL_ACCESS_ENTRIES`). The groups the template gives each role
(`FUNCTION_GROUPS`) are bound by `prewarm install`; `required_access` lists the verbs each function
needs (docs/operations.md, "Kubernetes access for the functions").
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE, FUNCTION_GROUPS

#: Every authenticated request also carries this group; RBAC may bind it, so reviews include it.
AUTHENTICATED = "system:authenticated"
LOCAL_ACCESS_ENTRIES = "LOCAL_ACCESS_ENTRIES"
# Lambda names a function's role session after the function; any session name does for RBAC, which
# binds the groups.
SESSION_NAME = "prewarm-doctor"

_ROLE_ARN = re.compile(r"^arn:(aws[\w-]*):iam::(\d{12}):role/(?:.*/)?([^/]+)$")


def function_of(setting: str) -> str:
    """`SWEEP_ROLE_ARN` → `sweep`: the function a role setting belongs to."""
    return setting.removesuffix("_ROLE_ARN").lower()


@dataclass(frozen=True)
class AccessEntry:
    """A principal's Kubernetes identity: `username` may hold `{{SessionName}}` (empty: EKS's default)."""

    username: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Subject:
    """The user and groups a function's requests carry, as a SubjectAccessReview names them."""

    user: str
    groups: tuple[str, ...]


def subject_of(role_arn: str, entry: AccessEntry | None, expected_groups: tuple[str, ...]) -> Subject:
    """The function's subject; without an entry, the groups the template would give it (RBAC is then
    checked for the groups alone, whatever becomes of the entry)."""
    role = _ROLE_ARN.match(role_arn)
    default = f"arn:{role.group(1)}:sts::{role.group(2)}:assumed-role/{role.group(3)}/{{{{SessionName}}}}" \
        if role else role_arn
    template = (entry.username if entry is not None else "") or default
    user = template.replace("{{SessionName}}", SESSION_NAME).replace(
        "{{AccountID}}", role.group(2) if role else "")
    groups = entry.groups if entry is not None else expected_groups
    return Subject(user, tuple(dict.fromkeys((*groups, AUTHENTICATED))))


def without_path(role_arn: str) -> str:
    """`mapRoles` matches a role by its ARN without the path: `arn:aws:iam::1:role/a/b/r` → `...:role/r`."""
    role = _ROLE_ARN.match(role_arn)
    return f"arn:{role.group(1)}:iam::{role.group(2)}:role/{role.group(3)}" if role else role_arn


def map_roles(config_map: Mapping[str, Any] | None) -> dict[str, AccessEntry]:
    """The `aws-auth` ConfigMap's `mapRoles`, by role ARN without its path (a broken document maps nothing)."""
    text = ((config_map or {}).get("data") or {}).get("mapRoles") or ""
    try:
        entries = yaml.safe_load(text) or []
    except yaml.YAMLError:
        return {}
    found: dict[str, AccessEntry] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("rolearn"), str):
            found[without_path(entry["rolearn"])] = AccessEntry(
                str(entry.get("username") or ""), tuple(str(g) for g in entry.get("groups") or ()))
    return found


class AccessEntries(Protocol):
    """Where a cluster keeps its principals' identities."""

    @property
    def where(self) -> str:
        """For messages: "the access entries of EKS cluster prod", "the aws-auth ConfigMap ..."."""
        ...

    def entry(self, principal_arn: str) -> AccessEntry | None: ...

    def fix(self, principal_arn: str, groups: Collection[str]) -> str: ...


class LocalAccessEntries:
    """Local mode's: the embedded API's access entries, as the state file lists them (ARN → groups)."""

    where = "local mode's access entries"

    def __init__(self, env: Mapping[str, str]) -> None:
        raw = json.loads(env.get(LOCAL_ACCESS_ENTRIES) or "{}")
        self._entries = {arn: AccessEntry("", tuple(groups)) for arn, groups in raw.items()}

    def entry(self, principal_arn: str) -> AccessEntry | None:
        return self._entries.get(principal_arn)

    def fix(self, principal_arn: str, groups: Collection[str]) -> str:
        return "restart the local stack (`prewarm local down`, then `prewarm local up`): it creates the entries"


class EksAccessEntries:
    """An EKS cluster's: access entries (authentication mode `API`), `aws-auth` (`CONFIG_MAP`), or an
    access entry first and `aws-auth` after it (`API_AND_CONFIG_MAP`), as EKS authenticates.

    `eks` is a boto3 EKS client; `config_maps(namespace, name)` reads a ConfigMap from the cluster.
    """

    def __init__(self, eks: Any, cluster_name: str, read_config_map: Any) -> None:
        self.eks = eks
        self.cluster_name = cluster_name
        self._read_config_map = read_config_map
        self._mode: str | None = None
        self._map_roles: dict[str, AccessEntry] | None = None

    @property
    def mode(self) -> str:
        if self._mode is None:
            cluster = self.eks.describe_cluster(name=self.cluster_name)["cluster"]
            self._mode = str((cluster.get("accessConfig") or {}).get("authenticationMode") or "CONFIG_MAP")
        return self._mode

    @property
    def where(self) -> str:
        if self.mode == "CONFIG_MAP":
            return f"the aws-auth ConfigMap of cluster {self.cluster_name}"
        return f"the access entries of EKS cluster {self.cluster_name}"

    def entry(self, principal_arn: str) -> AccessEntry | None:
        if self.mode != "CONFIG_MAP":
            try:
                found = self.eks.describe_access_entry(clusterName=self.cluster_name, principalArn=principal_arn)
            except self.eks.exceptions.ResourceNotFoundException:
                found = None
            if found is not None:
                entry = found["accessEntry"]
                return AccessEntry(str(entry.get("username") or ""), tuple(entry.get("kubernetesGroups") or ()))
            if self.mode == "API":
                return None
        if self._map_roles is None:
            self._map_roles = map_roles(self._read_config_map("kube-system", "aws-auth"))
        return self._map_roles.get(without_path(principal_arn))

    def fix(self, principal_arn: str, groups: Collection[str]) -> str:
        if self.mode == "CONFIG_MAP":
            return (f"map the role in aws-auth with groups {', '.join(groups)} (docs/operations.md, "
                    "Clusters in CONFIG_MAP mode)")
        return (f"`aws eks create-access-entry --cluster-name {self.cluster_name} --principal-arn {principal_arn} "
                f"--kubernetes-groups {' '.join(groups)}`, or deploy with ClusterAccess=access-entries")


# -- what each function must be allowed -------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Access:
    """One verb on one resource of an API group (`group` empty: the core group), cluster-wide (`namespace`
    empty) or in a namespace, on any object or one."""

    verb: str
    resource: str
    namespace: str = ""
    name: str = ""
    group: str = ""
    subresource: str = ""  # `status`: the object's status subresource

    @property
    def target(self) -> str:
        """`daemonsets.apps/prewarm-agent`, `nodes`, `nodes/status`: the resource as kubectl names it, and the
        object."""
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        resource += f"/{self.subresource}" if self.subresource else ""
        return f"{resource}/{self.name}" if self.name else resource

    def __str__(self) -> str:
        return f"{self.verb} {self.target}" + (f" in {self.namespace}" if self.namespace else "")

    def review(self, subject: Subject) -> dict[str, Any]:
        """The SubjectAccessReview that asks whether `subject` may do this."""
        attributes = {"verb": self.verb, "resource": self.resource, "group": self.group, "version": "v1"}
        if self.namespace:
            attributes["namespace"] = self.namespace
        if self.name:
            attributes["name"] = self.name
        if self.subresource:
            attributes["subresource"] = self.subresource
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": subject.user, "groups": list(subject.groups), "resourceAttributes": attributes}}


@dataclass(frozen=True)
class CredentialTargets:
    """What `refresh_ecr_credentials` writes: its secret and service accounts in these namespaces."""

    namespaces: tuple[str, ...]
    secret: str
    service_accounts: tuple[str, ...]


def required_access(job_namespaces: Iterable[str], pull_secrets: Iterable[tuple[str, str]],
                    credentials: CredentialTargets | None,
                    checked_secrets: Iterable[tuple[str, str]] = ()) -> dict[str, list[Access]]:
    """Each function's verbs: nodes cluster-wide; pods in every namespace jobs live in (`default` when
    there are none yet); the pull secrets jobs name; the agent DaemonSet (where agents run, for dispatch);
    the refresher's writes in its target namespaces; the secrets the resource sync checks
    (`checked_secrets`: those of pullSecretsOnly resources)."""
    namespaces = sorted({*job_namespaces, "default"})
    pods = [Access("list", "pods", ns) for ns in namespaces]
    needs = {
        "dispatch_job": [Access("get", "nodes"), Access("list", "nodes"), *pods,
                         *(Access("get", "secrets", ns, name) for ns, name in sorted(set(pull_secrets))),
                         Access("get", "daemonsets", AGENT_NAMESPACE, AGENT_NAME, "apps")],
        # A first hello: its node's startup taint when warm at boot, its PrewarmWarm condition.
        "record_status": [Access("get", "nodes"), Access("patch", "nodes"),
                          Access("patch", "nodes", subresource="status"),
                          Access("get", "configmaps", AGENT_NAMESPACE, AGENT_NAME), *pods],
        "sweep": [Access("get", "nodes"), Access("list", "nodes"), Access("patch", "nodes"),
                  Access("get", "configmaps", AGENT_NAMESPACE, AGENT_NAME), Access("create", "events", "default")],
        "refresh_ecr_credentials": [],
        "sync_resources": [Access("get", "secrets", ns, name) for ns, name in sorted(set(checked_secrets))],
        # A cron job resource's runs, as Kruise's controller makes them (docs/job-spec.md, AdvancedCronJob).
        "run_cron_job": [Access("get", "advancedcronjobs", group="prewarm.dev"),
                         *(Access(verb, "imagelistpulljobs", group="prewarm.dev") for verb in ("create", "get",
                                                                                             "delete"))],
    }
    if credentials is not None:
        needs["refresh_ecr_credentials"] = [Access("list", "namespaces")] + [
            access
            for ns in credentials.namespaces
            for access in (
                Access("create", "secrets", ns),
                Access("get", "secrets", ns, credentials.secret),
                Access("update", "secrets", ns, credentials.secret),
                *(Access(verb, "serviceaccounts", ns, account)
                  for account in credentials.service_accounts for verb in ("get", "patch")),
            )
        ]
    return needs


FUNCTIONS = {function_of(setting): setting for setting in FUNCTION_GROUPS}
