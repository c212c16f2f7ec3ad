"""Node phase transitions, report ordering, job status as Kruise reports it, and retry delays.

Reports from node agents arrive late, twice or out of order (SQS is at-least-once and unordered).
`apply_report` keeps, for each node, the report with the highest precedence, which is a total order:
the final state is the same for any permutation or duplication of the same reports, and a node
never moves backwards within a round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from prewarm.domain.jobs import CompletionPolicy, ImageListPullJob, ImagePullJob, ImagePullJobTemplate, PullPolicy
from prewarm.domain.messages import NodePhase

# Kruise's ImagePullJob status messages, word for word.
NO_PROGRESS_MESSAGE = "job is running, no progress"
COMPLETED_MESSAGE = "job has completed"
DEADLINE_EXCEEDED_MESSAGE = "job exceeds activeDeadlineSeconds"
# kruise-daemon's error when a pull's own deadline has passed.
PULL_DEADLINE_EXCEEDED_MESSAGE = "pulling exceeds the activeDeadlineSeconds"


# Phases in the only order a node may move through them. Among the terminal phases, a later report
# may only correct towards what really happened on the node: a pull that finished despite a cancel,
# or succeeded after the sweep declared the silent node failed, is recorded as Succeeded.
_RANK = {
    NodePhase.WAITING: 0,
    NodePhase.PULLING: 1,
    NodePhase.CANCELLED: 2,
    NodePhase.FAILED: 3,
    NodePhase.SUCCEEDED: 4,
}


class InvalidTransitionError(ValueError):
    """A node phase change that would go backwards."""


def can_transition(current: NodePhase, new: NodePhase) -> bool:
    """Whether a node may move from `current` to `new`; repeating the same phase is allowed.

    Waiting -> Pulling -> Cancelled/Failed/Succeeded, skipping steps allowed; a terminal phase only
    gives way to a truer one (Cancelled -> Failed -> Succeeded), never to Waiting or Pulling.
    """
    return _RANK[new] >= _RANK[current]


def transition(current: NodePhase, new: NodePhase) -> NodePhase:
    """Return `new`, or raise `InvalidTransitionError` when the move would go backwards."""
    if not can_transition(current, new):
        why = f"{current} is final" if current.is_terminal else "phases only move forward"
        raise InvalidTransitionError(f"cannot move a node from {current} to {new}: {why}")
    return new


class ReportKey(NamedTuple):
    """Orders the reports of one node: a new `round` restarts the node; `attempt` and `seq` grow."""

    round: int
    attempt: int
    seq: int


def is_newer(report_key: ReportKey, stored_key: ReportKey) -> bool:
    """Whether a report with `report_key` was sent after the one stored with `stored_key`."""
    return tuple(report_key) > tuple(stored_key)


@dataclass(frozen=True)
class NodeReport:
    """One node's phase as reported (or the last report kept for it)."""

    node: str
    phase: NodePhase
    key: ReportKey
    message: str = ""

    def precedence(self) -> tuple[int, int, int, int, str]:
        """The total order `apply_report` keeps the maximum of.

        A later round wins; within a round the phase order wins (so a delayed Pulling never undoes a
        Succeeded); within a phase the later attempt and seq win (progress updates). The message
        only breaks exact ties, so that the order is total.
        """
        return (self.key.round, _RANK[self.phase], self.key.attempt, self.key.seq, self.message)


def apply_report(stored: NodeReport | None, report: NodeReport) -> NodeReport:
    """The report to keep for a node once `report` arrives: whichever has the higher precedence."""
    if stored is None:
        return report
    if stored.node != report.node:
        raise ValueError(f"report for node {report.node!r} cannot update node {stored.node!r}")
    return report if report.precedence() > stored.precedence() else stored


def fold_reports(reports: Iterable[NodeReport]) -> dict[str, NodeReport]:
    """The report kept for each node after all `reports`, in any order."""
    kept: dict[str, NodeReport] = {}
    for report in reports:
        kept[report.node] = apply_report(kept.get(report.node), report)
    return kept


# --- Job status ----------------------------------------------------------------------------------


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    def to_dict(self) -> dict[str, object]:
        """The status as Kruise serialises it: camelCase, RFC 3339 times, empty optional fields left out."""
        dumped = self.model_dump(by_alias=True, mode="json", exclude_none=True)
        return {key: value for key, value in dumped.items() if value not in ("", [])}


class JobStatus(_Status):
    """An ImagePullJob's status, field for field as Kruise reports it."""

    desired: int = 0
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    failed_nodes: list[str] = []
    start_time: datetime | None = None
    completion_time: datetime | None = None
    message: str = ""

    @property
    def is_complete(self) -> bool:
        return self.completion_time is not None


class FailedImageStatus(_Status):
    """An image of an ImageListPullJob whose ImagePullJob failed on some nodes."""

    image_pull_job: str
    name: str
    message: str


