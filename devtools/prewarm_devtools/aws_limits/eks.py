"""EKS in front of moto, for the clusters local mode serves from its embedded Kubernetes API servers.

moto's EKS knows clusters it created itself, with made-up endpoints, and has no access-entry API. The
layer answers for each cluster it serves (`EKSLimits.serve`): `DescribeCluster` gives the embedded API's
endpoint and CA, and `CreateAccessEntry`, `DescribeAccessEntry`, `ListAccessEntries`,
`UpdateAccessEntry` and `DeleteAccessEntry` keep the cluster's access entries, each change handed on to
the embedded API (`add_access_entry`, `remove_access_entry`), which authenticates EKS tokens by them as
EKS does. Errors are EKS's ("Amazon EKS API Reference", each action's Errors): a second entry for a
principal is `ResourceInUseException`, an unknown cluster or entry `ResourceNotFoundException`, a
request EKS refuses `InvalidParameterException`. Clusters the layer does not serve are moto's.

A served cluster is configuration, like the principals: a moto reset leaves it and its entries alone,
since the embedded API that holds them is not reset either.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from prewarm_devtools.account import ACCOUNT, REGION

# The access-entry paths of the EKS API (`requestUri` of each action); moto routes none of them. The
# principal ARN arrives with its `/` decoded.
ROUTES = (
    "{0}/clusters/(?P<name>[^/]+)/access-entries$",
    "{0}/clusters/(?P<name>[^/]+)/access-entries/(?P<principalArn>.+)$",
)
# CreateAccessEntry `type` ("Amazon EKS API Reference", CreateAccessEntry): only STANDARD takes groups.
ENTRY_TYPES = ("STANDARD", "EC2_LINUX", "EC2_WINDOWS", "FARGATE_LINUX", "EC2", "HYBRID_LINUX", "HYPERPOD_LINUX")
# "Create access entries", EKS User Guide: a group name cannot start with `system:` (EKS keeps those to
# itself; cluster-admin access is an access policy, AmazonEKSClusterAdminPolicy, not system:masters).
_RESERVED_GROUP = "system:"
_PRINCIPAL = re.compile(r"^arn:aws[\w-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
MAX_RESULTS = 100


class AccessEntrySink(Protocol):
    """Where a served cluster's entries take effect: the embedded API server (`KubeApiServer`)."""

    def add_access_entry(self, principal_arn: str, entry: Any) -> None: ...

    def remove_access_entry(self, principal_arn: str) -> None: ...


@dataclass
class ServedCluster:
    """A cluster the layer answers for: its name, the embedded API's URL and base64 PEM CA, and its entries."""

    name: str
    endpoint: str
    ca_data: str
    api: AccessEntrySink
    created_at: float = field(default_factory=time.time)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def arn(self) -> str:
        return f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/{self.name}"

    def description(self) -> dict[str, Any]:
        """DescribeCluster's `cluster`: ACTIVE, with the embedded API's endpoint and CA; access entries only
        (the embedded API reads no aws-auth ConfigMap)."""
        return {"name": self.name, "arn": self.arn, "createdAt": self.created_at, "version": "1.33",
                "endpoint": self.endpoint, "certificateAuthority": {"data": self.ca_data}, "status": "ACTIVE",
                "accessConfig": {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True},
                "platformVersion": "eks.1", "tags": {}}


