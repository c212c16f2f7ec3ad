"""The ports the use cases need and the errors they raise; what they exchange are the domain's types.

Adapters implement these protocols structurally and raise these errors; services receive them as
arguments and catch them, so tests can hand in moto-backed adapters or fakes without patching
anything, and no service imports an adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: every function imports this module, few need these models
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm.domain.cronjobs import ScheduleState, StoredCronJob
    from prewarm.domain.job import JobRound, StoredJob
    from prewarm.domain.jobs import JobState
    from prewarm.domain.keys import JobKey
    from prewarm.domain.messages import ClusterProbe, NodeBound
    from prewarm.domain.node_queues import ProvidedQueue
    from prewarm.domain.nodes import NodeBoot, NodeFootprint, NodeWarm, RegisteredNode
    from prewarm.domain.placement import ExcludedNode
    from prewarm.domain.refresh import RegistryConfig, RegistryToken, StoredToken
    from prewarm.domain.registry_budget import BudgetState, RegistryBudget
    from prewarm.domain.schedules import ScheduleRun
    from prewarm.domain.status import Counters, NodeTaskRecord, NodeUpdate
    from prewarm.domain.warm_budgets import ImageCost, WarmBudget


# --- Errors the ports raise ----------------------------------------------------------------------

class ClusterError(RuntimeError):
    """A call to the Kubernetes API failed.

    `status` is the HTTP status (None when no response arrived), `reason` the `Status` reason
    (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...). `retryable` says whether the same call
    may succeed later unchanged.
    """

    retryable = False

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


class ClusterConfigError(ClusterError):
    """The cluster connection is configured wrongly (endpoint, CA data, kubeconfig, cluster name)."""


class ClusterUnavailableError(ClusterError):
    """The API could not answer now: connection refused or reset, timeout, 429 or 5xx. Retry later.

    `retry_after` is the server's hint in seconds (`Retry-After` or the Status `retryAfterSeconds`).
    """

    retryable = True

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after


class ClusterAuthError(ClusterError):
    """The API refused the caller (401 or 403): the role lacks an EKS access entry or RBAC rights."""


class ClusterNotFoundError(ClusterError):
    """The object or its namespace does not exist (404)."""


class ClusterConflictError(ClusterError):
    """The write conflicts (409): `reason` is `AlreadyExists`, or `Conflict` for a stale resourceVersion."""


class ClusterInvalidError(ClusterError):
    """The API rejected the request body or parameters (400 or 422); the message is the server's."""


class ClusterExpiredError(ClusterError):
    """The resource version or `continue` token is too old (410 Gone); restart the listing."""


class RegistryTokenError(RuntimeError):
    """A registry token could not be got; names the registry and AWS's reason, never a token."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"cannot get a token for {host}: {reason}")
        self.host = host
        self.reason = reason


class CredentialStoreError(RuntimeError):
    """The agents' credential store (Secrets Manager) refused or failed a read or write."""


class AgentCredentialsError(RuntimeError):
    """Credentials an agent was told to use cannot be read; names the secret, never its value."""


class TaskSendError(RuntimeError):
    """Some task or cancel messages could not be sent; `failures` lists `(node, error)`.

    Raised so the triggering record is retried: a re-run re-sends what was not sent.
    """

    def __init__(self, failures: Sequence[tuple[str, str]]) -> None:
        super().__init__(f"{len(failures)} task sends failed, first: {failures[0] if failures else None}")
        self.failures = list(failures)


class NodeQueueError(RuntimeError):
    """A node queue could not be created, read or set back to the stack's attributes."""


class PullSecretError(RuntimeError):
    """A job's pullSecrets cannot be made available to the agents; the job fails with this message."""


class SchedulesError(RuntimeError):
    """EventBridge Scheduler refused or failed a call on a cron job's schedules; the message names the schedule."""


class StoreError(Exception):
    """Base of the job store's errors."""


class StoreConflictError(StoreError):
    """A conditional write lost a race or found the item changed; re-read and decide again."""


class StoreRetryableError(StoreError):
    """Throttling or a transient failure; the whole operation can be retried as is."""


