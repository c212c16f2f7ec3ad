"""Messages between the control plane and the node agents, defined once for both sides.

Node queues carry `PullTask`, `CancelTask`, `RequiredImages` and `ReleaseImage`; the status queue carries
`StatusReport`, `Hello`, `Warmed`, `ImageGone` and `Footprint`; the probe queue, read by the same function, the
control plane's own `ClusterProbe`. Every message has `v` (the schema version) and `kind`, so a reader can reject
what it does not know with a clear error instead of guessing.

Versioning: `v` changes only when an existing kind changes meaning or loses a field. A new kind, or a
new optional field, keeps `v` but is sent only to readers that announced they take it: readers
forbid unknown fields and kinds (a poison message to them), so an old agent must never see a
`RequiredImages` (the control plane sends it only after a hello with `warm_until`), an agent
leaves `warm_until` out of its hello unless its node holds the startup taint, and it sends `Warmed`
only to a control plane that sent it a `RequiredImages` (so one that reads `Warmed`). `ImageGone`
relies on the upgrade order (docs/operations.md, "Upgrade": the stack before the agents); so does
`ReleaseImage` (an agent older than it leaves it to the dead-letter queue: its image stays, as before)
and `Footprint`.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
)

from prewarm.domain.clusters import CLUSTER_NAME_MAX, CLUSTER_NAME_PATTERN
from prewarm.domain.kubernetes import label_map_problems, raise_problems
from prewarm.domain.mirrors import MirrorConfig
from prewarm.domain.validation import describe_validation_error

SCHEMA_VERSION = 1


class NodePhase(StrEnum):
    """Where one node's pull of one job stands: stored per node, and reported by agents (never Waiting)."""

    WAITING = "Waiting"
    PULLING = "Pulling"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_terminal(self) -> bool:
        """Succeeded, Failed and Cancelled end the node's work for the round."""
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.CANCELLED})

# Bounds that keep every message storable: DynamoDB numbers hold 38 digits between 1e-130 and 1e126
# (a larger count, NaN or a denormal timestamp would fail the write, not the parse), and its keys
# are at most 1024 bytes. A job is `namespace/name` (63 + 1 + 253), with `<cluster>:` first in a registered
# cluster (an EKS name, 100 + 1); a node name a DNS subdomain.
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
EpochSeconds = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False), AfterValidator(lambda t: round(t, 6))]
JOB_KEY_MAX = 317 + CLUSTER_NAME_MAX + 1
NODE_NAME_MAX = 253


class MessageError(ValueError):
    """A queue message that is not valid JSON or does not follow the schema (a poison message)."""


# The models are built on first use, not at import (defer_build): on_image_push and
# refresh_ecr_credentials import this module for NodePhase and the queue names but never build a message.
_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _without_default(data: dict[str, Any], name: str, default: Any) -> dict[str, Any]:
    """`data` without `name` when it holds `default`: a field readers older than it must not see."""
    if data.get(name, default) == default:
        data.pop(name, None)
    return data


class _Message(BaseModel):
    model_config = _MODEL_CONFIG
    v: Literal[1] = 1


class _InCluster(BaseModel):
    """A message about a node rather than a job's pull: it names the node's registered cluster itself
    (omitted for the stack's own, so readers older than clusters still take it)."""

    model_config = _MODEL_CONFIG
    cluster: str = Field(default="", max_length=CLUSTER_NAME_MAX, pattern=f"^$|{CLUSTER_NAME_PATTERN}",
                         description="the node's registered cluster; absent for the stack's own")

    @model_serializer(mode="wrap")
    def _without_default_cluster(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_default(handler(self), "cluster", "")


class JobRef(BaseModel):
    """What identifies one pull of one job on one node: a report must match it exactly to count."""

    model_config = _MODEL_CONFIG
    job: str = Field(max_length=JOB_KEY_MAX, description="`namespace/name` of the job")
    job_uid: str = Field(min_length=1, max_length=128)
    round: Count
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)


class _ToNode(BaseModel):
    """A task for one node: it carries the cluster of its job and node, for the sender to find the node's
    queue. The queue already says it, so the field stays off the wire (agents older than it refuse
    unknown fields), and a task read back without it is of the stack's own cluster."""

    model_config = _MODEL_CONFIG
    cluster: str = Field(default="", max_length=CLUSTER_NAME_MAX, pattern=f"^$|{CLUSTER_NAME_PATTERN}", exclude=True,
                         description="the job's registered cluster; \"\" for the stack's own; never sent")


