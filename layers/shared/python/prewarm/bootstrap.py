"""The composition root: builds each adapter once per process from the settings, on first use, and
hands handlers ready-to-call use cases bound to them.

A handler parses its event, calls one use case below and returns; it never builds an adapter. Nothing
is built at import time, so a function pays only for the clients it uses (the Kubernetes client alone
costs ~120 ms of imports). `reset()` forgets them all, for tests that change the environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from prewarm.settings import settings

if TYPE_CHECKING:
    from prewarm.adapters.bounded import BoundedCalls, CircuitBreakers
    from prewarm.adapters.clusters import StackClusters
    from prewarm.adapters.deferred import DeferredSecretMirror
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.ecr import EcrImages
    from prewarm.adapters.ecr_auth import EcrTokenSource
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.scheduler import SchedulerCronSchedules
    from prewarm.adapters.secrets import SecretsManagerCredentialStore, SecretsManagerMirror
    from prewarm.adapters.sqs import NodeQueues, ProbeQueue, StatusQueue
    from prewarm.domain.clusters import ClusterReach, RegisteredCluster
    from prewarm.domain.job import StoredJob
    from prewarm.domain.keys import JobKey
    from prewarm.domain.messages import Baked, StatusMessage
    from prewarm.domain.push import ImagePush
    from prewarm.domain.retry import Delivery
    from prewarm.domain.warming import SettledNodes
    from prewarm.services.bakes import BakeContext
    from prewarm.services.credentials import RefreshReport
    from prewarm.services.cron_jobs import RunOutcome
    from prewarm.services.dispatch import PlanResult
    from prewarm.services.jobs import Applied
    from prewarm.services.pacing import PacedQueues
    from prewarm.services.ports import ClusterApi
    from prewarm.services.probes import Probing
    from prewarm.services.resources import SyncReport
    from prewarm.services.schedules import SweepResult, SweepSettings
    from prewarm.services.status_batches import StatusBatchOutcome


@lru_cache(maxsize=1)
def store() -> DynamoJobStore:
    from prewarm.adapters.dynamodb import DynamoJobStore

    return DynamoJobStore(settings().table_name)


@lru_cache(maxsize=1)
def node_queues() -> NodeQueues:
    from prewarm.adapters.sqs import NodeQueues

    s = settings()
    return NodeQueues(
        s.node_queue_prefix, s.status_queue_url, dlq_arn=s.node_dlq_arn,
        visibility_seconds=s.node_queue_visibility_seconds, sender_arns=s.node_queue_sender_arns,
    )


@lru_cache(maxsize=1)
def queues() -> PacedQueues:
    """The node queues as every sender of tasks uses them: pull starts paced by each registry's budget."""
    from prewarm.services.pacing import PacedQueues

    return PacedQueues(node_queues(), store(), settings().registry_budgets())


@lru_cache(maxsize=1)
def clusters() -> StackClusters:
    """The clusters the stack serves: its own (from its settings) and those registered in its table."""
    from prewarm.adapters.clusters import StackClusters

    return StackClusters(store(), settings().cluster_name, own_api=lambda: own_cluster(),
                         registered_api=lambda registered: registered_cluster(registered))


def bounded_clusters(calls: BoundedCalls) -> StackClusters:
    """The clusters through bounded clients (one try, short timeouts, a deadline, each cluster's circuit
    breaker), so no cluster's fault holds up the work of the others."""
    from prewarm.adapters.clusters import StackClusters

    return StackClusters(store(), settings().cluster_name, own_api=lambda: own_cluster(calls),
                         registered_api=lambda registered: registered_cluster(registered, calls))


@lru_cache(maxsize=1)
def circuits() -> CircuitBreakers:
    """Each cluster's circuit breaker, kept for the process and shared by its bounded clients."""
    from prewarm.adapters.bounded import CircuitBreakers

    return CircuitBreakers()


