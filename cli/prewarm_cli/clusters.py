"""Registering an EKS cluster with a stack (`prewarm cluster add|remove`), and how each cluster answers
(`prewarm cluster list`).

Adding a cluster does, in order, what an operator would otherwise do by hand (docs/operations.md,
"Kubernetes access for the functions"): read its API endpoint and CA (`eks:DescribeCluster`), give each
of the stack's function roles an access entry with the Kubernetes groups the shipped RBAC binds
(`eks:CreateAccessEntry`, type `STANDARD`, no access policy), record the cluster in the table as
`Installing` (the functions serve it from then on: its agents' first hellos are not dropped), check that the
stack's own network reaches its API and that it runs Kubernetes 1.30 or later (a one-off invocation of the
resource sync function, `lambda:InvokeFunction`, which GETs its `/version`), install what `prewarm install`
installs (its agents told their cluster), and record it `Installed`. A refusal or a failed install leaves it
`Failed` with why; adding it again finishes the job. Every step is idempotent; removing undoes them in
reverse, after marking the cluster's jobs for deletion. What a cluster is (its name, its labels, its setup)
is the domain's (`prewarm.domain.clusters`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prewarm.domain.clusters import DEFAULT_CLUSTER, ClusterReach, ClusterSetup, RegisteredCluster
from prewarm_cli.errors import CommandError
from prewarm_cli.install.render import FUNCTION_GROUPS

# "Create access entries", EKS User Guide: a role that calls the API with Kubernetes groups (and no
# access policy) has a STANDARD entry.
ENTRY_TYPE = "STANDARD"

Report = Callable[[str], None]
# After creating access entries, a check the cluster answers 401 is made again after these waits (about
# 30 s in all): an access entry can take a few seconds to apply.
ENTRY_WAITS = (2.0, 4.0, 8.0, 16.0)


class RegistrationError(CommandError):
    """A cluster could not be registered or removed; the message says what to fix (one line, exit 1)."""


class ClusterStore(Protocol):
    """What registration needs of the stack's table (`DynamoJobStore` is one)."""

    def put_cluster(self, cluster: RegisteredCluster) -> None: ...

    def get_cluster(self, name: str) -> RegisteredCluster | None: ...

    def list_clusters(self) -> list[RegisteredCluster]: ...

    def delete_cluster(self, name: str) -> bool: ...

    def list_jobs(self) -> list[Any]: ...

    def list_nodes(self, cluster: str = DEFAULT_CLUSTER) -> list[Any]: ...

    def delete_node(self, name: str, cluster: str = DEFAULT_CLUSTER) -> None: ...


