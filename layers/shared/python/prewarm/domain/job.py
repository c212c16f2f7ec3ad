"""The job as stored: a job's manifest as applied, its round and plan, its counters and state, and what
they mean together.

Every rule about a stored job is written here once: which plan it needs, whether it is a running
`Never` job, its deadline, when it completes, the pull task a node is sent, how a new spec changes its
round, and when it has finished as `prewarm watch` sees it. Services, the CLI and the job store ask it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.images import parse_image
from prewarm.domain.jobs import CompletionType, ImageListPullJob, ImagePullJob, JobState, job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import CancelTask, PullTask
from prewarm.domain.placement import Platform
from prewarm.domain.sources import Source, source_of
from prewarm.domain.status import COMPLETED_MESSAGE, Counters, NodeTaskRecord

# Fields whose change means a different pull: a new round on every node, not a re-plan.
_PULL_FIELDS = ("image", "imagePullPolicy", "pullPolicy", "pullSecrets", "pullSecretsOnly", "sandboxConfig")

# The table stream plans a job within seconds; one still unplanned after this long lost its record.
UNPLANNED_RETRIGGER_SECONDS = 120


class ApiKind(StrEnum):
    """The kind of a stored job; stored and shown as its value."""

    IMAGE_PULL_JOB = "ImagePullJob"
    IMAGE_LIST_PULL_JOB = "ImageListPullJob"


@dataclass(frozen=True)
class JobRound:
    """Which round of which job a node-item write belongs to, and over how many partitions its node
    items are spread."""

    key: str
    uid: str
    round: int
    shards: int = 1


@dataclass(frozen=True)
class EarlierImage:
    """The image an earlier round of a job pulled (`reference`, pinned or not), which its node items still
    hold until the plan of the current round replaces them: that plan releases it (`services.lifecycle`)."""

    round: int
    reference: str
    pinned: bool = False

    def to_json(self) -> str:
        """As the job item stores it (`earlier`)."""
        return json.dumps({"round": self.round, "reference": self.reference, "pinned": self.pinned})

    @classmethod
    def from_json(cls, text: str | None) -> EarlierImage | None:
        """The stored value back; None for none."""
        return cls(**json.loads(text)) if text else None


@dataclass(frozen=True)
class StoredJob:
    """A job item: the manifest as applied, its round and plan, its status counters and state."""

    namespace: str
    name: str
    uid: str
    api_kind: ApiKind
    manifest: dict[str, Any]
    spec_hash: str
    generation: int = 1
    round: int = 0
    planned: str = ""
    state: JobState = JobState.RUNNING
    counters: Counters = field(default_factory=Counters)
    start_time: float | None = None
    completion_time: float | None = None
    message: str = ""
    ttl: int | None = None
    platforms: list[dict[str, str]] = field(default_factory=list)
    # The image's layer count when known (ECR's manifest, read on a push): a pull's share of its
    # registry's budget (`prewarm.domain.registry_budget`).
    layers: int | None = None
    # Its image's compressed bytes when known (ECR's manifest, read at its plan while its registry's budget
    # counts bytes): a pull's share of a byte budget, and the agents' disk guard.
    image_bytes: int | None = None
    created_at: float | None = None
    version: int = 0
    owner: str = ""
    children: list[str] = field(default_factory=list)
    pull_secret_arns: list[str] = field(default_factory=list)
    # What its last plan adds to its message: named nodes it left out, or that it could not leave out
    # the nodes no agent runs on (the agent DaemonSet unread).
    placement_note: str = ""
    # The round's seed nodes (`prewarm.dev/seed-wave`), chosen at its plan: the rest wait until they finish.
    seeds: list[str] = field(default_factory=list)
    # The round's first ETA (`prewarm.domain.eta.Estimate`, as JSON), kept at its first byte progress.
    first_estimate: str = ""
    # The plan (`plan_id`) that could not be made because the job's cluster could not be read: the job waits,
    # and is planned again as soon as its cluster answers (a later generation or round is another plan).
    parked: str = ""
    # How many partitions the job's node items are spread over, fixed at its first plan (0: not planned).
    shards: int = 0
    deleting_since: float | None = None
    # The registered cluster the job's nodes are in; "" for the stack's own (`prewarm.domain.clusters`).
    cluster: str = DEFAULT_CLUSTER
    # The Region whose ECR replica the job pulls and whose `ECR Replication Action` event it waits for before
    # its plan ("": it waits for none; `prewarm.domain.replication`).
    awaits_replica: str = ""
    # Its image as its namespace's warm budget counted it at apply (`prewarm.domain.warm_budgets`): the digest
    # ("": unknown) and the registry's compressed bytes (None: unknown); and what its message says of the
    # budget (a list job's trimmed images, sizes unknown).
    warm_digest: str = ""
    warm_bytes: int | None = None
    budget_note: str = ""
    # The image of the round its node items are of, when a new spec changed the image (None: the same).
    earlier: EarlierImage | None = None
    # The last round whose tasks went out pinned before a new spec dropped the pin (None: none): a pull of
    # that round still running pins the image as it ends, so its node is told to unpin then (and at the end).
    pinned_until: int | None = None

    # --- identity and plan ------------------------------------------------------------------

    @property
    def key(self) -> JobKey:
        return job_key(self.namespace, self.name, self.cluster)

    def sibling(self, name: str) -> JobKey:
        """The key of another job of this job's namespace and cluster (a list job's child)."""
        return job_key(self.namespace, name, self.cluster)

    @property
    def ref(self) -> JobRound:
        return JobRound(self.key, self.uid, self.round, self.shards or 1)

    @property
    def plan_id(self) -> str:
        """The plan this job's generation and round need; `planned` holds the one made last."""
        return f"{self.generation}.{self.round}"

    @property
    def is_planned(self) -> bool:
        return self.planned == self.plan_id

    @property
    def plan_round(self) -> int | None:
        """The round the last plan was made for (`planned` is `<generation>.<round>`); None before any."""
        round_ = self.planned.partition(".")[2]
        return int(round_) if round_.isdigit() else None

    @property
    def round_is_planned(self) -> bool:
        """Whether the current round has had a plan, perhaps of an earlier generation: a new spec of the
        same round re-plans it (a diff), a new round is planned afresh."""
        return self.plan_round == self.round

    @property
    def is_list_job(self) -> bool:
        return self.api_kind is ApiKind.IMAGE_LIST_PULL_JOB

    @property
    def is_pull_job(self) -> bool:
        return self.api_kind is ApiKind.IMAGE_PULL_JOB

    @property
    def is_dispatching(self) -> bool:
        """A running ImagePullJob whose current round is planned: its nodes are being handed slots."""
        return self.is_pull_job and self.state is JobState.RUNNING and self.is_planned

    @property
    def is_settled(self) -> bool:
        """Nothing of it is in flight or waiting (not dispatching, or its counters hold no `waiting` or
        `active` node): the sweep has nothing to look at among its node items."""
        return not self.is_dispatching or (self.counters.waiting == 0 and self.counters.active == 0)

    def needs_planning(self, previous: StoredJob | None = None) -> bool:
        """Whether this job item, as the table stream shows it, asks for `plan_job`.

        Reports change the counters and a plan fixes the shards before it commits; each such change
        reaches the stream, but only a generation or round not planned yet needs a plan. A change that
        leaves generation, round, plan and state as they were (`previous`, the item's old image) is
        skipped: a plan that crashed is retried through the record that asked for it, which carries the
        same image.
        """
        if not self.is_pull_job or self.state is not JobState.RUNNING or self.awaits_replica:
            return False
        if previous is not None and (previous.generation, previous.round, previous.planned, previous.state,
                                     previous.awaits_replica) == (
            self.generation, self.round, self.planned, self.state, self.awaits_replica
        ):
            return False
        return not self.is_planned

    def deletion_requested(self, previous: StoredJob | None = None) -> bool:
        """Whether this stream image asks the control plane to finish the job's deletion."""
        return self.state is JobState.DELETING and (previous is None or previous.state is not JobState.DELETING)

    # --- spec -------------------------------------------------------------------------------

    @cached_property
    def pull_job(self) -> ImagePullJob:
        """The manifest as an ImagePullJob; a list job raises `TypeError`."""
        job = parse_manifest(self.manifest)
        if not isinstance(job, ImagePullJob):
            raise TypeError(f"job {self.key} is a {self.api_kind}, not an ImagePullJob")
        return job

    @cached_property
    def _job(self) -> ImagePullJob | ImageListPullJob:
        job = self.pull_job if self.is_pull_job else parse_manifest(self.manifest)
        if not isinstance(job, ImagePullJob | ImageListPullJob):
            raise TypeError(f"job {self.key} is stored with a {type(job).__name__} manifest")
        return job

    @property
    def source(self) -> Source:
        """Who applied the job (`prewarm.domain.sources`): the CLI, a resource, a rule."""
        return source_of(self.manifest)

    @property
    def _spec(self) -> Mapping[str, Any]:
        """`spec` as applied (read without parsing the manifest)."""
        spec = self.manifest.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def image(self) -> str:
        """`spec.image` as applied (an ImagePullJob's; "" for a list job): the reference people wrote,
        pinned to the pushed digest for a rule's job."""
        image = self._spec.get("image")
        return image if isinstance(image, str) else ""

    @property
    def images(self) -> list[str]:
        """`spec.images` as applied (an ImageListPullJob's; empty for an ImagePullJob)."""
        return [image for image in self._spec.get("images") or () if isinstance(image, str)]

    @property
    def parallelism(self) -> object:
        """`spec.parallelism` as applied, as people see it listed (a count, or a count's text as Kruise
        takes it); Kruise's default 1 when absent."""
        return self._spec.get("parallelism", 1)

    @property
    def pull_reference(self) -> str:
        """What the nodes pull (`ImageRef.pull_reference`: by digest when the job names one)."""
        return parse_image(self.pull_job.spec.image).pull_reference

    @property
    def completion_type(self) -> CompletionType:
        """`spec.completionPolicy.type` as applied (Kruise's default `Always`)."""
        policy = self._spec.get("completionPolicy") or {}
        return CompletionType(policy.get("type") or CompletionType.ALWAYS)

    @property
    def is_never(self) -> bool:
        """An ImagePullJob that keeps its nodes warm until deleted (`completionPolicy.type: Never`)."""
        return self.is_pull_job and self.completion_type is CompletionType.NEVER

    @property
    def is_running_never(self) -> bool:
        """A planned, running `Never` ImagePullJob: what a new node is added to, and must be warm for."""
        return self.is_never and self.is_dispatching

    @property
    def pull_secret_names(self) -> list[str]:
        """The `spec.pullSecrets` named, as applied (whatever the job's state)."""
        names = self._spec.get("pullSecrets") or ()
        return [name for name in names if isinstance(name, str)]

    @property
    def pull_secrets_only(self) -> bool:
        """`spec.pullSecretsOnly`: the job's pull secrets are the only credentials its pulls may use."""
        return bool(self._spec.get("pullSecretsOnly"))

    def image_platforms(self) -> list[Platform] | None:
        """The platforms of the job's image when known (a pushed index), else None: any node will do."""
        platforms = [Platform(os=p["os"], architecture=p["architecture"], variant=p.get("variant"))
                     for p in self.platforms]
        return platforms or None

    # --- time -------------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """When `activeDeadlineSeconds` runs out, counted from the round's start (None: no deadline)."""
        seconds = self.pull_job.spec.completion_policy.active_deadline_seconds
        if seconds is None or self.start_time is None:
            return None
        return self.start_time + seconds

    def is_past_deadline(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now > deadline

    def is_unplanned_for_long(self, now: float) -> bool:
        """Running and never planned long after it was stored: its stream record was lost."""
        stale = now - (self.created_at or now) > UNPLANNED_RETRIGGER_SECONDS
        return self.state is JobState.RUNNING and not self.is_planned and stale and not self.awaits_replica

    @property
    def is_parked(self) -> bool:
        """Running, and its current plan waits for its cluster to answer."""
        return self.state is JobState.RUNNING and not self.is_planned and self.parked == self.plan_id

    @property
    def asked_again_after_park(self) -> bool:
        """Whether the plan before this one was parked (`replanned` asks again once the cluster answers): this
        one calls the cluster as the probe that saw it answer did."""
        return self.parked == f"{self.generation - 1}.{self.round}"

    def awaits_plan(self, now: float) -> bool:
        """A job asked to plan again once its cluster answers (by the sweep; a parked one also by its cluster's
        probes): parked, whatever its age, or never planned long after it was stored."""
        return self.is_pull_job and (self.is_parked or self.is_unplanned_for_long(now))

    # --- finishing --------------------------------------------------------------------------

    def finish_fields(self, state: JobState, *, at: float, message: str | None = None) -> dict[str, Any]:
        """The job item fields that finish it: state, completion time, the message if given and, when the
        spec asks, the time its item expires (`ttlSecondsAfterFinished`, counted from `at`)."""
        fields: dict[str, Any] = {"state": state, "completion_time": at}
        if message is not None:
            fields["message"] = message
        if (ttl := self._job.spec.completion_policy.ttl_seconds_after_finished) is not None:
            fields["ttl"] = int(at) + ttl
        return fields

    def completion(self, now: float) -> dict[str, Any] | None:
        """The fields that complete an `Always` job whose nodes have all finished (Kruise: succeeded +
        failed = desired), or None while it is not done."""
        if not self.is_dispatching or self.completion_type is not CompletionType.ALWAYS:
            return None
        if self.counters.done < self.counters.desired:
            return None
        return self.finish_fields(JobState.COMPLETED, at=now, message=COMPLETED_MESSAGE)

    def list_completion(self, children: Iterable[StoredJob | None], now: float) -> dict[str, Any] | None:
        """A list job finishes when all its images' jobs have; its own TTL then runs from the last of them.
        `children` are its ImagePullJobs as read (None: gone)."""
        children = list(children)
        if self.state is not JobState.RUNNING or not children:
            return None
        if any(c is not None and c.state is JobState.RUNNING for c in children):
            return None
        done_at = max((c.completion_time or now for c in children if c is not None), default=now)
        return self.finish_fields(JobState.COMPLETED, at=done_at)

    def has_finished_round(self) -> bool:
        """Whether the job has nothing more to do now: completed or failed (`Always`), or its round is
        done on every node (`Never`). List jobs are asked through their children."""
        if self.state.is_finished or self.completion_time is not None:
            return True
        waiting_or_active = self.counters.waiting + self.counters.active
        return self.is_never and self.is_planned and waiting_or_active == 0

    # --- tasks ------------------------------------------------------------------------------

    def pull_task(self, node: str) -> PullTask:
        """What `node` is sent to pull this job's image in its current round."""
        spec = self.pull_job.spec
        sandbox = spec.sandbox_config
        return PullTask(
            job=self.key, job_uid=self.uid, round=self.round, node=node, cluster=self.cluster,
            image=self.pull_reference, image_pull_policy=spec.image_pull_policy,
            timeout_seconds=spec.pull_policy.timeout_seconds, backoff_limit=spec.pull_policy.backoff_limit,
            deadline=self.deadline,
            sandbox_labels=dict(sandbox.labels or {}) if sandbox else {},
            sandbox_annotations=dict(sandbox.annotations or {}) if sandbox else {},
            pull_secret_arns=list(self.pull_secret_arns), pin=self.pull_job.pin, size_bytes=self.image_bytes,
            pull_secrets_only=self.pull_secrets_only, layers=self.layers, shards=self.ref.shards,
        )

    def pull_tasks(self, nodes: Iterable[str]) -> list[PullTask]:
        return [self.pull_task(node) for node in nodes]

    def resend_tasks(self, tasks: Iterable[NodeTaskRecord]) -> list[PullTask]:
        """The tasks of these node items, sent again: each keeps the start its first send reserved."""
        return [self.pull_task(t.node).model_copy(update={"reserved_start": t.starts_at}) for t in tasks]

    def cancel_task(self, node: str, *, round: int, reason: str) -> CancelTask:
        """What `node` is sent to stop pulling this job's image of `round`."""
        return CancelTask(job=self.key, job_uid=self.uid, round=round, node=node, cluster=self.cluster, reason=reason)

    # --- applying a new spec ----------------------------------------------------------------

    def respecified(
        self, manifest: dict[str, Any], spec_hash: str, *, now: float, platforms: list[dict[str, str]] | None,
        layers: int | None = None,
    ) -> StoredJob:
        """The job with a new spec applied: a change of what is pulled (image, pull policy, secrets,
        sandbox config) starts a new round on every node, any other change re-plans the current round.
        A finished job runs again: its completion is cleared and the plan decides anew."""
        new_round = _pull_part(self.manifest) != _pull_part(manifest)
        new_image = self.image != _pull_part(manifest)["image"]
        changed = replace(
            self, manifest=manifest, spec_hash=spec_hash, generation=self.generation + 1,
            round=self.round + 1 if new_round else self.round,
            platforms=self.platforms if platforms is None else platforms,
            # another image's facts are read again (its push gives its layers, its plan the rest)
            layers=layers if layers is not None or new_image else self.layers,
            image_bytes=None if new_image else self.image_bytes,
            earlier=self._earlier_image(changed=new_round and new_image),
        )
        changed = replace(changed, pinned_until=self._pinned_until(changed))
        if not self.state.is_finished:
            return changed
        return replace(
            changed, state=JobState.RUNNING, completion_time=None, message="", ttl=None,
            start_time=now if new_round else self.start_time,
        )

    def _earlier_image(self, *, changed: bool) -> EarlierImage | None:
        """What a new spec leaves on the nodes: the current round's image when the image `changed` and the
        round was planned (its node items hold it), else what was left before (an unplanned round pulled
        nothing)."""
        if changed and self.is_pull_job and self.round_is_planned:
            return EarlierImage(self.round, self.pull_reference, self.pull_job.pin)
        return self.earlier

    def _pinned_until(self, changed: StoredJob) -> int | None:
        """`pinned_until` under the new spec `changed`: this round, when it drops a pin a plan sent out."""
        dropping = self.is_pull_job and self.pull_job.pin and self.round_is_planned
        if (not dropping and self.pinned_until is None) or changed.pull_job.pin:
            return None
        return self.round if dropping else self.pinned_until

    def pinned_in(self, round_: int) -> bool:
        """Whether the nodes of node items of `round_` may hold the image pinned by this job: its image of that
        round was pinned, or a pin dropped since went out with tasks of that round or an earlier one
        (`pinned_until`: a pull of an earlier round may have ended pinned after its report could count)."""
        return self.image_of_round(round_).pinned or self.pinned_until is not None

    def image_of_round(self, round_: int) -> EarlierImage:
        """The image the node items of `round_` pulled: the current spec's, or an earlier round's."""
        if self.earlier is not None and round_ <= self.earlier.round:
            return self.earlier
        return EarlierImage(self.round, self.pull_reference, self.pull_job.pin)

    def replanned(self) -> StoredJob:
        """The same spec at the next generation: the table stream plans it again."""
        return replace(self, generation=self.generation + 1)


def _pull_part(manifest: Mapping[str, Any]) -> dict[str, Any]:
    spec = manifest.get("spec") or {}
    return {k: spec.get(k) for k in _PULL_FIELDS}