@lru_cache(maxsize=1)
def status_calls() -> BoundedCalls:
    """The status path's timeouts and per-invocation deadline."""
    from prewarm.adapters.bounded import BoundedCalls

    return BoundedCalls(breakers=circuits())


@lru_cache(maxsize=1)
def status_clusters() -> StackClusters:
    """The clusters as `record_status` calls them: a hello's cluster failing holds up no other message."""
    return bounded_clusters(status_calls())


@lru_cache(maxsize=1)
def plan_calls() -> BoundedCalls:
    """The table stream's plans' timeouts and per-plan deadline."""
    from prewarm.adapters.bounded import PLAN_CALL_SECONDS, PLAN_REQUEST_TIMEOUT, BoundedCalls, InvocationDeadline

    return BoundedCalls(timeout=PLAN_REQUEST_TIMEOUT, deadline=InvocationDeadline(most=PLAN_CALL_SECONDS, reserve=0),
                        breakers=circuits())


@lru_cache(maxsize=1)
def plan_clusters() -> StackClusters:
    """The clusters as the table stream's plans call them: a job whose cluster fails is parked at once."""
    return bounded_clusters(plan_calls())


@lru_cache(maxsize=1)
def replan_clusters() -> StackClusters:
    """The clusters as the plan of a job parked before calls them (a probe saw its cluster answer): through
    the cluster's open circuit at its first pace, as the probe did."""
    from dataclasses import replace

    return bounded_clusters(replace(plan_calls(), probe=True))


@lru_cache(maxsize=1)
def probe_clusters() -> StackClusters:
    """The clusters as a probe calls them: the status path's bounds, through an open circuit at its first pace."""
    from dataclasses import replace

    return bounded_clusters(replace(status_calls(), probe=True))


def probing() -> Probing:
    """Where probes of clusters are sent (the probe queue), and the clusters as they call them."""
    from prewarm.services.probes import Probing

    return Probing(probe_queue, probe_clusters())


def own_cluster(bounded: BoundedCalls | None = None) -> KubeCluster:
    """The stack's own cluster's API, from its settings (`ClusterConfigError` when they name none)."""
    from prewarm.adapters.kube import KubeCluster

    return KubeCluster.from_settings(settings(), bounded=bounded)


def registered_cluster(registered: RegisteredCluster, bounded: BoundedCalls | None = None) -> KubeCluster:
    """A registered cluster's API, at the endpoint it was registered with."""
    from prewarm.adapters.kube import KubeCluster

    return KubeCluster.for_registered(registered, bounded=bounded)


def cluster(name: str = "") -> ClusterApi:
    """The API of cluster `name`: the stack's own (`""`) or a registered one; `ClusterConfigError` when
    it cannot be built."""
    return clusters().api(name)


@lru_cache(maxsize=1)
def secret_mirror() -> DeferredSecretMirror:
    """Where jobs' pullSecrets are mirrored for the agents (Secrets Manager under the stack prefix), built
    when a job names pullSecrets or the sweep cleans up, not before; a cluster's secrets are read through
    its API."""
    from prewarm.adapters.deferred import DeferredSecretMirror

    return DeferredSecretMirror(_secrets_manager_mirror)


def _secrets_manager_mirror() -> SecretsManagerMirror:
    from functools import partial

    from prewarm.adapters.secrets import SecretsManagerMirror
    from prewarm.services.clusters import api_or_none

    return SecretsManagerMirror(settings().secret_prefix, readers=partial(api_or_none, clusters()))


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


@lru_cache(maxsize=1)
def images() -> EcrImages:
    from prewarm.adapters.ecr import EcrImages

    return EcrImages()


# --- Use cases, bound to the adapters above -------------------------------------------------------


def stored_job(image: Mapping[str, Any] | None) -> StoredJob | None:
    """The job a table stream image holds (None: the image is of another item, or absent)."""
    from prewarm.adapters.dynamodb import job_of_item

    return job_of_item(image)


