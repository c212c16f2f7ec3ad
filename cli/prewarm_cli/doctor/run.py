"""Runs the checks in order, each given what the earlier ones learnt: a check whose input failed (the
API did not answer, the stack names no dead-letter queues) is reported as skipped, not as a second
failure of the same cause. An AWS or Kubernetes error inside a check fails that check alone."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from prewarm_cli.doctor.checks import (
    AgentCoverage,
    CheckResult,
    ClusterAccess,
    ClusterApi,
    check_agent_daemonset,
    check_agent_versions,
    check_cluster_access,
    check_credentials,
    check_dead_letter_queues,
    check_function_rbac,
    check_image_credentials,
    check_node_queues,
    check_registered_clusters,
    check_schedule,
    check_stack_outputs,
    skipped,
)
from prewarm_cli.doctor.identities import (
    LOCAL_ACCESS_ENTRIES,
    AccessEntries,
    CredentialTargets,
    EksAccessEntries,
    LocalAccessEntries,
    required_access,
)
from prewarm_cli.kubelets import NodePolicies

CHECKS = ("stack outputs", "cluster access", "function RBAC", "agent DaemonSet", "container runtimes",
          "registry mirrors", "agent versions", "node queues", "node queue policies", "registered clusters",
          "replication events", "dead-letter queues", "credentials", "registry pulls", "image credentials",
          "warm snapshots", "sweep", "daily round")


@dataclass
class Doctor:
    """What the checks read through. `client(service[, region])` builds a boto3 client (in the stack's
    Region unless another is named); `cluster()` opens the
    cluster as you (raising `ClusterError` when it cannot); `store` and `queues` are the stack's job
    store and node queues (`DynamoJobStore`, `NodeQueues`)."""

    env: Mapping[str, str]
    local: bool
    client: Callable[..., Any]
    cluster: Callable[[], ClusterApi]
    store: Any
    queues: Any
    outputs: Mapping[str, str]
    clock: Callable[[], float] = time.time
    # What the checks learn for those after them.
    _access: ClusterAccess = field(default_factory=lambda: ClusterAccess(False), init=False)
    _agents: AgentCoverage | None = field(default=None, init=False)
    _nodes: list[dict[str, Any]] | None = field(default=None, init=False)
    _config: tuple[Any] | None = field(default=None, init=False)
    _jobs: list[Any] | None = field(default=None, init=False)
    _runs: tuple[float, dict[str, Any]] | None = field(default=None, init=False)

    def run(self) -> Iterator[CheckResult]:
        """Each check's result as soon as it is known."""
        with ExitStack() as stack:
            api, why = self._open_cluster(stack)
            yield self._guarded("stack outputs", lambda: check_stack_outputs(
                self.env, self.outputs, dynamodb=self.client("dynamodb"), sqs=self.client("sqs"), local=self.local))
            yield self._cluster_access(api, why)
            unreachable = why or "the Kubernetes API did not answer (cluster access)"
            reachable = api is not None and self._access.reachable
            yield self._guarded("function RBAC", lambda: self._rbac(api)) if reachable \
                else skipped("function RBAC", unreachable)
            yield self._guarded("agent DaemonSet", lambda: self._daemon_set(api)) if reachable \
                else skipped("agent DaemonSet", unreachable)
            yield self._guarded("container runtimes", self._runtimes) if self._agents is not None \
                else skipped("container runtimes", "the cluster's nodes are unknown (agent DaemonSet)")
            yield self._guarded("registry mirrors", self._mirrors)
            yield self._guarded("agent versions", lambda: check_agent_versions(
                self.store.list_nodes(), self.env.get("PREWARM_VERSION", "")))
            yield self._guarded("node queues", self._node_queues) if self._agents is not None \
                else skipped("node queues", "the cluster's nodes are unknown (cluster access)")
            yield self._guarded("node queue policies", self._queue_policies)
            yield self._guarded("registered clusters", lambda: check_registered_clusters(
                [c for c in self.store.list_clusters() if c.name != self.env.get("CLUSTER_NAME", "")],
                now=self.clock()))
            yield self._guarded("replication events", self._replication_events)
            yield self._guarded("dead-letter queues", self._dead_letter_queues)
            yield self._guarded("credentials", lambda: self._credentials(api if reachable else None))
            yield self._guarded("registry pulls", self._registry_pulls)
            yield self._guarded("image credentials", lambda: self._image_credentials(api)) if reachable \
                else skipped("image credentials", unreachable)
            yield self._guarded("warm snapshots", lambda: self._warm_snapshots(api))
            yield from self._schedules()

    def _warm_snapshots(self, api: ClusterApi | None) -> CheckResult:
        from prewarm.adapters.ec2 import NodeClassObjects
        from prewarm_cli.doctor.snapshots import check_warm_snapshots

        def cluster() -> Any:
            if api is None:
                from prewarm.services.snapshot_ports import BakeError

                raise BakeError("the cluster cannot be reached (cluster access)")
            return api

        return check_warm_snapshots(self.store.list_warm_snapshots(),
                                    NodeClassObjects(cluster, lambda: self.client("ec2")))

    def _replication_events(self) -> CheckResult:
        from prewarm_cli.doctor.replication import check_replication_events

        stack_region = self.client("events").meta.region_name
        return check_replication_events(self.store.list_clusters(), stack_region=stack_region,
                                        events=lambda region: self.client("events", region), iam=self.client("iam"))

    # -- cluster ------------------------------------------------------------------------------------

    def _open_cluster(self, stack: ExitStack) -> tuple[ClusterApi | None, str]:
        from prewarm.services.ports import ClusterError

        try:
            api = self.cluster()
        except ClusterError as e:
            return None, f"no cluster to reach: {e}"
        close = getattr(api, "close", None)
        if close is not None:
            stack.callback(close)
        return api, ""

    def _entries(self, api: ClusterApi) -> AccessEntries | None:
        if LOCAL_ACCESS_ENTRIES in self.env:
            return LocalAccessEntries(self.env)
        if self.local:
            return None  # local mode on a real cluster: its access is the kubeconfig's, not entries
        return EksAccessEntries(self.client("eks"), self.env.get("CLUSTER_NAME", ""),
                                lambda namespace, name: api.get_object("v1", "configmaps", name, namespace))

    def _cluster_access(self, api: ClusterApi | None, why: str) -> CheckResult:
        if api is None:
            return CheckResult("cluster access", False, why, "pass --kubeconfig, or deploy the stack with ClusterName")
        fix = ("is the local stack running? (`prewarm local status`)" if self.local else
               "check that this machine reaches the cluster endpoint and that your AWS credentials have an access "
               "entry (or pass --kubeconfig)")

        def check() -> CheckResult:
            result, self._access = check_cluster_access(api, self._entries(api), self.env, kubeconfig_fix=fix)
            return result

        return self._guarded("cluster access", check)

    def _rbac(self, api: Any) -> CheckResult:
        from prewarm.domain.refresh import select_namespaces
        from prewarm.services.schedules import referenced_pull_secrets

        jobs = self._list_jobs()
        config = self._credentials_config()
        targets = None
        if config is not None and config.namespaces is not None:
            query = config.namespaces.label_selector.to_query() if config.namespaces.label_selector else None
            namespaces = select_namespaces(api.list_objects("v1", "namespaces", None, query or None), config.namespaces)
            targets = CredentialTargets(tuple(namespaces), config.secret_name, config.service_accounts)
        from prewarm.domain.sources import Source

        checked = referenced_pull_secrets(j for j in jobs if j.pull_secrets_only
                                          and j.source is Source.RESOURCE)
        needs = required_access({j.namespace for j in jobs}, referenced_pull_secrets(jobs), targets, checked)
        return check_function_rbac(api, self._access.subjects, needs)

    def _list_jobs(self) -> list[Any]:
        """The job table's jobs, scanned once for the checks that read them (RBAC, registry pulls, image
        credentials)."""
        if self._jobs is None:
            self._jobs = self.store.list_jobs()
        return self._jobs

    def _daemon_set(self, api: Any) -> CheckResult:
        self._nodes = api.list_objects("v1", "nodes")
        result, self._agents = check_agent_daemonset(api, self._nodes)
        return result

    def _runtimes(self) -> CheckResult:
        from prewarm_cli.doctor.runtimes import check_container_runtimes

        assert self._agents is not None and self._nodes is not None
        needed = set(self._agents.needed)
        return check_container_runtimes([n for n in self._nodes if n["metadata"]["name"] in needed])

    def _mirrors(self) -> CheckResult:
        from prewarm_cli.doctor.runtimes import check_registry_mirrors

        return check_registry_mirrors(self.store.list_nodes(), self._nodes)

    def _image_credentials(self, api: Any) -> CheckResult:
        from prewarm.domain.verification import pulls_with_shared_credentials
        from prewarm_cli.kubelets import read_pool_policies

        warmers, images = [], []
        for job in self._list_jobs():
            if job.is_pull_job and pulls_with_shared_credentials(job.pull_job.spec.image, job.pull_secrets_only):
                warmers.append(f"job {job.key}")
                images.append(job.pull_job.spec.image)
        for rule in self.store.list_rules():
            template = ((rule.get("spec") or {}).get("template") or {}).get("spec") or {}
            if not template.get("pullSecretsOnly"):  # a rule's jobs pull pushed private ECR images
                warmers.append(f"rule {rule['metadata']['name']}")
                images.append(None)
        if not warmers:
            return check_image_credentials([], [], NodePolicies())
        if self._nodes is None:
            self._nodes = api.list_objects("v1", "nodes")
        names = set(self._agents.needed if self._agents is not None else [n["metadata"]["name"] for n in self._nodes])
        nodes = [n for n in self._nodes if n["metadata"]["name"] in names]
        return check_image_credentials(warmers, images, read_pool_policies(api, nodes))

    # -- AWS ----------------------------------------------------------------------------------------

    def _node_queues(self) -> CheckResult:
        assert self._agents is not None and self._nodes is not None
        names = [n["metadata"]["name"] for n in self._nodes]
        return check_node_queues(self.queues, names, self._agents.ready, run_sweep=self._command("sweep"))

    def _queue_policies(self) -> CheckResult:
        from prewarm_cli.doctor.queue_policies import check_queue_policies, role_exists

        queues = dict(self.queues.list_node_queues())
        for cluster in self.store.list_clusters():
            if cluster.name != self.env.get("CLUSTER_NAME", ""):
                queues.update(self.queues.list_node_queues(cluster.name))
        senders = [a for a in self.env.get("NODE_QUEUE_SENDER_ARNS", "").split(",") if a]
        return check_queue_policies(self.client("sqs"), queues, senders, exists=role_exists(self.client("iam")),
                                    run_sweep=self._command("sweep"))

    def _dead_letter_queues(self) -> CheckResult:
        urls = [u for u in self.env.get("DEAD_LETTER_QUEUE_URLS", "").split(",") if u]
        if not urls:
            return skipped("dead-letter queues", "the stack names none (DeadLetterQueueUrls)")
        return check_dead_letter_queues(self.client("sqs"), urls)

    def _credentials_config(self) -> Any:
        """The refresher's configuration, read once: the SSM parameter wins over the inline JSON, as for
        the function itself."""
        if self._config is None:
            self._config = (self._read_credentials_config(),)
        return self._config[0]

    def _read_credentials_config(self) -> Any:
        from prewarm.domain.refresh import CredentialsConfig

        if parameter := self.env.get("CREDENTIALS_CONFIG_PARAMETER", "").strip():
            text = self.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
            return CredentialsConfig.parse(text, f"SSM parameter {parameter}")
        if text := self.env.get("CREDENTIALS_CONFIG", "").strip():
            return CredentialsConfig.parse(text, "the stack's CredentialsConfig")
        return None

    def _credentials(self, api: Any) -> CheckResult:
        from prewarm.domain.refresh import MANAGED_BY, MANAGED_BY_LABEL

        config = self._credentials_config()
        pull_secrets = None
        if api is not None and config is not None and config.namespaces is not None:
            def pull_secrets() -> list[dict[str, Any]]:
                found = api.list_objects("v1", "secrets", None, f"{MANAGED_BY_LABEL}={MANAGED_BY}")
                return [s for s in found if s["metadata"]["name"] == config.secret_name]

        return check_credentials(config, secret_prefix=self.env.get("SECRET_PREFIX", ""),
                                 secretsmanager=self.client("secretsmanager"), pull_secrets=pull_secrets,
                                 now=self.clock(), refresh_fix=self._refresh_fix())

    def _registry_pulls(self) -> CheckResult:
        from prewarm_cli.doctor.pulls import check_registry_pulls

        config = self._credentials_config()
        if config is None:
            return check_registry_pulls(None, iam=None, refresher_role_arn="", images=[])
        images = [job.pull_job.spec.image for job in self._list_jobs() if job.is_pull_job]
        return check_registry_pulls(config, iam=self.client("iam"), images=images,
                                    refresher_role_arn=self.env.get("REFRESH_ECR_CREDENTIALS_ROLE_ARN", ""),
                                    secret_name=config.secret_name if config.namespaces is not None else None)

    def _refresh_fix(self) -> str:
        return ("refresh_ecr_credentials is not renewing them (it does at half their life): see its logs and "
                f"the ScheduleDLQ, then run it ({self._command('refresh')})")

    def _command(self, schedule: str) -> str:
        """How to run a scheduled function now."""
        if self.local:
            return f"`prewarm local fire {schedule}`"
        output = {"sweep": "SweepFunctionName", "repull": "RepullDailyFunctionName",
                  "refresh": "RefreshEcrCredentialsFunctionName"}[schedule]
        return f"`aws lambda invoke --function-name <the stack's {output}> out.json`"

    def _schedules(self) -> Iterator[CheckResult]:
        from prewarm.domain.schedules import DAILY_ROUND, SWEEP

        for schedule, name, setting, command in ((SWEEP, "sweep", "SWEEP_SCHEDULE", "sweep"),
                                                 (DAILY_ROUND, "daily round", "REPULL_SCHEDULE", "repull")):
            yield self._guarded(name, functools.partial(self._schedule, schedule, name, setting, command))

    def _schedule(self, schedule: str, name: str, setting: str, command: str) -> CheckResult:
        from prewarm.domain.schedules import DEFAULT_EXPRESSIONS, RECORDED_SCHEDULES, schedule_period

        if self._runs is None:
            table = self.client("dynamodb").describe_table(TableName=self.env["TABLE_NAME"])["Table"]
            self._runs = (table["CreationDateTime"].timestamp(), self.store.last_runs(RECORDED_SCHEDULES))
        created, runs = self._runs
        period = schedule_period(self.env.get(setting) or DEFAULT_EXPRESSIONS[schedule])
        fix = (f"check its logs and the ScheduleDLQ, and that its schedule is enabled; "
               f"then run it ({self._command(command)})")
        return check_schedule(name, runs.get(schedule), period=period, since=created, now=self.clock(), fix=fix)

    # -- errors -------------------------------------------------------------------------------------

    def _guarded(self, name: str, check: Callable[[], CheckResult]) -> CheckResult:
        try:
            return check()
        except Exception as e:
            failure = _known_failure(e)
            if failure is None:
                raise
            return CheckResult(name, False, f"cannot check: {failure}")


def _known_failure(error: Exception) -> str | None:
    """The message of an error a call to AWS or the cluster can end in; None for anything else (a bug)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from prewarm.adapters.sqs import QueueError
    from prewarm.domain.refresh import CredentialsConfigError
    from prewarm.domain.schedules import ScheduleExpressionError
    from prewarm.services.ports import ClusterError, StoreError

    known = (ClientError, BotoCoreError, ClusterError, StoreError, QueueError, CredentialsConfigError,
             ScheduleExpressionError)
    if isinstance(error, known):
        return str(error)
    if isinstance(error, json.JSONDecodeError):
        return f"not JSON: {error}"
    return None