class JobItems(Protocol):
    """Job items (`prewarm.adapters.dynamodb.jobs`), and over how many partitions (`StoredJob.shards`) each
    job's node items are spread."""

    def get_job(self, key: str, *, consistent: bool = True) -> StoredJob | None: ...
    def create_job(self, job: StoredJob) -> None: ...
    def replace_job_spec(self, job: StoredJob, *, expected_hash: str) -> None: ...
    def set_job_fields(
        self, key: str, fields: Mapping[str, Any], *, condition_state: JobState | None = None
    ) -> None: ...
    def list_jobs(self) -> list[StoredJob]: ...
    def list_running_jobs(self, cluster: str = ...) -> list[StoredJob]: ...
    def list_image_jobs(self, cluster: str, repository: str) -> list[StoredJob]: ...
    def delete_job(self, key: str) -> None: ...
    def reserve_shards(self, key: str, nodes: int) -> int: ...
    def commit_plan(
        self,
        key: str,
        *,
        plan_id: str,
        expected_version: int,
        counters: Counters,
        extra: Mapping[str, Any],
    ) -> None: ...
    def finish_job(self, key: str, fields: Mapping[str, Any], *, require_done: bool = True) -> bool: ...


class NodeTaskItems(Protocol):
    """Each job round's node items and excluded nodes (`prewarm.adapters.dynamodb.tasks`); reads that are
    given no `shards` look them up on the job item. Writes that count change the job's counters with
    them, atomically."""

    def get_tasks(self, key: str, *, shards: int | None = None) -> list[NodeTaskRecord]: ...
    def get_task(self, key: str, node: str, *, shards: int | None = None) -> NodeTaskRecord | None: ...
    def get_tasks_of(self, ref: JobRound, nodes: Iterable[str]) -> dict[str, NodeTaskRecord]: ...
    def in_flight_tasks(self, ref: JobRound) -> list[NodeTaskRecord]:
        """The round's node items dispatched and not finished (a sparse index: not every node item)."""
        ...
    def failed_nodes(self, key: str, *, shards: int | None = None) -> list[str]: ...
    def waiting_nodes(
        self, key: str, limit: int, *, shards: int | None = None, start: int = 0
    ) -> list[str]: ...
    def put_tasks(self, key: str, tasks: Sequence[NodeTaskRecord], *, shards: int) -> None: ...
    def delete_tasks(self, key: str, nodes: Sequence[str], *, shards: int) -> None: ...
    def get_excluded(self, key: str, *, shards: int | None = None) -> list[ExcludedNode]: ...
    def put_excluded(self, key: str, excluded: Sequence[ExcludedNode], *, shards: int) -> None: ...
    def update_task(self, ref: JobRound, update: NodeUpdate) -> None: ...
    def apply_updates(self, ref: JobRound, updates: Sequence[NodeUpdate], deltas: Mapping[str, int]) -> None: ...
    def add_task(self, ref: JobRound, task: NodeTaskRecord, *, plan_id: str) -> None: ...
    def add_tasks(self, ref: JobRound, tasks: Sequence[NodeTaskRecord], *, plan_id: str) -> list[str]: ...
    def remove_task(self, ref: JobRound, task: NodeTaskRecord) -> None: ...
    def claim_tasks(self, ref: JobRound, nodes: Sequence[str], *, parallelism: int, now: float) -> list[str]: ...


class RuleItems(Protocol):
    """The prewarm rules (`prewarm.adapters.dynamodb.rules`)."""

    def put_rule(self, name: str, spec: dict[str, Any], spec_hash: str) -> str: ...
    def list_rules(self) -> list[dict[str, Any]]: ...
    def delete_rule(self, name: str) -> bool: ...


class CronJobItems(Protocol):
    """The AdvancedCronJobs (`prewarm.adapters.dynamodb.cron_jobs`)."""

    def put_cron_job(self, key: JobKey, manifest: dict[str, Any], spec_hash: str, uid: str = "") -> str: ...
    def get_cron_job(self, key: JobKey) -> StoredCronJob | None: ...
    def list_cron_jobs(self) -> list[StoredCronJob]: ...
    def delete_cron_job(self, key: JobKey) -> bool: ...


