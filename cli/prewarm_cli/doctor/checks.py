"""The checks of `prewarm doctor`: each takes the clients it reads through (injectable, so tests hand in
moto, the embedded API or fakes) and returns a `CheckResult`: ok, or the problem and its fix.

What each reads:

- stack outputs: the target's settings; `dynamodb:DescribeTable`, `sqs:GetQueueAttributes` (status queue).
- cluster access: `GET /api/v1/namespaces/kube-system` as you; each function role's access entry
  (`eks:DescribeCluster`, `eks:DescribeAccessEntry`, or the `aws-auth` ConfigMap; local: the state file).
- function RBAC: one `SubjectAccessReview` per verb a function needs (`required_access`); the job table
  (`Query` on the kinds index) for the namespaces and pull secrets of jobs; namespaces for the refresher.
- agent DaemonSet: the DaemonSet, the nodes, the DaemonSet's pods.
- node queues: `sqs:ListQueues` under the node queue prefix, `sqs:ListQueueTags` of queues without a node.
- replication events (`replication.py`): `events:ListRules`, `events:ListTargetsByRule`,
  `events:TestEventPattern` in each Region of a registered cluster other than the stack's; `iam:GetRole` and
  `iam:SimulatePrincipalPolicy` of each forwarding target's role.
- dead-letter queues: `sqs:GetQueueAttributes` of each.
- credentials: `secretsmanager:GetSecretValue` of the agents' copies; the refresher's pull secrets.
- registry pulls (`pulls.py`): `iam:SimulatePrincipalPolicy` of each registry token's principal; the job table.
- image credentials: the job table's jobs and rules; each agent node's kubelet configuration through the
  node proxy (`get` on `nodes/proxy`, as you).
- sweep, daily round: their run records in the job table (`BatchGetItem`) and `dynamodb:DescribeTable`
  (its creation time: a stack younger than a period has nothing to show yet).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prewarm.domain.clusters import ClusterSetup, RegisteredCluster
from prewarm.domain.kubernetes import parse_time
from prewarm.domain.nodes import RegisteredNode
from prewarm.domain.placement import AgentPlacement, Placement, evaluate_nodes
from prewarm.domain.refresh import EXPIRES_AT_ANNOTATION, CredentialsConfig, registry_secret_name
from prewarm.domain.schedules import ScheduleRun
from prewarm_cli.doctor.identities import (
    FUNCTIONS,
    Access,
    AccessEntries,
    AccessEntry,
    Subject,
    subject_of,
)
from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE, FUNCTION_GROUPS
from prewarm_cli.kubelets import NODES_PROXY_FIX, NodePolicies, by_description, exposing_nodes
from prewarm_cli.output import human_age, listed

Obj = dict[str, Any]

# Credentials closer to expiry than this are a problem: CredentialExpiryAlarm's threshold. The refresher
# renews at half-life (6 h of ECR's 12), so a healthy stack never comes near it.
EXPIRY_WARNING_SECONDS = 2 * 3600.0
# Settings the doctor can do without: the API endpoint and CA come from eks:DescribeCluster when absent,
# and the agents may get their role from EKS Pod Identity.
OPTIONAL_SETTINGS = frozenset({"KUBE_API_ENDPOINT", "KUBE_CA_DATA", "AGENT_ROLE_ARN"})


@dataclass(frozen=True)
class CheckResult:
    """One line of the doctor's report. `ok` None: not checked, as `detail` says (what it needs failed).
    `warning`: working, but something a multi-tenant cluster should know (`warn`, with its fix; the
    exit code stays 0)."""

    name: str
    ok: bool | None
    detail: str = ""
    fix: str = ""
    warning: bool = False

    @property
    def failed(self) -> bool:
        return self.ok is False

    def line(self) -> str:
        """`ok    name: detail`, `FAIL  name: problem: fix`, `warn  name: what: fix` or `skip  name: why`."""
        warned = bool(self.ok) and self.warning
        mark = "warn" if warned else "ok" if self.ok else "FAIL" if self.ok is False else "skip"
        text = self.name + (f": {self.detail}" if self.detail else "")
        if (self.ok is False or warned) and self.fix:
            text += f": {self.fix}"
        return f"{mark:<6}{text}"


def _ok(name: str, detail: str = "") -> CheckResult:
    return CheckResult(name, True, detail)


def _fail(name: str, detail: str, fix: str = "") -> CheckResult:
    return CheckResult(name, False, detail, fix)


def skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, None, why)


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


class ClusterApi(Protocol):
    """What the checks read of a cluster (`prewarm.adapters.kube.KubeCluster` is one)."""

    host: str

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Obj | None: ...

    def list_objects(self, api_version: str, plural: str, namespace: str | None = None,
                     label_selector: str | None = None) -> list[Obj]: ...

    def create_object(self, api_version: str, plural: str, body: Obj, namespace: str | None = None) -> Obj: ...


# -- stack outputs ----------------------------------------------------------------------------------


def missing_outputs(env: Mapping[str, str], outputs: Mapping[str, str]) -> list[str]:
    """The stack outputs (`outputs`: output name → setting) that `env` lacks, optional ones aside."""
    return [output for output, setting in outputs.items() if setting not in OPTIONAL_SETTINGS and not env.get(setting)]


def check_stack_outputs(env: Mapping[str, str], outputs: Mapping[str, str], *, dynamodb: Any, sqs: Any,
                        local: bool) -> CheckResult:
    name = "stack outputs"
    problems = []
    missing = missing_outputs(env, outputs)
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    try:
        table = dynamodb.describe_table(TableName=env["TABLE_NAME"])["Table"]
        if table.get("TableStatus") != "ACTIVE":
            problems.append(f"table {env['TABLE_NAME']} is {table.get('TableStatus')}")
    except dynamodb.exceptions.ResourceNotFoundException:
        problems.append(f"table {env['TABLE_NAME']} does not exist")
    try:
        sqs.get_queue_attributes(QueueUrl=env["STATUS_QUEUE_URL"], AttributeNames=["QueueArn"])
    except sqs.exceptions.QueueDoesNotExist:
        problems.append(f"status queue {env['STATUS_QUEUE_URL']} does not exist")
    if not problems:
        return _ok(name)
    fix = ("restart the local stack (`prewarm local down`, then `prewarm local up`)" if local else
           "deploy this version of template.yaml to the stack (`sam deploy`): older stacks lack outputs, "
           "and resources deleted outside CloudFormation come back only with it")
    return _fail(name, "; ".join(problems), fix)


# -- cluster access ---------------------------------------------------------------------------------


@dataclass
class ClusterAccess:
    """What the cluster-access check learnt: whether the API answered, and each function's subject."""

    reachable: bool
    subjects: dict[str, Subject] = field(default_factory=dict)


