"""The counting rules: node phase transitions, report ordering, what one report does to its node and to
the job's counters, job status as Kruise reports it, and retry delays.

Reports from node agents arrive late, twice or out of order (SQS is at-least-once and unordered).
`report_change` accepts a report only if it moves its node forward (or is a newer report of the same
running phase), so the final state and the counters are the same for any order or duplication of
the same reports, and a node never moves backwards within a round. `record_status` applies these
rules to a whole batch; this module decides, the job store only writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from prewarm.domain.jobs import PullPolicy
from prewarm.domain.messages import NodePhase
from prewarm.domain.retry import doubling

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


def can_transition(current: NodePhase, new: NodePhase) -> bool:
    """Whether a node may move from `current` to `new`; repeating the same phase is allowed.

    Waiting -> Pulling -> Cancelled/Failed/Succeeded, skipping steps allowed; a terminal phase only
    gives way to a truer one (Cancelled -> Failed -> Succeeded), never to Waiting or Pulling.
    """
    return _RANK[new] >= _RANK[current]


class ReportKey(NamedTuple):
    """Orders the reports of one node: a new `round` restarts the node; `attempt` and `seq` grow."""

    round: int
    attempt: int
    seq: int


def is_newer(report_key: ReportKey, stored_key: ReportKey) -> bool:
    """Whether a report with `report_key` was sent after the one stored with `stored_key`.

    Within a round `seq` alone orders them: it grows with every report of a run, across its attempts,
    and a run of a restarted agent starts it above the old run's (from the clock), while its `attempt`
    starts again at 1.
    """
    return (report_key.round, report_key.seq) > (stored_key.round, stored_key.seq)


# --- Node items and job counters ----------------------------------------------------------------


@dataclass
class NodeTaskRecord:
    """One node's part of one job round, as stored."""

    node: str
    round: int
    phase: NodePhase = NodePhase.WAITING
    dispatched_at: float | None = None
    attempt: int = 0
    seq: int = 0
    version: int = 0
    bytes_done: int | None = None
    bytes_total: int | None = None
    image_id: str | None = None
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float | None = None
    # The start its registry's budget gave its task (`services.pacing`): the node's queue holds the task
    # back until then. `held_at`: when the budget last had no start for it within 15 minutes (not sent).
    starts_at: float | None = None
    held_at: float | None = None

    @property
    def due_at(self) -> float | None:
        """When the node's agent can first take its task: its paced start, else its claim; None: not sent."""
        if self.dispatched_at is None:
            return None
        return self.dispatched_at if self.starts_at is None else max(self.dispatched_at, self.starts_at)

    @property
    def unclaimed_since(self) -> float | None:
        """Since when a task not taken up counts as unanswered: from when it was due, or from its last hold
        by the budget when later (a task held back was never sent)."""
        due = self.due_at
        if due is None or self.held_at is None or self.starts_at is not None:
            return due
        return max(due, self.held_at)

    @property
    def finished(self) -> bool:
        return self.phase.is_terminal

    @property
    def failed(self) -> bool:
        """Failed or Cancelled: the image is not on the node (Kruise lists it in failedNodes)."""
        return self.phase in FAILED_PHASES


@dataclass(frozen=True)
class NodeUpdate:
    """A change to one node item, guarded by the version it was read at."""

    node: str
    expected_version: int
    fields: Mapping[str, Any]


FAILED_PHASES = frozenset({NodePhase.FAILED, NodePhase.CANCELLED})
COUNTERS = ("desired", "waiting", "active", "succeeded", "failed")


@dataclass(frozen=True)
class WaveProgress:
    """Where a job with a seed wave stands: its seeds, and how many have finished and succeeded.

    The rest of the nodes start once every seed has finished, succeeded or failed (after its retries): a
    failed seed only means its domain's other nodes pull from the registry, as they would without waves.
    A seed no longer in the round (deselected, gone) counts as finished, so it holds nothing back.
    """

    seeds: int
    finished: int
    succeeded: int

    @classmethod
    def of(cls, seeds: Sequence[str], tasks: Mapping[str, NodeTaskRecord]) -> WaveProgress:
        """From the seeds' node items of the round (`tasks`, by node)."""
        present = [tasks[s] for s in seeds if s in tasks]
        finished = len(seeds) - len(present) + sum(1 for t in present if t.finished)
        return cls(len(seeds), finished, sum(1 for t in present if t.phase is NodePhase.SUCCEEDED))

    @property
    def seeded(self) -> bool:
        """Whether the rest of the nodes may start."""
        return self.finished >= self.seeds

    def __str__(self) -> str:
        if not self.seeded:
            return f"seed wave: {self.finished}/{self.seeds} seeds finished"
        return f"rest: {self.succeeded}/{self.seeds} seeds succeeded"