class CronSchedules(Protocol):
    """EventBridge Scheduler's schedules of the cron jobs (`prewarm.adapters.scheduler`)."""

    def put_schedules(self, key: JobKey, expressions: Sequence[str], *, zone: str, enabled: bool) -> None: ...
    def delete_schedules(self, key: JobKey) -> None: ...


class CronScheduleStates(Protocol):
    """A cron job's schedules as EventBridge Scheduler holds them (`prewarm.adapters.scheduler`)."""

    def get_schedules(self, key: JobKey) -> list[ScheduleState]: ...


class NodeItems(Protocol):
    """The nodes whose agents said hello (`prewarm.adapters.dynamodb.nodes`)."""

    def put_node(self, node: RegisteredNode) -> None: ...
    def record_warm(self, node: str, warm: NodeWarm, cluster: str = ...) -> RegisteredNode:
        """Stores how the node warmed; returns its registration as the write left it (`StoreConflictError`:
        not registered yet)."""
        ...
    def record_boot(self, node: str, boot: NodeBoot, cluster: str = ...) -> None: ...
    def record_footprint(self, node: str, footprint: NodeFootprint, cluster: str = ...) -> None: ...
    def get_node(self, name: str, cluster: str = ...) -> RegisteredNode | None: ...
    def list_nodes(self, cluster: str = ...) -> list[RegisteredNode]: ...
    def delete_node(self, name: str, cluster: str = ...) -> None: ...
    def mark_node_verified(self, name: str, cluster: str = ...) -> None: ...  # checked against its cluster


class ProbeChains(Protocol):
    """Each cluster's one probe chain while jobs are parked on it, on the cluster's item (`probe`: the token
    of the probe in flight, `probe_due`: when it is due; None: no chain): conditional writes, so one chain
    runs per cluster."""

    def start_probe(self, name: str, token: str, *, due: float, lost_before: float, own: bool = False) -> bool:
        """Starts cluster `name`'s chain with probe `token`, due at `due`, unless one runs (its probe due at or
        after `lost_before`); False then, and for a registered cluster no longer stored. `own`: the stack's
        own cluster, whose item is made if missing."""
        ...

    def pass_probe(self, name: str, token: str, *, to: str | None, due: float = 0.0) -> bool:
        """The chain's probe `token` hands over to probe `to`, due at `due`, or ends the chain (`to` None);
        False when `token` is not the chain's (a duplicate delivery, a chain ended or replaced)."""
        ...

    def probe_due(self, name: str) -> float | None: ...


class ClusterItems(ProbeChains, Protocol):
    """The registered clusters (`prewarm.adapters.dynamodb.clusters`)."""

    def put_cluster(self, cluster: RegisteredCluster) -> None: ...
    def get_cluster(self, name: str) -> RegisteredCluster | None: ...
    def list_clusters(self) -> list[RegisteredCluster]: ...
    def delete_cluster(self, name: str) -> bool: ...
    def record_cluster_check(self, name: str, *, reachable: bool, reason: str, checked_at: float,
                             agents: int | None = None, synced: bool = False, own: bool = False) -> None: ...


class BudgetItems(Protocol):
    """Each registry's request budget (`prewarm.domain.registry_budget`), shared by every job and cluster."""

    def reserve_pull_starts(self, key: str, costs: Sequence[float], *, now: float,
                            burst_seconds: float, horizon: float | None = None,
                            budget: RegistryBudget | None = None) -> tuple[float, ...]:
        """Start times, in one write, for pulls from registry `key` costing `costs` seconds of its budget each
        (only those within `horizon` s when given); `budget`, their rates, is kept for `prewarm.domain.eta`."""
        ...
    def get_budget(self, key: str) -> BudgetState | None: ...  # as its last reservation left it
    def record_pull_starts(self, ref: JobRound, starts: Mapping[str, float], *, held: Sequence[str] = (),
                           now: float) -> None:
        """Writes each claimed node's paced start (`NodeTaskRecord.starts_at`), and `now` as the hold of each
        node in `held` (`held_at`), on its node item of `ref`'s round; a node item no longer claimed in
        that round is left alone."""
        ...