class PullTask(_Message, _ToNode, JobRef):
    kind: Literal["task"] = "task"
    image: str = Field(min_length=1, description="the pull reference (name@digest or name:tag)")
    image_pull_policy: Literal["Always", "IfNotPresent"] = "IfNotPresent"
    timeout_seconds: int = Field(default=600, ge=1, le=2**63 - 1)
    backoff_limit: Count = 3
    deadline: float | None = Field(default=None, allow_inf_nan=False,
                                   description="epoch seconds; no attempt runs past it")
    sandbox_labels: dict[str, str] = Field(default_factory=dict)
    sandbox_annotations: dict[str, str] = Field(default_factory=dict)
    pull_secret_arns: list[str] = Field(
        default_factory=list, description="Secrets Manager secrets holding .dockerconfigjson documents"
    )
    size_bytes: Count | None = Field(default=None, description="compressed size, for the disk guard")
    pin: bool = Field(default=False, description="pin the image in containerd once pulled; absent when false")
    pull_secrets_only: bool = Field(
        default=False, description="pull with pull_secret_arns only, never with shared credentials; absent when false")
    # For the sender only, never sent (agents refuse unknown fields): the image's layer count, which sets
    # the pull's share of its registry's budget, and how long the queue holds the task back for the start
    # that budget gave it (SendMessage's DelaySeconds).
    # The job's node items' partitions (where the start is recorded) and, for a task sent again, the start
    # its first send reserved (not reserved again: `services.pacing`).
    layers: int | None = Field(default=None, ge=0, exclude=True)
    delay_seconds: int = Field(default=0, ge=0, le=900, exclude=True)
    shards: int = Field(default=1, ge=1, exclude=True)
    reserved_start: float | None = Field(default=None, allow_inf_nan=False, exclude=True)

    @model_serializer(mode="wrap")
    def _without_false_flags(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Only jobs that ask send them: agents older than a field refuse it. An old agent refusing a
        # pullSecretsOnly task never pulls it with shared credentials either.
        return _without_default(_without_default(handler(self), "pin", False), "pull_secrets_only", False)


class CancelTask(_Message, _ToNode, JobRef):
    kind: Literal["cancel"] = "cancel"
    reason: str = ""


# The message of a Succeeded report whose image was on the node already: nothing was pulled.
ALREADY_PRESENT = "image already present"


class StatusReport(_Message, JobRef):
    kind: Literal["status"] = "status"
    phase: NodePhase
    attempt: Count = 1
    seq: Count = Field(default=0, description="increases with every report of one pull; a fresh run starts "
                                              "it from the clock (ms)")
    bytes_done: Count | None = None
    bytes_total: Count | None = None
    image_id: str | None = None
    repo_digest: str | None = None
    size_bytes: Count | None = None
    message: str = ""
    started_at: EpochSeconds | None = None
    finished_at: EpochSeconds | None = None

    @field_validator("phase")
    @classmethod
    def _is_reported_phase(cls, phase: NodePhase) -> NodePhase:
        if phase is NodePhase.WAITING:
            raise ValueError("a node reports Pulling, Succeeded, Failed or Cancelled, never Waiting")
        return phase


class Hello(_Message, _InCluster):
    kind: Literal["hello"] = "hello"
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    labels: dict[str, str] = Field(default_factory=dict)
    architecture: str = ""
    os: str = "linux"
    queue_url: str = ""
    images: list[str] = Field(default_factory=list, description="repo digests already present")
    agent_version: str = ""
    warm_until: EpochSeconds | None = Field(
        default=None,
        description="the node holds the startup taint until its images are present, at the latest until then; "
                    "absent otherwise (and from agents that predate it)",
    )
    mirror_config: MirrorConfig | None = Field(
        default=None, description="containerd's node-local mirrors; absent from agents that predate it")

    @field_validator("labels")
    @classmethod
    def _labels_are_node_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        # The Node's labels, which its API server validated: any other map (an empty key, say) is not
        # the node's and is refused before it reaches the node's item.
        raise_problems(label_map_problems(labels))
        return labels

    @model_serializer(mode="wrap")
    def _without_absent_warm_until(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A control plane older than the field refuses a hello that has it, even as null.
        data = _without_default(_without_default(handler(self), "warm_until", None), "cluster", "")
        return _without_default(data, "mirror_config", None)


class RequiredImage(BaseModel):
    """One image a warming node must have before its startup taint comes off, and the job that wants it."""

    model_config = _MODEL_CONFIG
    image: str = Field(min_length=1, description="the pull reference, as the job's PullTask names it")
    job: str = Field(max_length=JOB_KEY_MAX, description="`namespace/name` of the `Never` job")


class RequiredImages(_Message, _InCluster):
    """Every image the node must have before its startup taint comes off (empty: none).

    Each list replaces the one before; SQS does not keep order, so the agent keeps the one with the
    latest `as_of` (when the control plane read the jobs it was computed from).
    """

    kind: Literal["required"] = "required"
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    as_of: EpochSeconds
    images: list[RequiredImage] = Field(default_factory=list)


# A `Warmed` names at most this many of the images still missing at the warm deadline (the agent's
# Event on the node has them all, with the reasons).
WARMED_MISSING_MAX = 20


class Warmed(_Message, _InCluster):
    """The node's startup taint came off: when the node joined, when its agent said hello, when the taint
    went, and whether every required image was present then (`warm`) or the deadline passed (`timeout`)."""

    kind: Literal["warmed"] = "warmed"
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    joined_at: EpochSeconds
    hello_at: EpochSeconds
    warm_at: EpochSeconds
    outcome: Literal["warm", "timeout"]
    missing: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=WARMED_MISSING_MAX, description="images missing at the deadline")
    missing_total: Count = Field(default=0, description="how many were missing, `missing` names the first ones")


class ImageGone(_Message, JobRef):
    """An image this node pulled for a task, and reported Succeeded, is no longer there (kubelet's image
    garbage collection, or someone removed it). `disk` is the agent's disk guard refusal at that moment
    ("" when there is room): the control plane pulls it again only when there is."""

    kind: Literal["gone"] = "gone"
    image: str = Field(min_length=1, max_length=1024)
    seen_at: EpochSeconds
    disk: str = Field(default="", max_length=1024)


class RemovedImage(BaseModel):
    """One image the agent removed, and the bytes that freed (its size as the CRI reported it)."""

    model_config = _MODEL_CONFIG
    image: str = Field(min_length=1, max_length=1024, description="a name the agent had pulled it by")
    image_id: str = Field(min_length=1, max_length=1024)
    bytes_freed: Count
    removed_at: EpochSeconds


# A `Footprint` names at most this many removals; more wait for the next one.
FOOTPRINT_REMOVED_MAX = 50


class Footprint(_Message, _InCluster):
    """What the images Prewarm pulled on the node weigh now (`images`, `bytes`: pulled by the agent and still
    there, pinned or not), the bytes its removals freed since the agent's record began (`freed_bytes`), and
    the removals since the last footprint (`removed`). Sent when any of it changed; the newest `at` wins."""

    kind: Literal["footprint"] = "footprint"
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    at: EpochSeconds
    images: Count
    bytes: Count
    freed_bytes: Count
    removed: list[RemovedImage] = Field(default_factory=list, max_length=FOOTPRINT_REMOVED_MAX)


class Baked(_Message):
    """A warm snapshot's builder (the agent in bake mode) is done: every image pulled through the CRI and
    verified (`digests`: reference -> repo digest, `image_bytes`: their size as the CRI reports it), or
    not (`ok` false, `message` says which image and why). Only builders send it, only to a stack that
    launched them, so readers older than it never see one."""

    kind: Literal["baked"] = "baked"
    warm_snapshot: str = Field(min_length=1, max_length=253)
    bake: str = Field(min_length=1, max_length=300)
    ok: bool
    digests: dict[str, str] = Field(default_factory=dict)
    image_bytes: Count = 0
    message: str = Field(default="", max_length=4096)


class ClusterProbe(_Message, _InCluster):
    """The control plane's own message to itself (on the probe queue, which the status function consumes too),
    sent with a delay while a job of `cluster` is parked: is its API back? Its function GETs the cluster and,
    when it answers, plans the parked jobs again (docs/architecture.md, "Planning never waits on another
    cluster's records"). `chain` is the probe's token:
    only the one the cluster's item names counts, so a duplicate delivery, or a probe anyone else sent, does
    nothing."""

    kind: Literal["probe"] = "probe"
    chain: str = Field(min_length=1, max_length=64)


class ReleaseImage(_Message, _ToNode):
    """A job that had `image` on this node ended and no live job wants it as it did
    (`prewarm.domain.lifecycle`): the agent takes its pin off (`unpin`), and removes it `remove_after`
    seconds later if the agent pulled it and no container uses it then (None: it stays). `job` is the job
    that let it go, for the agent's log."""

    kind: Literal["release"] = "release"
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    job: str = Field(max_length=JOB_KEY_MAX, description="`namespace/name` of the job that ended")
    image: str = Field(min_length=1, max_length=1024, description="the pull reference the job's tasks named")
    unpin: bool = True
    remove_after: int | None = Field(default=None, ge=0, le=10 * 365 * 86_400,
                                     description="seconds until the image is removed; None: kept")


# What the control plane sends on node queues.
NodeBound = PullTask | CancelTask | RequiredImages | ReleaseImage
NodeMessage = Annotated[NodeBound, Field(discriminator="kind")]
# What node agents send on the status queue; builders add `Baked`, the control plane its `ClusterProbe`s.
FromAgent = StatusReport | Hello | Warmed | ImageGone | Footprint
AgentMessage = Annotated[FromAgent | Baked | ClusterProbe, Field(discriminator="kind")]
# What the status function applies (a builder's `Baked` goes to the warm snapshots' bakes).
StatusMessage = FromAgent | ClusterProbe



@cache
def _node_message() -> TypeAdapter[NodeBound]:
    return TypeAdapter(NodeMessage)


@cache
def _agent_message() -> TypeAdapter[FromAgent | Baked | ClusterProbe]:
    return TypeAdapter(AgentMessage)


def parse_node_message(body: str | bytes) -> NodeBound:
    """Parse a node-queue message body, raising `MessageError` naming the field at fault."""
    try:
        return _node_message().validate_json(body)
    except ValidationError as e:
        raise MessageError(f"invalid node message: {describe_validation_error(e, subject='message')}") from None


def parse_agent_message(body: str | bytes) -> FromAgent | Baked | ClusterProbe:
    """Parse a status-queue message body, raising `MessageError` naming the field at fault."""
    try:
        return _agent_message().validate_json(body)
    except ValidationError as e:
        raise MessageError(f"invalid agent message: {describe_validation_error(e, subject='message')}") from None


_SQS_NAME = re.compile(r"[^A-Za-z0-9_-]")
SQS_NAME_MAX = 80


def cluster_queue_prefix(prefix: str, cluster: str = "") -> str:
    """What every node queue of `cluster` is named with first: `<prefix>-` for the stack's own cluster,
    `<prefix>-_<id>_` for a registered one (`id`, 10 hex of the name's SHA-256: EKS names are up to 100
    characters, SQS names 80). A node name (a DNS subdomain) never holds `_`, so neither set of names
    takes the other's and one `ListQueues` prefix lists exactly one cluster's queues.

    >>> cluster_queue_prefix("prewarm"), cluster_queue_prefix("prewarm", "prod-eu")
    ('prewarm-', 'prewarm-_3312b6955a_')
    """
    if not cluster:
        return f"{prefix}-"
    return f"{prefix}-_{hashlib.sha256(cluster.encode()).hexdigest()[:10]}_"


def is_cluster_queue(prefix: str, name: str, cluster: str = "") -> bool:
    """Whether the queue `name` is a node queue of `cluster` (the stack's own: no `_` after the prefix)."""
    head = cluster_queue_prefix(prefix, cluster)
    return name.startswith(head) and (bool(cluster) or "_" not in name[len(head):])


def node_queue_name(prefix: str, node: str, cluster: str = "") -> str:
    """The node's task queue name: `<prefix>-<node>` in SQS's alphabet (`cluster_queue_prefix` first for a
    registered cluster's node), never shared by two nodes.

    >>> node_queue_name("prewarm", "worker-1")
    'prewarm-worker-1'
    >>> node_queue_name("prewarm", "ip-10-0-1-5.ec2.internal")
    'prewarm-ip-10-0-1-5-ec2-internal-9b098656'
    >>> node_queue_name("prewarm", "worker-1", "prod-eu")
    'prewarm-_3312b6955a_worker-1'
    """
    if not prefix or _SQS_NAME.search(prefix):
        raise ValueError(f"queue prefix {prefix!r} must use only letters, digits, '-', '_'")
    if not node:
        raise ValueError("node name must not be empty")
    head = cluster_queue_prefix(prefix, cluster)
    clean = _SQS_NAME.sub("-", node)
    name = f"{head}{clean}"
    if clean == node and len(name) <= SQS_NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    room = SQS_NAME_MAX - len(head) - len(digest) - 1
    if room < 1:
        raise ValueError(f"queue prefix {prefix!r} is too long to leave room for node names")
    return f"{head}{clean[:room]}-{digest}"