def prepare_plans() -> None:
    """Makes what plans share before they run side by side on threads: the store, the paced queues and the
    clusters, and a first boto3 client, which loads the default session's credential and endpoint
    resolvers (boto3's session is not thread-safe while it makes its first clients)."""
    store().client  # noqa: B018 - made for its side effect
    queues()
    plan_clusters()


def plan_job(key: JobKey, *, probing: bool = False) -> PlanResult:
    """Select the nodes of job `key` and send the first tasks, and tell the warming nodes of its cluster;
    `TaskSendError` when a send failed. A job whose cluster cannot be read is parked, and its cluster probed.
    `probing`: the job was parked before, and is asked again because its cluster answered."""
    from prewarm.services.stream import plan

    plan_calls().deadline.begin()
    return plan(store(), queues(), replan_clusters() if probing else plan_clusters(), key, now=time.time(),
                secrets=secret_mirror(), images=images(), probes=probe_queue(),
                budgets=settings().registry_budgets(), remove_after=settings().image_removal_grace,
                asked_again=probing)


def delete_job(key: JobKey) -> int:
    """Cancel a deleted job's in-flight pulls (as this stack's role), remove its items and tell the warming
    nodes of its cluster; `TaskSendError` when a send failed."""
    from prewarm.services.stream import delete

    plan_calls().deadline.begin()
    return delete(store(), queues(), plan_clusters(), key, now=time.time(),
                  remove_after=settings().image_removal_grace)


def release_dropped_pin(job: StoredJob, before: StoredJob | None) -> int | None:
    """When `job`'s new spec no longer pins the image `before` pinned: unpin it on its nodes (how many were
    told), else None; `TaskSendError` when a send failed."""
    from prewarm.domain.lifecycle import pin_dropped
    from prewarm.services.lifecycle import release_pin

    if before is None or not pin_dropped(job, before):
        return None
    return release_pin(store(), queues(), before)


def record_status(messages: Sequence[tuple[str, StatusMessage]], deliveries: Sequence[Delivery] = (),
                  poison_ids: Sequence[str] = (), time_left: Callable[[], float] | None = None) -> StatusBatchOutcome:
    """Apply a batch of the status queue (message id, parsed message): hellos and warm-ups, then reports;
    then say when the messages handed back (those to retry, the `poison_ids` that did not parse) come again.
    `time_left()`: the seconds the invocation has left, which bound its calls to clusters."""
    from prewarm.services.status_batches import record_status_batch

    status_calls().deadline.begin(time_left)
    return record_status_batch(store(), queues(), status_clusters(), status_queue, messages, now=time.time(),
                               deliveries=deliveries, poison_ids=poison_ids, probing=probing())


@lru_cache(maxsize=1)
def status_queue() -> StatusQueue:
    """The status queue, on the task queues' SQS client: one client per process, not two."""
    from prewarm.adapters.sqs import StatusQueue

    return StatusQueue(settings().status_queue_url, client=node_queues().client)


@lru_cache(maxsize=1)
def probe_queue() -> ProbeQueue:
    """The probe queue, on the task queues' SQS client."""
    from prewarm.adapters.sqs import ProbeQueue

    return ProbeQueue(settings().probe_queue_url, client=node_queues().client)


def handle_push(push: ImagePush) -> tuple[list[Applied], list[str]]:
    """Apply one job per prewarm rule matching a pushed image, and record its digest in the warm snapshots
    wanting it (recorded only: the stream starts their bakes), the rules read once for both. Returns the
    jobs applied and the warm snapshots changed."""
    from prewarm.adapters.clusters import ServedClusters
    from prewarm.adapters.ecr import EcrReplication
    from prewarm.services.bakes import record_push
    from prewarm.services.push import handle_push, matching_rules

    rules = matching_rules(store(), push)
    # The roster alone: a push reads which clusters are served, never their APIs.
    served = ServedClusters(store(), settings().cluster_name)
    applied = handle_push(store(), images(), push, now=time.time(), clusters=served, rules=rules,
                          replication=EcrReplication(images().client), sizes=images())
    return applied, record_push(store(), push, [r.metadata.name for r in rules], time.time())