class WarmBudgetItems(Protocol):
    """Each cluster's namespaces' warm budgets (`prewarm.domain.warm_budgets`), as the resource sync copied them
    from the Namespaces' annotations: every apply reads them from the table alone."""

    def get_warm_budgets(self, cluster: str = ...) -> dict[str, WarmBudget]: ...
    def put_warm_budgets(self, budgets: Mapping[str, WarmBudget], cluster: str = ...) -> bool:
        """Stores every namespace's budget of `cluster`; False when they were stored already."""
        ...


class WarmSnapshotItems(Protocol):
    """Each warm snapshot's manifest and its state (`domain.bakes.SnapshotState`), written with a version."""

    def put_warm_snapshot(self, name: str, manifest: dict[str, Any], spec_hash: str) -> str: ...
    def list_warm_snapshots(self) -> list[tuple[dict[str, Any], dict[str, Any], int]]: ...
    def get_warm_snapshot(self, name: str) -> tuple[dict[str, Any], dict[str, Any], int] | None: ...
    def save_snapshot_state(self, name: str, state: dict[str, Any], version: int) -> int:
        """Writes `state` if the item is still at `version` (else StoreConflictError); returns the new version."""
        ...
    def delete_warm_snapshot(self, name: str) -> bool: ...


class JobStore(JobItems, NodeTaskItems, RuleItems, NodeItems, ClusterItems, WarmSnapshotItems, CronJobItems,
               BudgetItems, WarmBudgetItems,
               Protocol):
    """The job table, every item kind (`prewarm.adapters.dynamodb.DynamoJobStore`)."""


# --- What each use case asks of the table: the item kinds it reads and writes, no more ---------------


class PlanItems(JobItems, NodeTaskItems, Protocol):
    """A job and its node items: planning, claims, healing, a deletion's cancels (`services.dispatch`,
    `services.healing`, `services.jobs.complete_deletion`)."""


class WarmingItems(JobItems, NodeItems, Protocol):
    """Running jobs and registered nodes: what a warming node must have (`services.warming`)."""


class AgentItems(JobItems, NodeTaskItems, NodeItems, BudgetItems, Protocol):
    """Jobs, their node items and registered nodes: what agents' messages and the table stream change
    (`services.reports`, `services.stream`)."""


class StatusItems(AgentItems, ClusterItems, RuleItems, Protocol):
    """What the status queue's messages change, how a cluster failed when a hello could not read it, and the
    rules whose node labels they judge (`services.status_batches.record_status`)."""


class ApplyItems(JobItems, NodeTaskItems, NodeItems, RuleItems, WarmSnapshotItems, CronJobItems, BudgetItems,
                 WarmBudgetItems, Protocol):
    """Jobs, rules, warm snapshots and cron jobs as people and pushes apply them, read back with their node
    items (`services.jobs`, `services.push`)."""


class StreamItems(AgentItems, ProbeChains, Protocol):
    """What the table stream's plans change, and the probe chain a parked job starts (`services.stream`)."""


class ProbeItems(JobItems, ClusterItems, Protocol):
    """A probe's: the parked jobs of its cluster, its chain and the cluster's health (`services.probes`)."""


class SweepItems(JobItems, NodeTaskItems, NodeItems, ClusterItems, RuleItems, Protocol):
    """Everything the sweep tends: jobs, node items, registered nodes, each cluster's health, and the rules
    whose node labels it repairs (`services.schedules.sweep`)."""


class TaskQueues(Protocol):
    def send(self, message: NodeBound) -> bool: ...
    def send_many(self, messages: Sequence[NodeBound]) -> list[tuple[str, str]]: ...
    def list_node_queues(self, cluster: str = ...) -> dict[str, str]: ...
    def owns_queue(self, url: str) -> bool: ...
    def queue_node(self, url: str) -> str | None:
        """The node a queue of this stack serves ("" when its tags do not say); None when the queue is not
        this stack's or is gone."""
        ...
    def delete_queue(self, url: str) -> None: ...
    def provide_queue(self, node: str, cluster: str | None = None) -> ProvidedQueue:
        """The node's queue, created or set back to the stack's attributes and tags (`NodeQueueError`)."""
        ...
    def repair_queue(self, url: str) -> tuple[str, ...] | None:
        """Sets a queue of this stack back to the stack's attributes: what was set back; None when the queue
        is not this stack's or is gone (`NodeQueueError`)."""
        ...


