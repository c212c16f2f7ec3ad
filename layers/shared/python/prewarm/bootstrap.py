"""The composition root: builds each adapter once per process from the settings, on first use, and
hands handlers ready-to-call use cases bound to them.

A handler parses its event, calls one use case below and returns; it never builds an adapter. Nothing
is built at import time, so a function pays only for the clients it uses (the Kubernetes client alone
costs ~120 ms of imports). `reset()` forgets them all, for tests that change the environment.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from prewarm.settings import settings

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.ecr import EcrImages
    from prewarm.adapters.ecr_auth import EcrTokenSource
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.secrets import SecretsManagerCredentialStore, SecretsManagerMirror
    from prewarm.adapters.sqs import NodeQueues, StatusQueue
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm.domain.job import StoredJob
    from prewarm.domain.messages import FromAgent, Hello, StatusReport
    from prewarm.domain.refresh import CredentialsConfig
    from prewarm.domain.retry import Delivery
    from prewarm.services.credentials import RefreshReport
    from prewarm.services.dispatch import PlanResult
    from prewarm.services.jobs import Applied
    from prewarm.services.push import ImagePush
    from prewarm.services.reports import HelloOutcome, ReportOutcome, StatusBatchOutcome
    from prewarm.services.resources import SyncReport
    from prewarm.services.schedules import SweepResult


@lru_cache(maxsize=1)
def store() -> DynamoJobStore:
    from prewarm.adapters.dynamodb import DynamoJobStore

    return DynamoJobStore(settings().table_name)


@lru_cache(maxsize=1)
def queues() -> NodeQueues:
    from prewarm.adapters.sqs import NodeQueues

    s = settings()
    return NodeQueues(
        s.node_queue_prefix, s.status_queue_url, dlq_arn=s.node_dlq_arn,
        visibility_seconds=s.node_queue_visibility_seconds, sender_arns=s.node_queue_sender_arns,
    )


def cluster(name: str = "") -> KubeCluster:
    """The API of cluster `name`: the stack's own (`""`, from its settings) or a registered one (its
    endpoint and CA read from the table on each call, so a cluster added again is reached at its new
    endpoint; the client for an endpoint is kept for the process)."""
    from prewarm.services.ports import ClusterConfigError

    if not name:
        return _own_cluster()
    registered = store().get_cluster(name)
    if registered is None:
        raise ClusterConfigError(f"cluster {name!r} is not registered with this stack: `prewarm cluster add {name}`")
    return _registered_cluster(registered.name, registered.endpoint, registered.ca_data)


@lru_cache(maxsize=1)
def _own_cluster() -> KubeCluster:
    from prewarm.adapters.kube import KubeCluster

    return KubeCluster.from_settings(settings())


@lru_cache(maxsize=64)
def _registered_cluster(name: str, endpoint: str, ca_data: str) -> KubeCluster:
    from prewarm.adapters.kube import KubeCluster
    from prewarm.domain.clusters import RegisteredCluster

    return KubeCluster.for_registered(RegisteredCluster(name, endpoint, ca_data))


def cluster_or_none(name: str = "") -> KubeCluster | None:
    """The cluster, or None when no Kubernetes access is configured (a hello then speaks for its node)."""
    from prewarm.services.ports import ClusterConfigError

    try:
        return cluster(name)
    except ClusterConfigError:
        return None


def served_clusters() -> list[RegisteredCluster]:
    """Every cluster the stack serves: its own first (with the labels it was registered with, if it was),
    then the registered ones."""
    from prewarm.domain.clusters import DEFAULT_CLUSTER, RegisteredCluster

    own_name = settings().cluster_name
    stored = {c.name: c for c in store().list_clusters()}
    own = stored.get(own_name)
    return [RegisteredCluster(DEFAULT_CLUSTER, labels=own.labels if own else {}),
            *(c for name, c in stored.items() if name != own_name)]


def registered_clusters() -> list[RegisteredCluster]:
    """The clusters registered besides the stack's own, read afresh (a cluster added a minute ago counts)."""
    return [c for c in store().list_clusters() if c.name != settings().cluster_name]