def check_cluster_access(cluster: ClusterApi, entries: AccessEntries | None, env: Mapping[str, str],
                         *, kubeconfig_fix: str) -> tuple[CheckResult, ClusterAccess]:
    """The API answers you, and each function role has the access entry that gives it its groups."""
    from prewarm.services.ports import ClusterError

    name = "cluster access"
    try:
        cluster.get_object("v1", "namespaces", "kube-system")
    except ClusterError as e:
        return _fail(name, f"the Kubernetes API at {cluster.host} did not answer: {e}", kubeconfig_fix), \
            ClusterAccess(False)
    access = ClusterAccess(True)
    problems, fixes = [], []
    for function, setting in FUNCTIONS.items():
        role = env.get(setting, "")
        expected = FUNCTION_GROUPS[setting]
        if not role:
            problems.append(f"{function}: the stack names no role ({setting})")
            continue
        entry: AccessEntry | None = None
        if entries is not None:
            entry = entries.entry(role)
            if entry is None:
                problems.append(f"{function} ({role}) has no access entry")
                fixes.append(entries.fix(role, expected))
            elif lacking := [g for g in expected if g not in entry.groups]:
                problems.append(f"{function}'s access entry lacks group {', '.join(lacking)}")
                fixes.append(entries.fix(role, expected))
        access.subjects[function] = subject_of(role, entry, expected)
    if problems:
        return _fail(name, "; ".join(problems), fixes[0] if fixes else ""), access
    where = f"; {len(access.subjects)} functions have their entries in {entries.where}" if entries is not None else ""
    return _ok(name, f"the API at {cluster.host} answers{where}"), access


# -- function RBAC ----------------------------------------------------------------------------------