class ClusterProbes(Protocol):
    """Where the control plane sends itself a `ClusterProbe` (the probe queue: `ProbeQueue`)."""

    def send_probe(self, probe: ClusterProbe, *, delay: int) -> None: ...  # delay: 0 to SQS's 900 s


class Redelivery(Protocol):
    """The status queue as its consumer sees it: when each message a batch hands back is delivered again
    (`ChangeMessageVisibility`, the SQS adapter's `StatusQueue`). Best effort: a message whose visibility
    could not be changed comes back after the queue's own visibility timeout."""

    def deliver_again_after(self, delays: Sequence[tuple[str, int]]) -> None: ...  # (receipt handle, seconds)


class ScheduleRuns(Protocol):
    """The last completed run of each schedule (`DynamoJobStore` keeps them in the job table)."""

    def record_run(self, run: ScheduleRun) -> None: ...
    def last_runs(self, schedules: Sequence[str]) -> dict[str, ScheduleRun]: ...


class ScheduledItems(SweepItems, ScheduleRuns, Protocol):
    """The sweep's items and the record of each schedule's last run (`services.schedules.run_sweep`,
    `run_daily_round`)."""


class Cluster(Protocol):
    """Read access to the cluster (the Kubernetes adapter). Objects are plain dicts as the API returns them."""

    def list_nodes(
        self, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]: ...
    def get_node(self, name: str) -> dict[str, Any] | None: ...
    def list_pods(
        self, namespace: str | None, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]: ...
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    # The agent DaemonSet (`apps/v1` `daemonsets`), for where its pods run; None when it is not there.
    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...


class NodeInventory(Protocol):
    """The cluster's nodes as the sweep reads them every minute (the Kubernetes adapter): their metadata
    alone (`PartialObjectMetadata`: name, uid, labels, annotations, creationTimestamp), never their status."""

    def list_node_metadata(self) -> list[dict[str, Any]]: ...
    def get_node_metadata(self, name: str) -> dict[str, Any] | None: ...


class PullSecretReader(Protocol):
    """Reads a namespace's secret (`KubeCluster`), to check a job's own pull secrets exist at apply."""

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class RunObjects(PullSecretReader, Protocol):
    """A cluster's API as the runs of a cron job resource need it (`KubeCluster`): the cron job's object, and
    its runs' ImageListPullJob objects created and deleted as Kruise's controller does."""

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None
                   ) -> dict[str, Any] | None: ...
    def create_object(self, api_version: str, plural: str, body: Mapping[str, Any], namespace: str | None = None
                      ) -> dict[str, Any]: ...
    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool: ...