def function_roles(env: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each function role the stack's outputs name → the Kubernetes groups its access entry carries
    (the same as template.yaml's `AWS::EKS::AccessEntry` resources give them)."""
    roles: dict[str, tuple[str, ...]] = {}
    for setting, groups in FUNCTION_GROUPS.items():
        if arn := env.get(setting):
            roles[arn] = tuple(dict.fromkeys((*roles.get(arn, ()), *groups)))
    if not roles:
        raise RegistrationError(
            "the stack names no function roles (outputs DispatchJobRoleArn, SweepRoleArn, ...): "
            "redeploy it with this version's template.yaml")
    return roles


def describe_cluster(eks: Any, name: str) -> tuple[str, str]:
    """The API endpoint and base64 PEM CA of EKS cluster `name`."""
    try:
        cluster = eks.describe_cluster(name=name)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        raise RegistrationError(f"EKS cluster {name!r} not found in {eks.meta.region_name}: check the name and "
                                "--region") from None
    endpoint = cluster.get("endpoint") or ""
    ca_data = (cluster.get("certificateAuthority") or {}).get("data") or ""
    if not endpoint or not ca_data:
        raise RegistrationError(f"EKS cluster {name!r} is {cluster.get('status', 'not ready')} and has no API "
                                "endpoint or CA yet: add it again once it is ACTIVE")
    mode = (cluster.get("accessConfig") or {}).get("authenticationMode") or "CONFIG_MAP"
    if mode == "CONFIG_MAP":
        raise RegistrationError(
            f"EKS cluster {name!r} authenticates through the aws-auth ConfigMap only, which has no access "
            f"entries: `aws eks update-cluster-config --name {name} --access-config "
            "authenticationMode=API_AND_CONFIG_MAP`, then add it again")
    return endpoint, ca_data


def grant_access(eks: Any, cluster: str, roles: Mapping[str, Sequence[str]], report: Report) -> bool:
    """An access entry for each role with (at least) its groups: created, kept, or given the groups it lacks.
    Whether any was created."""
    created = False
    for arn, groups in roles.items():
        try:
            eks.create_access_entry(clusterName=cluster, principalArn=arn, kubernetesGroups=list(groups),
                                    type=ENTRY_TYPE)
            report(f"access entry {arn} created (groups {', '.join(groups)})")
            created = True
            continue
        except eks.exceptions.ResourceInUseException:
            pass
        entry = eks.describe_access_entry(clusterName=cluster, principalArn=arn)["accessEntry"]
        have = list(entry.get("kubernetesGroups") or [])
        missing = [g for g in groups if g not in have]
        if missing:
            eks.update_access_entry(clusterName=cluster, principalArn=arn, kubernetesGroups=have + missing)
            report(f"access entry {arn} configured (added groups {', '.join(missing)})")
        else:
            report(f"access entry {arn} unchanged")
    return created


def register_cluster(target: Any, store: ClusterStore, name: str, labels: Mapping[str, str],
                     objects: Sequence[dict[str, Any]], report: Report,
                     open_api: Callable[[RegisteredCluster], Any],
                     reach: Callable[[str], ClusterReach], *,
                     sleep: Callable[[float], None] = time.sleep, region: str = "") -> RegisteredCluster:
    """`prewarm cluster add` for a cluster other than the stack's own (the module says in which order):
    `reach(name)` is how the stack's functions reach its API, `objects` are installed through
    `open_api(cluster)` (its API as the operator). `target` is the stack's (`prewarm_cli.targets.Target`);
    `region` the cluster's AWS Region when not the stack's (EKS is asked there; recorded, its nodes pull
    their Region's ECR replica).
    `RegistrationError` once the cluster is recorded `Failed` with why."""
    from prewarm.domain.messages import node_queue_name
    from prewarm.services.ports import ClusterError
    from prewarm_cli.install.apply import install

    prefix = target.env.get("NODE_QUEUE_PREFIX", "")
    try:  # an EKS node name (dots: its queue name is cut and hashed) in the longest form a registered one takes
        node_queue_name(prefix, "ip-10-0-1-5.us-west-2.compute.internal", name)
    except ValueError:
        raise RegistrationError(
            f"the stack's node queue prefix {prefix!r} ({len(prefix)} characters) leaves no room for a registered "
            "cluster's queue names (SQS allows 80 characters; a registered cluster's names take 13 more than the "
            "stack's own cluster's): deploy the stack with a shorter NodeQueuePrefix") from None
    before = store.get_cluster(name)
    added_at = before.added_at if before is not None and before.added_at else time.time()
    roles = function_roles(target.env)
    region = "" if region == target.region else region
    eks = target.client("eks", region or None)
    endpoint, ca_data = describe_cluster(eks, name)
    created = grant_access(eks, name, roles, report)
    recorded = RegisteredCluster(name, endpoint, ca_data, labels=dict(labels), added_at=added_at,
                                 setup=ClusterSetup.INSTALLING, region=region)
    # Recorded before anything is installed: an agent that starts at once finds its cluster served.
    store.put_cluster(recorded)
    report(f"cluster/{name} recorded ({recorded.setup}): the stack serves it, its agents' hellos are accepted")
    try:
        found = reach(name)
        for wait in ENTRY_WAITS if created else ():
            if not found.unauthorized:
                break
            report(f"cluster {name} did not accept the function's token yet (new access entries take a few "
                   f"seconds to apply): checking again in {wait:g} s")
            sleep(wait)
            found = reach(name)
        if problem := found.problem():
            raise RegistrationError(problem)
        report(f"cluster {name} reached from the stack's network: Kubernetes {found.version}")
        with open_api(recorded) as api:
            install(api, objects, report=lambda change: report(str(change)))
    except (RegistrationError, ClusterError) as e:
        why = " ".join(str(e.message if isinstance(e, RegistrationError) else e).split())
        store.put_cluster(replace(recorded, setup=ClusterSetup.FAILED, setup_message=why))
        raise RegistrationError(f"{why} (cluster {name} is recorded {ClusterSetup.FAILED}: fix that, then "
                                f"`prewarm cluster add {name}` again, or `prewarm cluster remove {name}`)") from e
    installed = replace(recorded, setup=ClusterSetup.INSTALLED)
    store.put_cluster(installed)
    return installed


def reach_from_stack(target: Any) -> Callable[[str], ClusterReach]:
    """How the stack's own network reaches a cluster: one invocation of its resource sync function (the
    stack's `SyncResourcesFunctionName` output; `lambda:InvokeFunction` with your credentials), which GETs
    the cluster's `/version` as the functions call clusters."""
    from botocore.exceptions import BotoCoreError, ClientError

    function = target.env.get("SYNC_RESOURCES_FUNCTION_NAME", "")
    if not function:
        raise RegistrationError("the stack names no resource sync function (output SyncResourcesFunctionName) to "
                                "check the cluster from: redeploy it with this version's template.yaml")

    def reach(name: str) -> ClusterReach:
        try:
            answer = target.client("lambda").invoke(FunctionName=function,
                                                    Payload=json.dumps({"reach_cluster": name}).encode())
            payload = json.loads(answer["Payload"].read() or b"null")
        except ClientError as e:
            error = e.response.get("Error", {})
            denied = error.get("Code") == "AccessDeniedException"
            hint = ": your credentials need lambda:InvokeFunction on it" if denied else ""
            raise RegistrationError(f"cannot invoke {function} to check cluster {name}: "
                                    f"{error.get('Code', '')}: {error.get('Message', e)}{hint}") from None
        except (BotoCoreError, ValueError) as e:
            raise RegistrationError(f"cannot invoke {function} to check cluster {name}: {e}") from None
        if answer.get("FunctionError"):
            message = payload.get("errorMessage") if isinstance(payload, dict) else payload
            raise RegistrationError(f"{function} failed checking cluster {name}: {message}")
        try:
            return ClusterReach.from_json(payload)
        except ValueError as e:
            raise RegistrationError(f"{function} gave no answer about cluster {name} (is the stack this version's?): "
                                    f"{e}") from None

    return reach


def revoke_access(eks: Any, cluster: str, roles: Mapping[str, Sequence[str]], report: Report) -> None:
    for arn in roles:
        try:
            eks.delete_access_entry(clusterName=cluster, principalArn=arn)
            report(f"access entry {arn} deleted")
        except eks.exceptions.ResourceNotFoundException:
            report(f"access entry {arn} not found")


def mark_jobs_for_deletion(store: Any, cluster: str, *, now: float) -> list[str]:
    """Every job of `cluster` marked for deletion (the control plane cancels their pulls); their keys."""
    from prewarm.domain.sources import Source
    from prewarm.services.jobs import JobNotFoundError, request_deletion

    marked = []
    for record in store.list_jobs():
        if record.cluster != cluster or record.owner:
            continue  # a list job's children go with it
        try:
            # By the resource's side too: the cluster a resource lives in is going.
            request_deletion(store, record.namespace, record.name, now=now, by=Source.RESOURCE, cluster=cluster)
        except JobNotFoundError:
            continue  # deleted meanwhile
        marked.append(record.key)
    return marked


def forget_nodes(store: ClusterStore, queues: Any, cluster: str) -> int:
    """The cluster's node registrations and node queues, deleted (its agents are gone)."""
    for url in queues.list_node_queues(cluster).values():
        queues.delete_queue(url)
    nodes = store.list_nodes(cluster)
    for node in nodes:
        store.delete_node(node.name, cluster)
    return len(nodes)


@dataclass
class Health:
    """How a cluster answers, for `cluster list`: recorded by the schedules, or checked now (`live`)."""

    name: str
    own: bool
    labels: dict[str, str]
    endpoint: str
    reachable: bool | None
    reason: str
    checked_at: float | None
    last_sync: float | None
    agents: int
    live: bool = False
    agent_pods: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # How far `cluster add` got (a registered cluster's; "" for the stack's own, which `prewarm install` sets up).
    setup: str = ""
    setup_message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "own": self.own, "labels": self.labels, "endpoint": self.endpoint,
                "reachable": self.reachable, "reason": self.reason, "checkedAt": self.checked_at,
                "lastSync": self.last_sync, "agents": self.agents, "live": self.live,
                **({"setup": self.setup, "setupMessage": self.setup_message} if self.setup else {}),
                **({"agentPods": self.agent_pods} if self.live else {})}

    @property
    def failed(self) -> bool:
        """Unreachable, or its `cluster add` failed (`cluster list` exits 1)."""
        return self.reachable is False or self.setup == ClusterSetup.FAILED


def recorded_health(store: ClusterStore, own_name: str) -> list[Health]:
    """Each cluster as the schedules last found it, the stack's own first. `agents`: the nodes whose agent
    is registered in the table."""
    stored = {c.name: c for c in store.list_clusters()}
    own = stored.pop(own_name, None)
    # The stack's own cluster: its labels if registered with some, its health once a schedule reached it.
    found = [Health(own_name, True, dict(own.labels) if own else {}, "", own.reachable if own else None,
                    own.reason if own else "", own.checked_at if own else None, own.last_sync if own else None,
                    len(store.list_nodes(DEFAULT_CLUSTER)))]
    for name, c in sorted(stored.items()):
        found.append(Health(name, False, dict(c.labels), c.endpoint, c.reachable, c.reason, c.checked_at,
                            c.last_sync, len(store.list_nodes(name)), setup=str(c.setup),
                            setup_message=c.setup_message))
    return found


def check_now(health: Health, open_cluster: Callable[[], Any], *, now: float) -> None:
    """Reaches the cluster's API now: reachable or why not, and the agent DaemonSet's ready pods."""
    from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE
    from prewarm.services.ports import ClusterError

    health.live, health.checked_at = True, now
    try:
        with open_cluster() as api:
            daemon_set = api.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    except ClusterError as e:
        health.reachable, health.reason, health.agent_pods = False, str(e), "-"
        return
    health.reachable, health.reason = True, ""
    if daemon_set is None:
        health.agent_pods = "not installed"
    else:
        status = daemon_set.get("status") or {}
        health.agent_pods = f"{status.get('numberReady', 0)}/{status.get('desiredNumberScheduled', 0)}"