def check_function_rbac(cluster: ClusterApi, subjects: Mapping[str, Subject],
                        needs: Mapping[str, Sequence[Access]]) -> CheckResult:
    """Asks the API server (SubjectAccessReview) for every verb each function needs, as its groups."""
    name = "function RBAC"
    denied: dict[str, list[Access]] = {}
    asked = 0
    for function, accesses in needs.items():
        subject = subjects.get(function)
        if subject is None:
            continue
        for access in accesses:
            asked += 1
            review = cluster.create_object("authorization.k8s.io/v1", "subjectaccessreviews", access.review(subject))
            if not (review.get("status") or {}).get("allowed"):
                denied.setdefault(function, []).append(access)
    if not denied:
        return _ok(name, f"{asked} permissions of {len(subjects)} functions allowed")
    detail = "; ".join(f"{function} cannot {', '.join(map(str, accesses))}" for function, accesses in denied.items())
    function, accesses = next(iter(denied.items()))
    first = accesses[0]
    groups = [g for g in subjects[function].groups if g != "system:authenticated"]
    can_i = (f"kubectl auth can-i {first.verb} {first.target}"
             f"{' -n ' + first.namespace if first.namespace else ''} --as prewarm "
             + " ".join(f"--as-group {g}" for g in groups))
    return _fail(name, detail, f"run `prewarm install` (it binds the functions' groups); check with `{can_i}`")


# -- agent DaemonSet --------------------------------------------------------------------------------


def agent_nodes(nodes: Sequence[Mapping[str, Any]], daemon_set: Mapping[str, Any] | None = None) -> list[str]:
    """The nodes a job could select, which need an agent: placement's rules (Ready, not virtual-kubelet,
    not Fargate or Windows, and within `daemon_set`'s node selector, affinity and tolerations, where the
    DaemonSet cannot run and jobs exclude the node)."""
    agents = None if daemon_set is None else AgentPlacement.of_daemon_set(daemon_set)
    return evaluate_nodes(Placement(), nodes, agents=agents).selected


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _why_not_ready(pod: Mapping[str, Any]) -> str:
    """`pod prewarm-agent-x not Ready: terminated (Error, exit 137)`, from its container's state."""
    name = pod["metadata"]["name"]
    container = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
    state = container.get("state") or {}
    kind = next(iter(state), None)
    if kind is None:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        return f"pod {name} not Ready ({phase})"
    info = state[kind] or {}
    parts = [str(info["reason"])] if info.get("reason") else []
    if kind == "terminated" and "exitCode" in info:
        parts.append(f"exit {info['exitCode']}")
    return f"pod {name} not Ready: {kind}" + (f" ({', '.join(parts)})" if parts else "")


@dataclass(frozen=True)
class AgentCoverage:
    """Which nodes need an agent, which have a Ready one, and why the others do not."""

    needed: tuple[str, ...]
    ready: frozenset[str]
    problems: Mapping[str, str]
    pods: Mapping[str, str]  # node → its agent pod's name