@dataclass
class Counters:
    """A job round's counters: `desired = waiting + active + succeeded + failed` always holds.

    `waiting` nodes have no slot yet; `active` ones were dispatched and have not finished; `failed`
    counts Failed and Cancelled nodes (the image is not there). `done = succeeded + failed` is stored
    too, so that completion is one condition (`done = desired`).
    """

    desired: int = 0
    waiting: int = 0
    active: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @classmethod
    def of(cls, tasks: Iterable[NodeTaskRecord]) -> Counters:
        c = cls()
        for t in tasks:
            c.desired += 1
            if t.phase is NodePhase.SUCCEEDED:
                c.succeeded += 1
            elif t.phase.is_terminal:
                c.failed += 1
            elif t.dispatched_at is None:
                c.waiting += 1
            else:
                c.active += 1
        return c


def accepts(stored: NodePhase, stored_key: ReportKey, new: NodePhase, new_key: ReportKey) -> bool:
    """A report counts if it moves the node forward, or is a newer report of the same running phase.

    The phase order lets a final phase give way only to a truer one (a pull that succeeded after the
    sweep declared the node silent); the same final phase twice is a duplicate, unless the second
    comes from a later attempt: the node pulled again after its image was removed (`healing`).
    """
    if not can_transition(stored, new):
        return False
    if new == stored:
        if new.is_terminal:
            return new_key.round == stored_key.round and new_key.attempt > stored_key.attempt
        return is_newer(new_key, stored_key)
    return True


def counter_deltas(old: NodePhase, new: NodePhase, *, dispatched: bool) -> dict[str, int]:
    """How the job counters move when one node goes from `old` to `new` (Cancelled counts as failed).

    A report from a node that was never dispatched (its task was claimed by a crashed run, or the
    agent picked up a re-sent task) moves it from waiting to active first, unless it is already counted
    in a final counter (the deadline cancels waiting nodes too).
    """
    deltas: dict[str, int] = {}
    if not dispatched and not old.is_terminal:
        deltas.update(waiting=-1, active=1)
    if not new.is_terminal:
        return deltas
    if not old.is_terminal:
        deltas["active"] = deltas.get("active", 0) - 1
        deltas["done"] = 1
        deltas["succeeded" if new is NodePhase.SUCCEEDED else "failed"] = 1
    elif old in FAILED_PHASES and new is NodePhase.SUCCEEDED:
        deltas.update(failed=-1, succeeded=1)
    return deltas


def removal_deltas(task: NodeTaskRecord) -> dict[str, int]:
    """How the job counters move when a node leaves the round (deselected by an edit)."""
    counter = (
        "succeeded" if task.phase is NodePhase.SUCCEEDED
        else "failed" if task.phase.is_terminal
        else "waiting" if task.dispatched_at is None
        else "active"
    )
    deltas = {"desired": -1, counter: -1}
    if counter in {"succeeded", "failed"}:
        deltas["done"] = -1
    return deltas