def handle_replication(push: ImagePush, region: str) -> list[Applied]:
    """Start the jobs of the clusters in `region`, which ECR says now holds `push`'s replica."""
    from prewarm.adapters.clusters import ServedClusters
    from prewarm.services.push import handle_replication

    served = ServedClusters(store(), settings().cluster_name)
    return handle_replication(store(), images(), push, region, now=time.time(), clusters=served, sizes=images())


def refresh_credentials() -> RefreshReport | None:
    """Refresh registry credentials as configured; None when nothing is configured."""
    from prewarm.adapters.secrets import read_config_parameter
    from prewarm.services.credentials import refresh_credentials

    config = settings().credentials_config(read_config_parameter)
    if config is None:
        return None
    return refresh_credentials(config, clusters(), registry_tokens(), credential_store(), clock=time.time)


def repull_daily(scheduled_time: float | None) -> list[str]:
    """Start a new round of every active `Never` job (once per scheduled time), and record the run."""
    from prewarm.services.schedules import run_daily_round

    return run_daily_round(store(), scheduled_time=scheduled_time, clock=time.time)


@lru_cache(maxsize=1)
def settled_nodes() -> SettledNodes:
    """The sweep's memory, kept for the process: the nodes its runs found settled."""
    from prewarm.domain.warming import SettledNodes

    return SettledNodes()


@lru_cache(maxsize=1)
def sweep_settings() -> SweepSettings:
    from prewarm.services.schedules import SweepSettings

    s = settings()
    return SweepSettings(
        prefix=s.node_queue_prefix, silence_grace_seconds=s.node_silence_grace_seconds,
        resend_after_seconds=s.task_resend_seconds, agent_silence_seconds=s.agent_silence_seconds,
        no_agent_grace_seconds=s.no_agent_grace_seconds, taint_grace_seconds=s.startup_taint_grace_seconds,
        image_removal_grace_seconds=s.image_removal_grace,
    )


def sweep(time_left: Callable[[], float] | None = None) -> SweepResult:
    """Deadlines, silent nodes, lost sends, expired jobs and departed nodes' queues on every cluster; and
    record the run (not when the stack's own cluster failed: the run fails).

    `time_left()`: the seconds the invocation has left; work the next run can do stops when it runs low."""
    from prewarm.services.budget import TimeBudget
    from prewarm.services.schedules import run_sweep

    return run_sweep(store(), queues(), clusters(), clock=time.time, config=sweep_settings(), secrets=secret_mirror(),
                     budget=TimeBudget(time_left), settled=settled_nodes(), probes=probe_queue())


def sync_resources() -> SyncReport:
    """ImagePullJob, ImageListPullJob and PrewarmRule resources into the table, status back to them, on
    every cluster side by side; the run fails when the stack's own cluster did."""
    from prewarm.services.resources import run_sync

    return run_sync(store(), clusters(), clock=time.time, sizes=images())


def reach_cluster(name: str) -> ClusterReach:
    """Cluster `name`'s `/version` through the status path's bounded client (one try, short timeouts), with
    a circuit of its own: a cluster that failed the schedules a minute ago is asked again now."""
    from prewarm.adapters.bounded import BoundedCalls
    from prewarm.services.clusters import reach_cluster

    calls = BoundedCalls()
    calls.deadline.begin()
    return reach_cluster(bounded_clusters(calls), name)


@lru_cache(maxsize=1)
def cron_schedules() -> SchedulerCronSchedules:
    from prewarm.adapters.scheduler import SchedulerCronSchedules

    s = settings()
    return SchedulerCronSchedules(s.cron_schedule_prefix, s.cron_target_arn, s.cron_role_arn)