class _LazySecretMirror:
    """Builds the Secrets Manager mirror on the first job that names pullSecrets, not before.

    A `PullSecretMirror` for planning and a `PullSecretCleanup` for the sweep.
    """

    def mirror(self, namespace: str, names: list[str], cluster: str = "") -> list[str]:
        return _secret_mirror().mirror(namespace, names, cluster)

    def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]:
        return _secret_mirror().cleanup(referenced)


def secret_mirror() -> _LazySecretMirror:
    """Where jobs' pullSecrets are mirrored for the agents (Secrets Manager under the stack prefix)."""
    return _LazySecretMirror()


@lru_cache(maxsize=1)
def _secret_mirror() -> SecretsManagerMirror:
    from prewarm.adapters.secrets import SecretsManagerMirror

    # Cleanup needs no cluster; mirroring reads secrets through it and says so when it is missing.
    return SecretsManagerMirror(settings().secret_prefix, cluster_or_none(), registered=cluster_or_none)


@lru_cache(maxsize=1)
def registry_tokens() -> EcrTokenSource:
    """ECR and ECR Public tokens; kept for the process so assumed-role sessions are reused."""
    from prewarm.adapters.ecr_auth import EcrTokenSource

    return EcrTokenSource(identify_caller=True)


@lru_cache(maxsize=1)
def credential_store() -> SecretsManagerCredentialStore:
    """The agents' registry credentials in Secrets Manager, under the stack's secret prefix."""
    from prewarm.adapters.secrets import SecretsManagerCredentialStore

    return SecretsManagerCredentialStore(settings().secret_prefix)


def credentials_config(env: Mapping[str, str] = os.environ) -> CredentialsConfig | None:
    """The refresher's configuration, read on every call so a changed parameter applies at once.

    `CREDENTIALS_CONFIG_PARAMETER` (an SSM parameter) wins over `CREDENTIALS_CONFIG` (JSON); None when
    both are empty: there is nothing to refresh.
    """
    from prewarm.domain.refresh import CredentialsConfig

    if parameter := env.get("CREDENTIALS_CONFIG_PARAMETER", "").strip():
        from prewarm.adapters.secrets import read_config_parameter

        return CredentialsConfig.parse(read_config_parameter(parameter), f"CREDENTIALS_CONFIG_PARAMETER {parameter}")
    if text := env.get("CREDENTIALS_CONFIG", "").strip():
        return CredentialsConfig.parse(text, "CREDENTIALS_CONFIG")
    return None


@lru_cache(maxsize=1)
def images() -> EcrImages:
    from prewarm.adapters.ecr import EcrImages

    return EcrImages()


# --- Use cases, bound to the adapters above -------------------------------------------------------


def stored_job(image: Mapping[str, Any] | None) -> StoredJob | None:
    """The job a table stream image holds (None: the image is of another item, or absent)."""
    from prewarm.adapters.dynamodb import job_of_item

    return job_of_item(image)


def plan_job(key: str) -> PlanResult:
    """Select the nodes of job `key` and send the first tasks, and after a `Never` job's plan send
    warming nodes their lists again; `TaskSendError` when a send failed."""
    from prewarm.domain.clusters import cluster_of
    from prewarm.services.dispatch import PlanResult, plan_job
    from prewarm.services.ports import ClusterConfigError, ClusterError, StoreError
    from prewarm.services.warming import send_required_images

    name = cluster_of(key)
    try:
        result = plan_job(store(), cluster(name), queues(), key, now=time.time(), secrets=secret_mirror())
    except ClusterError as e:
        if not name:
            raise  # the stack's own cluster: the stream retries the record
        # A registered cluster: the job says why it waits (plan_job says so when the cluster did not
        # answer; here too when it could not be reached at all), and the sweep asks for its plan again once
        # the cluster answers. A retry here would hold up every later record of the stream's shard.
        if isinstance(e, ClusterConfigError):
            with contextlib.suppress(StoreError):
                store().set_job_fields(key, {"placement_note": f"cluster {name} cannot be reached: {e}"})
        return PlanResult(key, f"waiting for cluster {name}: {e}")
    if result.changes_warming:
        result.send_failures += send_required_images(store(), queues(), cluster(name), now=time.time(),
                                                     cluster_name=name)
    result.raise_for_send_failures()
    return result