class Report(Protocol):
    """What the counting rules read of an agent's status report (`messages.StatusReport`)."""

    @property
    def round(self) -> int: ...
    @property
    def phase(self) -> NodePhase: ...
    @property
    def attempt(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def message(self) -> str: ...
    @property
    def bytes_done(self) -> int | None: ...
    @property
    def bytes_total(self) -> int | None: ...
    @property
    def image_id(self) -> str | None: ...
    @property
    def size_bytes(self) -> int | None: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def finished_at(self) -> float | None: ...


@dataclass(frozen=True)
class NodeChange:
    """What one accepted report does: the node item's new fields, and the job counters' deltas.

    A change with no deltas (progress within Pulling) touches only the node item; only a change with
    deltas has to be written together with the job item.
    """

    node: str
    phase: NodePhase
    fields: Mapping[str, Any]
    deltas: Mapping[str, int]
    finished: bool = False
    seconds: float | None = None

    @property
    def counts(self) -> bool:
        return any(self.deltas.values())


def precedence(report: Report) -> tuple[int, int, int, int]:
    """Sorting a node's reports by this applies them forwards: fewer are refused as stale."""
    return (report.round, _RANK[report.phase], report.attempt, report.seq)


def report_change(task: NodeTaskRecord, report: Report, *, now: float) -> NodeChange | None:
    """The change `report` makes to its node's stored `task`, or None when it is stale or a duplicate.

    The report must already belong to the task's round. A final report says what the node ended with:
    byte fields it omits are cleared, so the stored state does not depend on whether a late progress
    report arrived first.
    """
    new = report.phase
    if not accepts(task.phase, ReportKey(task.round, task.attempt, task.seq), new,
                   ReportKey(report.round, report.attempt, report.seq)):
        return None
    fields: dict[str, Any] = {
        "phase": new.value, "attempt": report.attempt, "seq": report.seq, "updated_at": now, "message": report.message,
    }
    for name in ("bytes_done", "bytes_total", "image_id"):
        value = getattr(report, name)
        if value is not None or new.is_terminal:
            fields[name] = value
    if new is NodePhase.SUCCEEDED and report.size_bytes is not None:
        # A pull too quick for a progress report still says how much it brought.
        fields["bytes_total"] = fields.get("bytes_total") or report.size_bytes
        fields["bytes_done"] = fields.get("bytes_done") or report.size_bytes
    if task.started_at is None:
        fields["started_at"] = report.started_at or now
    if task.dispatched_at is None:
        fields["dispatched_at"] = now
    finished = new.is_terminal and not task.phase.is_terminal
    seconds = None
    if new.is_terminal:
        fields["finished_at"] = report.finished_at or now
        started = task.started_at or report.started_at
        seconds = fields["finished_at"] - started if finished and started else None
    deltas = counter_deltas(task.phase, new, dispatched=task.dispatched_at is not None)
    return NodeChange(node=task.node, phase=new, fields=fields, deltas=deltas, finished=finished, seconds=seconds)


def applied(task: NodeTaskRecord, change: NodeChange) -> NodeTaskRecord:
    """The task as it is once `change` is written (the next report of the same batch is judged on it)."""
    known = {f.name for f in dataclass_fields(NodeTaskRecord)}
    values: dict[str, Any] = {k: (NodePhase(v) if k == "phase" else v) for k, v in change.fields.items() if k in known}
    return replace(task, **values)


def merged(changes: Sequence[NodeChange]) -> NodeChange:
    """One node's successive changes in a batch as one write: the last fields win, deltas add up."""
    fields: dict[str, Any] = {}
    deltas: dict[str, int] = {}
    for change in changes:
        fields.update(change.fields)
        for name, delta in change.deltas.items():
            deltas[name] = deltas.get(name, 0) + delta
    last = changes[-1]
    seconds = next((c.seconds for c in changes if c.seconds is not None), None)
    return NodeChange(node=last.node, phase=last.phase, fields=fields,
                      deltas={k: v for k, v in deltas.items() if v}, finished=any(c.finished for c in changes),
                      seconds=seconds)


def job_bytes(tasks: Iterable[NodeTaskRecord]) -> tuple[int, int]:
    """Bytes pulled and bytes to pull over a job's nodes, computed when the job is viewed.

    Progress reports write only their node's item, so job-level progress is never stored: storing it
    would put every progress report of the fleet on the job item.
    """
    done = total = 0
    for t in tasks:
        if t.bytes_total:  # a node that has not said how big the image is counts in neither
            done += min(t.bytes_done or 0, t.bytes_total)
            total += t.bytes_total
    return done, total


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


def progress_message(desired: int, succeeded: int, failed: int, completed: bool) -> str:
    """Kruise's status message: `job has completed`, `... no progress` or `... progress 40.0%`."""
    if completed:
        return COMPLETED_MESSAGE
    if desired == 0:
        return NO_PROGRESS_MESSAGE
    return f"job is running, progress {100.0 * (succeeded + failed) / desired:.1f}%"


# --- Retries -------------------------------------------------------------------------------------

PULL_BACKOFF_INITIAL_SECONDS = 1.0
PULL_BACKOFF_MAX_SECONDS = 30.0


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
        return doubling(PULL_BACKOFF_INITIAL_SECONDS, PULL_BACKOFF_MAX_SECONDS, number - 1)

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