class ImageListPullJobStatus(_Status):
    """An ImageListPullJob's status, as Kruise reports it: counts of its ImagePullJobs."""

    desired: int = 0
    active: int = 0
    completed: int = 0
    succeeded: int = 0
    failed_image_statuses: list[FailedImageStatus] = []
    start_time: datetime | None = None
    completion_time: datetime | None = None

    @property
    def is_complete(self) -> bool:
        return self.completion_time is not None


JobSpecBits = CompletionPolicy | ImagePullJobTemplate | ImagePullJob | ImageListPullJob


def _completion_policy(bits: JobSpecBits) -> CompletionPolicy:
    if isinstance(bits, CompletionPolicy):
        return bits
    if isinstance(bits, ImagePullJobTemplate):
        return bits.completion_policy
    return bits.spec.completion_policy


def progress_message(desired: int, succeeded: int, failed: int, completed: bool) -> str:
    """Kruise's status message: `job has completed`, `... no progress` or `... progress 40.0%`."""
    if completed:
        return COMPLETED_MESSAGE
    if desired == 0:
        return NO_PROGRESS_MESSAGE
    return f"job is running, progress {100.0 * (succeeded + failed) / desired:.1f}%"


def deadline(start_time: datetime, policy: JobSpecBits) -> datetime | None:
    """When an `Always` job with `activeDeadlineSeconds` runs out of time, else None."""
    completion = _completion_policy(policy)
    if completion.type != "Always" or completion.active_deadline_seconds is None:
        return None
    return start_time + timedelta(seconds=completion.active_deadline_seconds)


def expiry(completion_time: datetime, policy: JobSpecBits) -> datetime | None:
    """When a finished job is deleted (`ttlSecondsAfterFinished`), else None."""
    ttl = _completion_policy(policy).ttl_seconds_after_finished
    return None if ttl is None else completion_time + timedelta(seconds=ttl)


def compute_job_status(
    spec: JobSpecBits,
    node_phases: Mapping[str, NodePhase],
    start_time: datetime | None,
    now: datetime,
    previous: JobStatus | None = None,
) -> JobStatus:
    """The job's status from its nodes' phases, as Kruise's ImagePullJob controller computes it.

    `desired` is the number of nodes; Pulling nodes are `active`; Waiting nodes count nowhere yet;
    Cancelled nodes count as failed (the image is not there). An `Always` job completes when every
    node has finished, or fails the unfinished nodes once `activeDeadlineSeconds` has passed since
    `start_time`; a `Never` job never completes. A status that has completed stays as it was.
    """
    if previous is not None and previous.completion_time is not None:
        return previous
    start = start_time or (previous.start_time if previous else None) or now
    completion = _completion_policy(spec)
    by_phase: dict[NodePhase, list[str]] = {phase: [] for phase in NodePhase}
    for node, phase in node_phases.items():
        by_phase[phase].append(node)
    succeeded = len(by_phase[NodePhase.SUCCEEDED])
    failed_nodes = by_phase[NodePhase.FAILED] + by_phase[NodePhase.CANCELLED]
    desired = len(node_phases)
    finished = succeeded + len(failed_nodes) == desired
    ends = deadline(start, completion)
    if not finished and ends is not None and now >= ends:
        failed_nodes += by_phase[NodePhase.PULLING] + by_phase[NodePhase.WAITING]
        return JobStatus(
            desired=desired,
            succeeded=succeeded,
            failed=len(failed_nodes),
            failed_nodes=sorted(failed_nodes),
            start_time=start,
            completion_time=now,
            message=DEADLINE_EXCEEDED_MESSAGE,
        )
    completed = finished and completion.type == "Always"
    return JobStatus(
        desired=desired,
        active=len(by_phase[NodePhase.PULLING]),
        succeeded=succeeded,
        failed=len(failed_nodes),
        failed_nodes=sorted(failed_nodes),
        start_time=start,
        completion_time=now if completed else None,
        message=progress_message(desired, succeeded, len(failed_nodes), completed),
    )


_LISTED_FAILED_NODES = 10


def _failed_image_message(status: JobStatus) -> str:
    nodes = status.failed_nodes[:_LISTED_FAILED_NODES]
    more = len(status.failed_nodes) - len(nodes)
    listed = ", ".join(nodes) + (f" and {more} more" if more > 0 else "")
    return f"failed on {status.failed} of {status.desired} nodes: {listed}"