def agent_coverage(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                   daemon_set: Mapping[str, Any] | None = None) -> AgentCoverage:
    by_node: dict[str, Mapping[str, Any]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        # A Ready pod wins over a leftover one on the same node (a rolling update's old pod).
        leaving = (pod.get("metadata") or {}).get("deletionTimestamp")
        if node and not leaving and (node not in by_node or _ready(pod)):
            by_node[node] = pod
    needed = agent_nodes(nodes, daemon_set)
    problems = {}
    for node in needed:
        found = by_node.get(node)
        if found is None:
            problems[node] = "no agent pod"
        elif not _ready(found):
            problems[node] = _why_not_ready(found)
    return AgentCoverage(tuple(needed), frozenset(n for n in needed if n not in problems), problems,
                         {n: p["metadata"]["name"] for n, p in by_node.items()})


def check_agent_daemonset(cluster: ClusterApi, nodes: Sequence[Mapping[str, Any]]) -> tuple[CheckResult, AgentCoverage]:
    name = "agent DaemonSet"
    daemon_set = cluster.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    if daemon_set is None:
        return _fail(name, f"{AGENT_NAMESPACE}/{AGENT_NAME} is not installed", "run `prewarm install`"), \
            agent_coverage(nodes, [])
    match = ((daemon_set.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items())) or None
    pods = cluster.list_objects("v1", "pods", AGENT_NAMESPACE, selector)
    coverage = agent_coverage(nodes, pods, daemon_set)
    if not coverage.problems:
        return _ok(name, f"ready on {len(coverage.ready)} of {len(coverage.needed)} nodes"), coverage
    shown = [f"{node} ({why})" for node, why in sorted(coverage.problems.items())]
    first_node = min(coverage.problems)
    pod = coverage.pods.get(first_node)
    look = (f"`kubectl -n {AGENT_NAMESPACE} describe pod {pod}` and its logs" if pod else
            f"`kubectl -n {AGENT_NAMESPACE} describe daemonset {AGENT_NAME}` (taints, resources, node affinity)")
    detail = f"not ready on {len(coverage.problems)} of {len(coverage.needed)} nodes: {listed(shown)}"
    return _fail(name, detail, f"see {look}; until it is ready, jobs fail that node with `no agent on node`"), \
        coverage


def check_agent_versions(nodes: Sequence[RegisteredNode], stack_version: str) -> CheckResult:
    """Every registered agent runs the stack's version: messages between them change between versions
    (docs/operations.md, "Upgrading": the stack first, then the agents)."""
    name = "agent versions"
    if not stack_version:
        return skipped(name, "the stack does not say its version (PrewarmVersion: a stack older than 0.1.0)")
    if not nodes:
        return skipped(name, "no agent has said hello yet")
    other = {n.name: n.agent_version or "unknown" for n in nodes if n.agent_version != stack_version}
    if not other:
        return _ok(name, f"{len(nodes)} agents, all {stack_version}")
    shown = [f"{node} ({version})" for node, version in sorted(other.items())]
    return _fail(name, f"{len(other)} of {len(nodes)} agents are not {stack_version}: {listed(shown)}",
                 f"roll the DaemonSet to the stack's version: `prewarm install` (its default image is "
                 f"prewarm-agent:{stack_version})")


# -- node queues ------------------------------------------------------------------------------------


class NodeQueueApi(Protocol):
    """What the node-queue check reads (`prewarm.adapters.sqs.NodeQueues` is one)."""

    prefix: str

    def list_node_queues(self) -> dict[str, str]: ...
    def owns_queue(self, url: str) -> bool: ...


def queue_mismatch(prefix: str, queues: Collection[str], nodes: Collection[str],
                   agents: Collection[str]) -> tuple[list[str], list[str]]:
    """(queues no node of the cluster has, nodes with a Ready agent but no queue), each sorted."""
    from prewarm.domain.messages import node_queue_name

    wanted = {node_queue_name(prefix, n): n for n in nodes}
    stray = sorted(q for q in queues if q not in wanted)
    missing = sorted(n for n in agents if node_queue_name(prefix, n) not in queues)
    return stray, missing


def check_node_queues(queues: NodeQueueApi, nodes: Collection[str], agents: Collection[str],
                      *, run_sweep: str) -> CheckResult:
    name = "node queues"
    listed_queues = queues.list_node_queues()
    candidates, missing = queue_mismatch(queues.prefix, listed_queues, nodes, agents)
    # Another stack's queues may share the prefix: only this stack's (by their tags) are strays.
    stray = [q for q in candidates if queues.owns_queue(listed_queues[q])]
    problems, fixes = [], []
    if stray:
        problems.append(f"{len(stray)} queue{'s' if len(stray) > 1 else ''} of departed nodes ({listed(stray)})")
        fixes.append(f"run the sweep ({run_sweep}), which deletes them, or delete them "
                     f"(`aws sqs delete-queue --queue-url {listed_queues[stray[0]]}`)")
    if missing:
        problems.append(f"no queue for {listed(missing)}, whose agent is ready")
        fixes.append(f"restart that agent (`kubectl -n {AGENT_NAMESPACE} delete pod ...`): its hello at start "
                     "has record_status make its queue")
    if problems:
        return _fail(name, "; ".join(problems), "; ".join(fixes))
    return _ok(name, f"{len(listed_queues)} queues, one per node with an agent")


# -- dead-letter queues -----------------------------------------------------------------------------


def check_dead_letter_queues(sqs: Any, urls: Sequence[str]) -> CheckResult:
    name = "dead-letter queues"
    held = {}
    for url in urls:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        count = sum(int(v) for v in attributes.values())
        if count:
            held[url] = count
    if not held:
        return _ok(name, f"{len(urls)} empty")
    detail = ", ".join(f"{url.rsplit('/', 1)[-1]} holds {n} message{'s' if n > 1 else ''}" for url, n in held.items())
    first = next(iter(held))
    return _fail(name, detail, f"read them (`aws sqs receive-message --queue-url {first}`), fix the cause, then "
                               "redrive or purge (docs/operations.md, Dead-letter queues)")


# -- credentials ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Credential:
    expires_at: float
    what: str


def earliest_expiring(credentials: Sequence[Credential], now: float) -> tuple[Credential | None, list[Credential]]:
    """The earliest to expire, and those within `EXPIRY_WARNING_SECONDS` (soonest first)."""
    ordered = sorted(credentials)
    return (ordered[0] if ordered else None), [c for c in ordered if c.expires_at - now < EXPIRY_WARNING_SECONDS]


def _in(seconds: float) -> str:
    return f"in {human_age(seconds)}" if seconds >= 0 else f"{human_age(-seconds)} ago"


def check_credentials(config: CredentialsConfig | None, *, secret_prefix: str, secretsmanager: Any,
                      pull_secrets: Callable[[], Sequence[Mapping[str, Any]]] | None, now: float,
                      refresh_fix: str) -> CheckResult:
    """The registry credentials `refresh_ecr_credentials` writes: the agents' copies in Secrets Manager
    and, given `pull_secrets` (the refresher's secrets in the target namespaces), the pull secrets."""
    import json

    name = "credentials"
    if config is None:
        return _ok(name, "none configured (the stack has no CredentialsConfig)")
    found: list[Credential] = []
    problems = []
    for registry in config.registries:
        for host in registry.hosts:
            secret_id = registry_secret_name(secret_prefix, host)
            try:
                value = secretsmanager.get_secret_value(SecretId=secret_id)["SecretString"]
            except secretsmanager.exceptions.ResourceNotFoundException:
                problems.append(f"no agents' copy for {host} ({secret_id})")
                continue
            expires = parse_time(json.loads(value).get("expiresAt"))
            if expires is None:
                problems.append(f"the agents' copy for {host} has no expiresAt")
            else:
                found.append(Credential(expires, f"the agents' copy for {host}"))
    for secret in (pull_secrets() if pull_secrets is not None else ()):
        meta = secret.get("metadata") or {}
        expires = parse_time((meta.get("annotations") or {}).get(EXPIRES_AT_ANNOTATION))
        where = f"the pull secret {meta.get('namespace')}/{meta.get('name')}"
        if expires is None:
            problems.append(f"{where} has no {EXPIRES_AT_ANNOTATION}")
        else:
            found.append(Credential(expires, where))
    earliest, expiring = earliest_expiring(found, now)
    problems += [f"{c.what} expires {_in(c.expires_at - now)}" for c in expiring]
    if problems:
        return _fail(name, listed(problems), refresh_fix)
    if earliest is None:
        return _ok(name, "nothing to refresh")
    return _ok(name, f"earliest expiry {_in(earliest.expires_at - now)} ({earliest.what})")


# -- image credentials (KEP-2535) -------------------------------------------------------------------


def check_image_credentials(warmers: Sequence[str], images: Sequence[str | None], found: NodePolicies,
                            ) -> CheckResult:
    """Whether images warmed with shared credentials (`warmers` name the jobs and rules, `images` their
    images, None for a rule's) are usable by any pod of the nodes `found` read, and which nodes could not
    be read. A warning, not a failure: a single-tenant cluster may want it so."""
    name = "image credentials"
    if not warmers:
        return _ok(name, "no job or rule warms a private ECR image with shared credentials")
    exposed = exposing_nodes(found.policies, images)
    problems, fixes = [], []
    what = f"{listed(list(warmers))} warm{'s' if len(warmers) == 1 else ''} private ECR images with shared credentials"
    if exposed:
        nodes = "; ".join(f"{policy} on {listed(group)}" for policy, group in by_description(exposed).items())
        problems.append(f"{what}: any pod of {len(exposed)} of {len(found.policies) + len(found.unreadable)} "
                        f"nodes may use them without credentials of its own ({nodes})")
        fixes.append("set the kubelets' imagePullCredentialsVerificationPolicy to AlwaysVerify (warm layers stay "
                     "useful), or give these jobs spec.pullSecretsOnly with their own pull secrets "
                     "(docs/credentials.md)")
    if found.unreadable:
        reasons = "; ".join(f"{listed(group)}: {why}" for why, group in by_description(found.unreadable).items())
        problems.append(f"the kubelet policy of {len(found.unreadable)} nodes is unknown ({reasons})")
        fixes.append(NODES_PROXY_FIX if found.forbidden else "check that the API server reaches those kubelets")
    pools = ""
    if found.sampled:  # read from one node per pool
        pools = f"; read from {sum(n is not None for n in found.sampled.values())} node(s), one per pool of " \
                f"{len(found.sampled)}"
    if not problems:
        policies = ", ".join(f"{p} on {len(g)}" for p, g in by_description(
            {n: p.describe() for n, p in found.policies.items()}).items())
        return _ok(name, f"{what}, and every node's kubelet verifies them ({policies or 'no nodes'}{pools})")
    return CheckResult(name, True, "; ".join(problems) + pools, "; ".join(fixes), warning=True)


# -- the schedules ----------------------------------------------------------------------------------


def schedule_problem(run: ScheduleRun | None, *, period: float, since: float, now: float) -> str | None:
    """Why `run` (the last completed one) says the schedule is not running, or None.

    A run may take a while and be late by a little: overdue is a period and a grace (two minutes, or an
    eighth of the period) after the last completion, or after `since` (the stack's creation) for none.
    """
    grace = max(120.0, period / 8)
    if run is None:
        if now - since > period + grace:
            return f"never ran, and the stack is {human_age(now - since)} old"
        return None
    if now - run.finished_at > period + grace:
        return f"last ran {human_age(now - run.finished_at)} ago"
    return None


def check_schedule(name: str, run: ScheduleRun | None, *, period: float, since: float, now: float,
                   fix: str) -> CheckResult:
    every = f"runs every {human_age(period)}"
    problem = schedule_problem(run, period=period, since=since, now=now)
    if problem is not None:
        return _fail(name, f"{problem}; it {every}", fix)
    if run is None:
        return _ok(name, f"not due yet (the stack is {human_age(now - since)} old; it {every})")
    return _ok(name, f"last ran {human_age(now - run.finished_at)} ago")


# -- registered clusters ----------------------------------------------------------------------------

# The sweep reaches every registered cluster each minute (and the resource sync too): a check older than
# this means the schedules have not reached it lately.
CLUSTER_CHECK_STALE_SECONDS = 300.0


def check_registered_clusters(clusters: Sequence[RegisteredCluster], *, now: float) -> CheckResult:
    """How the stack's functions last reached each registered cluster (the sweep and the resource sync
    record it): a cluster whose API failed or denied them, that they have not reached lately, or whose
    `cluster add` failed or did not finish, fails."""
    name = "registered clusters"
    if not clusters:
        return _ok(name, "none: the stack serves its own cluster only")
    problems, fine = [], []
    for cluster in clusters:
        if cluster.setup is not ClusterSetup.INSTALLED:
            problems.append(f"{cluster.name}: cluster add {str(cluster.setup).lower()}"
                            + (f": {cluster.setup_message}" if cluster.setup_message else " (or was interrupted)"))
        elif cluster.checked_at is None:
            problems.append(f"{cluster.name}: not reached by the sweep yet")
        elif cluster.reachable is False:
            problems.append(f"{cluster.name}: unreachable {human_age(now - cluster.checked_at)} ago: {cluster.reason}")
        elif now - cluster.checked_at > CLUSTER_CHECK_STALE_SECONDS:
            problems.append(f"{cluster.name}: last reached {human_age(now - cluster.checked_at)} ago")
        else:
            agents = "" if cluster.agents is None else f", {cluster.agents} agents"
            fine.append(f"{cluster.name} (reached {human_age(now - cluster.checked_at)} ago{agents})")
    if problems:
        return _fail(name, "; ".join(problems),
                     "check the cluster's endpoint and the access entries of the stack's function roles "
                     "(`prewarm cluster add NAME` again sets both); `prewarm cluster list` shows each cluster")
    return _ok(name, ", ".join(fine))