def record_report(report: StatusReport) -> ReportOutcome:
    """Apply an agent's status report to its job."""
    from prewarm.services.reports import record_report

    return record_report(store(), queues(), report, now=time.time())


def complete_deletion(key: str) -> int:
    """Cancel a deleted job's in-flight pulls (as this stack's role) and remove its items."""
    from prewarm.services.jobs import complete_deletion

    return complete_deletion(store(), queues(), key)


def tell_warming_nodes(name: str = "") -> None:
    """Send every warming node of cluster `name` its required images again (one of its `Never` jobs went);
    `TaskSendError` when a send failed."""
    from prewarm.services.ports import TaskSendError
    from prewarm.services.warming import send_required_images

    failures = send_required_images(store(), queues(), cluster_or_none(name), now=time.time(), cluster_name=name)
    if failures:
        raise TaskSendError(failures)


def record_status(messages: Sequence[tuple[str, FromAgent]], deliveries: Sequence[Delivery] = (),
                  poison_ids: Sequence[str] = ()) -> StatusBatchOutcome:
    """Apply a batch of the status queue (message id, parsed message): hellos and warm-ups, then reports;
    then say when the messages handed back (those to retry, the `poison_ids` that did not parse) come again."""
    from prewarm.services.reports import deliver_again, record_status

    outcome = record_status(store(), queues(), cluster_or_none(), messages, now=time.time(), clusters=cluster_or_none)
    if outcome.retry_ids or poison_ids:
        deliver_again(status_queue(), deliveries, retry_ids=outcome.retry_ids, poison_ids=poison_ids)
    return outcome


@lru_cache(maxsize=1)
def status_queue() -> StatusQueue:
    """The status queue, on the task queues' SQS client: one client per process, not two."""
    from prewarm.adapters.sqs import StatusQueue

    return StatusQueue(settings().status_queue_url, client=queues().client)


def register_node(hello: Hello) -> HelloOutcome:
    """Register a node from its hello and add it to the jobs that select it."""
    from prewarm.services.reports import register_node

    return register_node(store(), queues(), cluster_or_none(hello.cluster), hello, now=time.time())


def handle_push(push: ImagePush) -> list[Applied]:
    """Apply one job per prewarm rule matching a pushed image."""
    from prewarm.services.push import handle_push

    return handle_push(store(), images(), push, now=time.time(), clusters=served_clusters(),
                       own_cluster_name=settings().cluster_name)


def refresh_credentials() -> RefreshReport | None:
    """Refresh registry credentials as configured; None when nothing is configured."""
    from prewarm.services.credentials import refresh_credentials

    config = credentials_config()
    if config is None:
        return None
    from prewarm.services.ports import ClusterError

    kube = cluster() if config.namespaces is not None else None
    registered, unbuilt = [], []
    for other in registered_clusters() if config.namespaces is not None else []:
        try:
            registered.append((other.name, cluster(other.name)))
        except ClusterError as e:
            unbuilt.append(f"cluster {other.name}: {e}")
    report = refresh_credentials(config, kube, registry_tokens(), credential_store(), clock=time.time,
                                 registered=registered)
    report.errors += unbuilt
    return report


def repull_daily(scheduled_time: float | None) -> list[str]:
    """Start a new round of every active `Never` job (once per scheduled time), and record the run."""
    from prewarm.domain.schedules import DAILY_ROUND
    from prewarm.services.schedules import record_run, repull_daily

    started = time.time()
    jobs = repull_daily(store(), scheduled_time=scheduled_time)
    record_run(store(), DAILY_ROUND, started_at=started, finished_at=time.time())
    return jobs


