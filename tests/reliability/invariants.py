"""The job invariant every reliability scenario ends with, and a comparable snapshot of a job's state.

Invariant, per job: `desired = succeeded + failed + active + waiting`; the node items of the current
round agree with each counter and with `failedNodes`; the stored `done` is `succeeded + failed`
(completion is conditional on it); and once the job is finished no node is left without a final phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prewarm.adapters.dynamodb import DynamoJobStore, job_pk
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord

_FAILED = {NodePhase.FAILED, NodePhase.CANCELLED}
FINISHED_STATES = {"Completed", "Failed"}


def stored_done(store: DynamoJobStore, key: str) -> int:
    """The `done` attribute as stored (the record type derives it, so read the item itself)."""
    item = store.client.get_item(TableName=store.table_name, Key={"pk": {"S": job_pk(key)}, "sk": {"S": "JOB"}},
                                 ConsistentRead=True)["Item"]
    return int(item.get("done", {"N": "0"})["N"])


def invariant_problems(store: DynamoJobStore, key: str) -> list[str]:
    """Every way the job `key` breaks the invariant; [] when it holds or the job is gone."""
    record = store.get_job(key)
    if record is None:
        return [] if not store.get_tasks(key) else [f"{key}: node items outlive the deleted job"]
    tasks = [t for t in store.get_tasks(key) if t.round == record.round]
    c = record.counters
    by_phase = {
        "succeeded": sum(t.phase is NodePhase.SUCCEEDED for t in tasks),
        "failed": sum(t.phase in _FAILED for t in tasks),
        "active": sum(not t.phase.is_terminal and t.dispatched_at is not None for t in tasks),
        "waiting": sum(not t.phase.is_terminal and t.dispatched_at is None for t in tasks),
    }
    problems = []
    if c.desired != c.succeeded + c.failed + c.active + c.waiting:
        problems.append(f"desired {c.desired} != succeeded {c.succeeded} + failed {c.failed} + active {c.active}"
                        f" + waiting {c.waiting}")
    if c.desired != len(tasks):
        problems.append(f"desired {c.desired} but {len(tasks)} node items in round {record.round}")
    for name, count in by_phase.items():
        if getattr(c, name) != count:
            problems.append(f"{name} counter {getattr(c, name)} but {count} node items are {name}")
    failed_nodes = sorted(t.node for t in tasks if t.phase in _FAILED)
    if (shown := sorted(store.failed_nodes(key))) != failed_nodes:
        problems.append(f"failedNodes {shown} but failed node items {failed_nodes}")
    if (done := stored_done(store, key)) != c.succeeded + c.failed:
        problems.append(f"stored done {done} != succeeded + failed {c.succeeded + c.failed}")
    if record.state in FINISHED_STATES and (open_nodes := sorted(t.node for t in tasks if not t.phase.is_terminal)):
        problems.append(f"job is {record.state} but nodes {open_nodes} have no final phase")
    return [f"{key}: {p}" for p in problems]


def assert_invariant(store: DynamoJobStore, *keys: str) -> None:
    problems = [p for key in keys for p in invariant_problems(store, key)]
    assert not problems, "\n".join(problems)


@dataclass(frozen=True)
class NodeState:
    round: int
    phase: str
    dispatched: bool
    attempt: int
    seq: int
    bytes_done: int | None
    bytes_total: int | None
    image_id: str | None
    message: str

    @classmethod
    def of(cls, t: NodeTaskRecord) -> NodeState:
        return cls(t.round, t.phase.value, t.dispatched_at is not None, t.attempt, t.seq, t.bytes_done, t.bytes_total,
                   t.image_id, t.message)


def job_state(store: DynamoJobStore, key: str) -> dict[str, Any] | None:
    """What a user can observe of the job, without ids and timestamps (they differ between runs)."""
    record = store.get_job(key)
    if record is None:
        return None
    c = record.counters
    return {
        "state": record.state,
        "message": record.message,
        "finished": record.completion_time is not None,
        "generation": record.generation,
        "round": record.round,
        "planned": record.planned,
        "counters": (c.desired, c.waiting, c.active, c.succeeded, c.failed),
        "done": stored_done(store, key),
        "failed_nodes": sorted(store.failed_nodes(key)),
        "excluded": sorted((e.name, e.reason) for e in store.get_excluded(key)),
        "nodes": {t.node: NodeState.of(t) for t in store.get_tasks(key)},
    }