def aggregate_list_status(
    list_job: ImageListPullJob,
    children: Mapping[str, JobStatus],
    start_time: datetime | None,
    now: datetime,
    previous: ImageListPullJobStatus | None = None,
) -> ImageListPullJobStatus:
    """The ImageListPullJob's status from its children's statuses (`children` keyed by image).

    As Kruise: a child not started yet counts nowhere; a child is `active` while it has pulling
    nodes, `completed` when all its nodes finished, `succeeded` when all succeeded; children with
    failed nodes are listed in `failedImageStatuses`. An `Always` list job completes when every
    image's job has completed; a completed status stays as it was.
    """
    if previous is not None and previous.completion_time is not None:
        return previous
    names = {child.spec.image: child.name for child in list_job.child_jobs()}
    active = completed = succeeded = 0
    failed_images: list[FailedImageStatus] = []
    for image in list_job.spec.images:
        status = children.get(image)
        if status is None or status.start_time is None:
            continue
        active += status.active > 0
        completed += status.desired == status.succeeded + status.failed
        succeeded += status.desired == status.succeeded
        if status.failed > 0:
            failed_images.append(
                FailedImageStatus(image_pull_job=names[image], name=image, message=_failed_image_message(status))
            )
    desired = len(list_job.spec.images)
    done = list_job.spec.completion_policy.type == "Always" and completed == desired
    return ImageListPullJobStatus(
        desired=desired,
        active=active,
        completed=completed,
        succeeded=succeeded,
        failed_image_statuses=failed_images,
        start_time=start_time or (previous.start_time if previous else None) or now,
        completion_time=now if done else None,
    )


# --- Retries -------------------------------------------------------------------------------------

PULL_BACKOFF_INITIAL_SECONDS = 1.0
PULL_BACKOFF_MAX_SECONDS = 30.0
KUBELET_BACKOFF_INITIAL_SECONDS = 10.0
KUBELET_BACKOFF_MAX_SECONDS = 300.0


def _doubling(initial: float, cap: float, steps: int) -> float:
    # Capping the exponent keeps huge step counts from overflowing a float.
    return min(initial * 2.0 ** min(steps, 64), cap)


@dataclass(frozen=True)
class Attempt:
    """One pull attempt: its 1-based `number`, how long it may run, and the sleep if it fails."""

    number: int
    timeout_seconds: float
    backoff_seconds: float


@dataclass(frozen=True)
class RetryPolicy:
    """kruise-daemon's pull loop: `backoffLimit + 1` attempts, sleeps from 1 s doubling to 30 s.

    Each attempt may run `timeout_seconds`, cut to what is left of the deadline; no attempt starts
    once the deadline has passed (the pull then fails with `PULL_DEADLINE_EXCEEDED_MESSAGE`).
    """

    backoff_limit: int = 3
    timeout_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.backoff_limit < 0:
            raise ValueError(f"backoff_limit must be >= 0, got {self.backoff_limit}")
        if self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {self.timeout_seconds}")

    @classmethod
    def from_pull_policy(cls, policy: PullPolicy) -> RetryPolicy:
        """The retry policy of a job's `spec.pullPolicy`."""
        return cls(backoff_limit=policy.backoff_limit, timeout_seconds=float(policy.timeout_seconds))

    @property
    def max_attempts(self) -> int:
        return self.backoff_limit + 1

    def backoff_seconds(self, number: int) -> float:
        """The sleep after attempt `number` fails (Kruise sleeps after the last failure too)."""
        if number < 1:
            raise ValueError(f"attempt numbers start at 1, got {number}")
        return _doubling(PULL_BACKOFF_INITIAL_SECONDS, PULL_BACKOFF_MAX_SECONDS, number - 1)

    def attempt(self, number: int, deadline_remaining: float | None = None) -> Attempt | None:
        """Attempt `number`, or None when attempts are used up or no time is left before the deadline."""
        if number < 1:
            raise ValueError(f"attempt numbers start at 1, got {number}")
        if number > self.max_attempts or (deadline_remaining is not None and deadline_remaining <= 0):
            return None
        timeout = self.timeout_seconds if deadline_remaining is None else min(self.timeout_seconds, deadline_remaining)
        return Attempt(number, timeout, self.backoff_seconds(number))

    def plan(self, deadline_remaining: float | None = None) -> list[Attempt]:
        """Every attempt when each one fails after using its whole timeout (the worst case)."""
        attempts: list[Attempt] = []
        remaining = deadline_remaining
        while (attempt := self.attempt(len(attempts) + 1, remaining)) is not None:
            attempts.append(attempt)
            if remaining is not None:
                remaining -= attempt.timeout_seconds + attempt.backoff_seconds
        return attempts


def kruise_attempt_plan(
    backoff_limit: int, timeout_seconds: float, deadline_remaining: float | None = None
) -> list[Attempt]:
    """The worst-case attempts of kruise-daemon's pull loop (see `RetryPolicy.plan`)."""
    return RetryPolicy(backoff_limit, timeout_seconds).plan(deadline_remaining)


def kubelet_image_backoff(failures: int) -> float:
    """The kubelet's image pull back-off after `failures` failed pulls: 10 s doubling, capped at 300 s."""
    if failures < 0:
        raise ValueError(f"failures must be >= 0, got {failures}")
    if failures == 0:
        return 0.0
    return _doubling(KUBELET_BACKOFF_INITIAL_SECONDS, KUBELET_BACKOFF_MAX_SECONDS, failures - 1)