@lru_cache(maxsize=1)
def _settled_nodes() -> dict[str, set[str]]:
    """Per cluster, the nodes the sweeps of this process found past their deadline without the startup
    taint (a cluster's sweep keeps only its own nodes in its set)."""
    return {}


def sweep(time_left: Callable[[], float] | None = None) -> SweepResult:
    """Deadlines, silent nodes, lost sends, expired jobs and departed nodes' queues; and record the run.

    `time_left()`: the seconds the invocation has left; work the next run can do stops when it runs low."""
    from prewarm.domain.clusters import DEFAULT_CLUSTER
    from prewarm.domain.schedules import SWEEP
    from prewarm.services.budget import TimeBudget
    from prewarm.services.ports import ClusterError, ClusterUnavailableError
    from prewarm.services.schedules import ClusterAccess, record_run, sweep

    s = settings()
    started = time.time()
    accesses, unbuilt = [], {}
    for registered in registered_clusters():
        try:
            kube = cluster(registered.name)
            accesses.append(ClusterAccess(registered.name, kube, kube))
        except ClusterError as e:
            unbuilt[registered.name] = str(e)
    result = sweep(
        store(), queues(), cluster_or_none(), now=started, prefix=s.node_queue_prefix,
        silence_grace_seconds=s.node_silence_grace_seconds, resend_after_seconds=s.task_resend_seconds,
        agent_silence_seconds=s.agent_silence_seconds, no_agent_grace_seconds=s.no_agent_grace_seconds,
        secrets=secret_mirror(), taints=cluster_or_none(), taint_grace_seconds=s.startup_taint_grace_seconds,
        budget=TimeBudget(time_left), settled=_settled_nodes(), registered=accesses,
    )
    result.unreachable.update(unbuilt)
    for access in accesses:
        store().record_cluster_check(access.name, reachable=access.name not in result.unreachable,
                                     reason=result.unreachable.get(access.name, ""), checked_at=started,
                                     agents=result.agents.get(access.name))
    for name, reason in unbuilt.items():
        store().record_cluster_check(name, reachable=False, reason=reason, checked_at=started)
    own = result.unreachable.get(DEFAULT_CLUSTER)
    if s.cluster_name and (own is not None or DEFAULT_CLUSTER in result.agents):
        store().record_cluster_check(s.cluster_name, reachable=own is None, reason=own or "", checked_at=started,
                                     agents=result.agents.get(DEFAULT_CLUSTER), own=True)
    if own is not None:
        # The run failed: the schedule's retry and `prewarm doctor` see it (the other clusters were swept).
        raise ClusterUnavailableError(f"the stack's own cluster {s.cluster_name!r} was not swept: {own}")
    record_run(store(), SWEEP, started_at=started, finished_at=time.time())
    return result


def sync_resources() -> SyncReport:
    """ImagePullJob, ImageListPullJob and PrewarmRule resources into the table, status back to them: the
    stack's own cluster's and each registered cluster's, side by side (one that fails is recorded as
    unreachable and does not keep the others from their sync). The run fails when the own cluster did."""
    from functools import partial

    from prewarm.services.ports import ClusterUnavailableError
    from prewarm.services.resources import ResourceApi, sync_clusters

    own_name = settings().cluster_name
    apis: list[tuple[str, Callable[[], ResourceApi]]] = [
        ("", cluster), *((c.name, partial(cluster, c.name)) for c in registered_clusters())]
    report = sync_clusters(store(), apis, clock=time.time, own_name=own_name)
    if (own := report.unreachable.get("")) is not None:
        raise ClusterUnavailableError(f"the stack's own cluster {own_name!r} was not synced: {own}")
    return report


def reset() -> None:
    for built in (store, queues, status_queue, _own_cluster, _registered_cluster, images, _secret_mirror,
                  registry_tokens, credential_store, settings, _settled_nodes):
        built.cache_clear()