def sync_cron_schedules(new_image: Mapping[str, Any] | None, old_image: Mapping[str, Any] | None) -> str | None:
    """The schedules of the cron job a table stream record holds, put or deleted; None when the record is of
    another item."""
    from prewarm.adapters.dynamodb import cron_job_of_item

    new, old = cron_job_of_item(new_image), cron_job_of_item(old_image)
    if new is None and old is None:
        return None
    # Here, past the check: dispatch_job's job records (nearly all of them) never load the cron job service.
    from prewarm.services.cron_jobs import sync_schedules

    return sync_schedules(cron_schedules(), new, old)


def run_cron_job(cron_job: str, scheduled_time: float | None) -> RunOutcome:
    """The run of a cron job due at `scheduled_time` (its schedule's; now when the event has none)."""
    from prewarm.domain.keys import JobKey
    from prewarm.services.cron_jobs import run_due

    now = time.time()
    key = JobKey.parse(cron_job)
    # A cron job resource's runs are objects in its cluster: that cluster's API, built only for one.
    return run_due(store(), key, scheduled_at=scheduled_time or now, now=now,
                   objects=lambda: clusters().api(key.cluster), sizes=images())


def reset() -> None:
    for built in (store, node_queues, queues, status_queue, probe_queue, clusters, circuits, status_calls,
                  status_clusters, plan_calls, plan_clusters, replan_clusters, probe_clusters, images, secret_mirror,
                  registry_tokens, credential_store, settings, settled_nodes, sweep_settings, cron_schedules,
                  eks_client):
        built.cache_clear()


# --- Warm snapshots ------------------------------------------------------------------------------

def bake_context() -> BakeContext:
    """The bakes' store, EC2/EBS and node classes (EC2NodeClasses through the stack's own cluster's API)."""
    from prewarm.adapters.ec2 import Ec2Builders, NodeClassObjects
    from prewarm.services.bakes import BakeContext, BakeSettings

    s = settings()
    builders = Ec2Builders(s.node_queue_prefix, s.builder_instance_profile_arn)
    # Built on first use: a push no warm snapshot wants reads the table and nothing else.
    node_classes = NodeClassObjects(lambda: clusters().api(""), lambda: builders.client, eks_client, s.cluster_name)
    return BakeContext(store(), builders, node_classes,
                       BakeSettings(s.status_queue_url, s.aws_region, s.builder_agent_image))


@lru_cache(maxsize=1)
def eks_client() -> Any:
    """EKS, for the stack's own cluster's version and subnets (where builders launch from)."""
    import boto3

    return boto3.client("eks")


def record_baked(reports: Sequence[tuple[str, Baked]]) -> list[str]:
    """Builders' reports, recorded (the stream snapshots or ends their bakes). Returns the message ids of
    those to deliver again (the table refused)."""
    from prewarm.services.bakes import record_baked
    from prewarm.services.ports import StoreError

    again = []
    for message_id, r in reports:
        try:
            record_baked(store(), r, time.time())
        except StoreError:
            again.append(message_id)
    return again


def advance_bakes(names: Sequence[str]) -> list[str]:
    """Each warm snapshot's bake carried on after its record changed (the table stream)."""
    from prewarm.services.bakes import advance

    ctx = bake_context()
    return [line for name in dict.fromkeys(names) for line in advance(ctx, name, time.time())]


def snapshot_completed(snapshot_id: str, succeeded: bool, cause: str) -> str | None:
    """EBS's snapshot notification: the warm snapshot it was for, published or failed."""
    from prewarm.services.bakes import on_snapshot_event

    return on_snapshot_event(bake_context(), snapshot_id, succeeded, cause, time.time())


def sweep_bakes() -> list[str]:
    """Bakes past their budget failed, lost events made up for, orphan builders terminated."""
    from prewarm.services.bakes import sweep

    return sweep(bake_context(), time.time())