class EKSLimits:
    """The clusters the layer serves, by name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, ServedCluster] = {}

    def serve(self, name: str, endpoint: str, ca_data: str, api: AccessEntrySink) -> ServedCluster:
        """Answers for cluster `name` from now on: its API at `endpoint` with CA `ca_data` (base64 PEM)."""
        cluster = ServedCluster(name, endpoint, ca_data, api)
        with self._lock:
            self._clusters[name] = cluster
        return cluster

    def forget(self, name: str) -> None:
        with self._lock:
            self._clusters.pop(name, None)

    def served(self, name: str) -> ServedCluster | None:
        with self._lock:
            return self._clusters.get(name)

    def reset(self) -> None:
        """Nothing: see the module's docstring."""

    # -- the actions ------------------------------------------------------------------------------

    def _cluster(self, name: str) -> ServedCluster:
        from moto.eks.exceptions import ResourceNotFoundException

        cluster = self.served(name)
        if cluster is None:
            raise ResourceNotFoundException(clusterName=name, nodegroupName=None, fargateProfileName=None,
                                            addonName=None, message=f"No cluster found for name: {name}.")
        return cluster

    def create_access_entry(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        from moto.eks.exceptions import InvalidParameterException, ResourceInUseException

        cluster = self._cluster(name)
        principal = str(body.get("principalArn") or "")
        kind = str(body.get("type") or "STANDARD")
        groups = [str(g) for g in body.get("kubernetesGroups") or []]
        problem = _entry_problem(principal, kind, groups)
        if problem:
            raise InvalidParameterException(clusterName=name, nodegroupName=None, fargateProfileName=None,
                                            addonName=None, message=problem)
        now = time.time()
        entry = {"clusterName": name, "principalArn": principal, "kubernetesGroups": groups,
                 "accessEntryArn": f"arn:aws:eks:{REGION}:{ACCOUNT}:access-entry/{name}/{principal.split(':')[5]}",
                 "createdAt": now, "modifiedAt": now, "tags": dict(body.get("tags") or {}),
                 "username": str(body.get("username") or _default_username(principal)), "type": kind}
        with self._lock:
            if principal in cluster.entries:
                raise ResourceInUseException(
                    clusterName=name, nodegroupName=None, fargateProfileName=None, addonName=None,
                    message="The specified access entry resource is already in use on this cluster.")
            cluster.entries[principal] = entry
        _apply(cluster, entry)
        return {"accessEntry": dict(entry)}

    def describe_access_entry(self, name: str, principal: str) -> dict[str, Any]:
        cluster = self._cluster(name)
        with self._lock:
            entry = cluster.entries.get(principal)
        if entry is None:
            raise _no_entry(name)
        return {"accessEntry": dict(entry)}

    def list_access_entries(self, name: str, max_results: int | None, next_token: str | None) -> dict[str, Any]:
        cluster = self._cluster(name)
        with self._lock:
            arns = sorted(cluster.entries)
        start = int(next_token or 0)
        size = max_results or MAX_RESULTS
        page = arns[start:start + size]
        answer: dict[str, Any] = {"accessEntries": page}
        if start + size < len(arns):
            answer["nextToken"] = str(start + size)
        return answer

    def update_access_entry(self, name: str, principal: str, body: dict[str, Any]) -> dict[str, Any]:
        from moto.eks.exceptions import InvalidParameterException

        cluster = self._cluster(name)
        with self._lock:
            entry = cluster.entries.get(principal)
            if entry is None:
                raise _no_entry(name)
            groups = [str(g) for g in body.get("kubernetesGroups") or entry["kubernetesGroups"]]
            if problem := _entry_problem(principal, entry["type"], groups):
                raise InvalidParameterException(clusterName=name, nodegroupName=None, fargateProfileName=None,
                                                addonName=None, message=problem)
            entry.update(kubernetesGroups=groups, username=str(body.get("username") or entry["username"]),
                         modifiedAt=time.time())
        _apply(cluster, entry)
        return {"accessEntry": dict(entry)}

    def delete_access_entry(self, name: str, principal: str) -> dict[str, Any]:
        cluster = self._cluster(name)
        with self._lock:
            if cluster.entries.pop(principal, None) is None:
                raise _no_entry(name)
        cluster.api.remove_access_entry(principal)
        return {}


def _entry_problem(principal: str, kind: str, groups: list[str]) -> str:
    if not _PRINCIPAL.match(principal):
        return f"The principalArn {principal} is not a valid IAM role or user ARN."
    if kind not in ENTRY_TYPES:
        return f"The type {kind} is invalid; valid types are {', '.join(ENTRY_TYPES)}."
    if groups and kind != "STANDARD":
        return f"Kubernetes groups can only be specified for access entries of type STANDARD, not {kind}."
    for group in groups:
        if group.startswith(_RESERVED_GROUP):
            return f"The kubernetes group name {group} is invalid, it cannot start with {_RESERVED_GROUP}"
    return ""


def _default_username(principal: str) -> str:
    """EKS's username for an entry given none: the user's ARN, or the role's session."""
    partition, account, resource = principal.split(":")[1], principal.split(":")[4], principal.split(":")[5]
    kind, _, name = resource.partition("/")
    if kind == "role":
        return f"arn:{partition}:sts::{account}:assumed-role/{name.rsplit('/', 1)[-1]}/{{{{SessionName}}}}"
    return principal


def _no_entry(name: str) -> Exception:
    from moto.eks.exceptions import ResourceNotFoundException

    return ResourceNotFoundException(
        clusterName=name, nodegroupName=None, fargateProfileName=None, addonName=None,
        message="The specified principalArn could not be found. You can view your available access entries "
                "with 'list-access-entries'.")


def _apply(cluster: ServedCluster, entry: dict[str, Any]) -> None:
    from prewarm_devtools.kubeapi.auth import AccessEntry

    username = "" if entry["username"] == _default_username(entry["principalArn"]) else entry["username"]
    cluster.api.add_access_entry(entry["principalArn"], AccessEntry(username, tuple(entry["kubernetesGroups"])))


# -- moto's side: routes and response methods ----------------------------------------------------


def _layer_eks(current: Callable[[], Any]) -> EKSLimits | None:
    layer = current()
    return None if layer is None else layer.eks


def patches(current: Callable[[], Any]) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for `patches.install`: the access-entry routes on moto's EKS, its
    response methods for them, and DescribeCluster of a served cluster."""
    import moto.eks.urls as eks_urls
    from moto.core.responses import ActionResult
    from moto.eks.responses import EKSResponse

    response = eks_urls.response
    routes = {**eks_urls.url_paths, **{route: response.dispatch for route in ROUTES}}
    original_describe = EKSResponse.__dict__["describe_cluster"]

    def unserved(handler: Any) -> Any:
        from moto.eks.exceptions import ResourceNotFoundException

        name = handler._get_param("name")
        return ResourceNotFoundException(clusterName=name, nodegroupName=None, fargateProfileName=None,
                                         addonName=None, message=f"No cluster found for name: {name}.")

    def action(run: Callable[[EKSLimits, Any], dict[str, Any]]) -> Callable[[Any], Any]:
        def method(handler: Any) -> Any:
            eks = _layer_eks(current)
            if eks is None:
                raise unserved(handler)
            return ActionResult(run(eks, handler))

        return method

    def principal(handler: Any) -> str:
        return unquote(str(handler._get_param("principalArn") or ""))

    def body(handler: Any) -> dict[str, Any]:
        return {key: handler._get_param(key) for key in ("principalArn", "kubernetesGroups", "tags", "username",
                                                          "type")}

    def describe_cluster(handler: Any) -> Any:
        eks = _layer_eks(current)
        served = None if eks is None else eks.served(handler._get_param("name"))
        if served is None:
            return original_describe(handler)
        return ActionResult({"cluster": served.description()})

    methods = {
        "create_access_entry": action(lambda eks, h: eks.create_access_entry(h._get_param("name"), body(h))),
        "describe_access_entry": action(lambda eks, h: eks.describe_access_entry(h._get_param("name"), principal(h))),
        "list_access_entries": action(lambda eks, h: eks.list_access_entries(
            h._get_param("name"), h._get_int_param("maxResults"), h._get_param("nextToken"))),
        "update_access_entry": action(lambda eks, h: eks.update_access_entry(
            h._get_param("name"), principal(h), body(h))),
        "delete_access_entry": action(lambda eks, h: eks.delete_access_entry(h._get_param("name"), principal(h))),
    }
    return [(eks_urls, "url_paths", routes), (EKSResponse, "describe_cluster", describe_cluster),
            *((EKSResponse, name, method) for name, method in methods.items())]