class NodeTaints(Protocol):
    """What the sweep needs to remove a startup taint no agent removed (the Kubernetes adapter): the
    agents' ConfigMap (which taint, which deadline), the node (its taints), a guarded patch of it, an
    Event on it."""

    def get_node(self, name: str) -> dict[str, Any] | None: ...
    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...
    def patch_node(self, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...
    def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


class NodeWarmWrites(Protocol):
    """What `record_status` writes on a node whose warm-up it judges (the Kubernetes adapter): the agents'
    ConfigMap (which startup taint), the node, a guarded patch of it (the taint's removal) and a strategic
    merge patch of its status (the `PrewarmWarm` condition)."""

    def get_node(self, name: str) -> dict[str, Any] | None: ...
    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...
    def patch_node(self, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...
    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...


class NodeStates(Protocol):
    """What `prewarm get nodes` reads of the cluster (the Kubernetes adapter): the nodes, the agents'
    ConfigMap (which taint, which deadline) and the sweep's Events on nodes whose taint it removed."""

    def list_nodes(
        self, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]: ...
    def get_object(
        self, api_version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...
    def list_objects(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]: ...


class ImageMetadata(Protocol):
    """What the registry knows about a pushed image (ECR `BatchGetImage`); each `region` is where the repository
    is ("": the stack's Region)."""

    def platforms(self, registry_id: str, repository: str, digest: str, *,
                  region: str = "") -> list[dict[str, str]] | None: ...
    def layer_count(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None: ...
    def image_bytes(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None: ...


class ImageSizes(Protocol):
    """What an image weighs, as its registry's manifest says (ECR `BatchGetImage`): a namespace's warm budget."""

    def image_size(self, image: str) -> ImageCost:
        """`image`'s digest and compressed bytes (the largest platform's, for an index); each unknown ("",
        None) when the registry cannot say, or is not one that can be asked."""
        ...


class ReplicaRegions(Protocol):
    """The Regions the stack's ECR registry replicates a repository to (`DescribeRegistry`)."""

    def replica_regions(self, repository: str) -> frozenset[str]: ...


# --- Credentials ---------------------------------------------------------------------------------

# A Kubernetes API bearer token, fetched anew for each request (`EksTokenSource` caches and renews).
BearerTokenSource = Callable[[], str]


class CredentialsCluster(Protocol):
    """What the refresher needs of the Kubernetes adapter (`prewarm.adapters.kube.KubeCluster`)."""

    def list_namespaces(self, label_selector: str | None = None) -> list[dict[str, Any]]: ...
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_service_account(
        self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = True
    ) -> dict[str, Any]: ...


class ClusterVersion(Protocol):
    """The API server's `/version` (the Kubernetes adapter): `gitVersion`, `major`, `minor`..."""

    def get_version(self) -> dict[str, Any]: ...


class ClusterApi(Cluster, NodeInventory, NodeTaints, NodeWarmWrites, NodeStates, CredentialsCluster, ClusterVersion,
                 RunObjects, Protocol):
    """One cluster's Kubernetes API, all a use case may ask of it (`prewarm.adapters.kube.KubeCluster`);
    each use case names the narrower protocol it uses."""

    def replace_status(self, api_version: str, plural: str, name: str, body: Mapping[str, Any],
                       namespace: str | None = None) -> dict[str, Any]: ...
    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool: ...


class ClusterRoster(Protocol):
    """Which clusters one stack serves and the name the stack's own goes by, without their APIs
    (`prewarm.adapters.clusters.ServedClusters`): what a push needs, so its function is granted no
    cluster access.

    The stack's own cluster is `DEFAULT_CLUSTER` (`""`) wherever the stack keys a cluster; people know it
    by `own_name` (the stack's `ClusterName`, `""` when it has none)."""

    @property
    def own_name(self) -> str: ...

    def served(self) -> list[RegisteredCluster]:
        """Every cluster served, read afresh: the stack's own first (named `""`, with the labels it was
        registered with, if it was), then the registered ones."""
        ...

    def serves(self, name: str) -> bool: ...  # whether the stack serves cluster `name` (`""`: its own)


class ClusterDirectory(ClusterRoster, Protocol):
    """The clusters one stack serves (`prewarm.adapters.clusters.StackClusters`): the roster, and the API
    of one by name."""

    def api(self, name: str = "") -> ClusterApi:
        """The API of cluster `name`; `ClusterConfigError` when it is not registered (or, for the stack's
        own, when no Kubernetes access is configured)."""
        ...


class RegistryTokenSource(Protocol):
    """Gets a new token for a registry (`prewarm.adapters.ecr_auth.EcrTokenSource`); raises
    `RegistryTokenError` when it cannot."""

    def token(self, registry: RegistryConfig) -> RegistryToken: ...


class CredentialStore(Protocol):
    """The agents' registry credentials (`prewarm.adapters.secrets.SecretsManagerCredentialStore`);
    raises `CredentialStoreError` when it cannot read or write."""

    def read(self, host: str) -> StoredToken | None: ...
    def write(self, host: str, token: RegistryToken) -> str: ...


class PullSecretMirror(Protocol):
    """Copies a namespace's image pull secrets (of a cluster: the stack's own, "", or a registered one)
    where agents can read them; returns their ARNs."""

    def mirror(self, namespace: str, names: list[str], cluster: str = ...) -> list[str]: ...


class PullSecretCleanup(Protocol):
    """Deletes the mirrors of pull secrets that no job names any more (`SecretsManagerMirror`)."""

    def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]: ...
