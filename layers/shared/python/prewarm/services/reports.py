"""Applying agent reports and hellos (the `record_status` function's use cases)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.jobs import JobState
from prewarm.domain.messages import Hello, NodePhase, StatusReport
from prewarm.domain.placement import evaluate_nodes
from prewarm.domain.status import ReportKey, can_transition, is_newer
from prewarm.services.dispatch import add_node_to_job, fill_slots, finish_if_done, image_platforms, job_spec
from prewarm.services.ports import (
    Cluster,
    JobStore,
    RegisteredNode,
    ReportUpdate,
    StoreConflictError,
    TaskQueues,
)

log = logging.getLogger(__name__)

_FAILED = frozenset({NodePhase.FAILED, NodePhase.CANCELLED})


def _accepts(stored: NodePhase, stored_key: ReportKey, new: NodePhase, new_key: ReportKey) -> bool:
    """A report counts if it moves the node forward, or is a newer report of the same running phase.

    The domain's phase order lets a final phase give way only to a truer one (a pull that succeeded
    after the sweep declared the node silent); the same final phase twice is a duplicate.
    """
    if not can_transition(stored, new):
        return False
    if new == stored:
        return not new.is_terminal and is_newer(new_key, stored_key)
    return True


def _counter_deltas(old: NodePhase, new: NodePhase, *, dispatched: bool) -> dict[str, int]:
    """How the job counters move when one node goes from `old` to `new` (Cancelled counts as failed)."""
    deltas: dict[str, int] = {}
    if not dispatched:
        deltas.update(waiting=-1, active=1)
    if not new.is_terminal:
        return deltas
    if not old.is_terminal:
        deltas["active"] = deltas.get("active", 0) - 1
        deltas["done"] = 1
        deltas["succeeded" if new is NodePhase.SUCCEEDED else "failed"] = 1
    elif old in _FAILED and new is NodePhase.SUCCEEDED:
        deltas.update(failed=-1, succeeded=1)
    return deltas


@dataclass
class ReportOutcome:
    applied: bool
    reason: str
    finished_job: bool = False
    phase: str = ""
    seconds: float | None = None


def record_report(
    store: JobStore,
    queues: TaskQueues,
    report: StatusReport,
    *,
    now: float,
) -> ReportOutcome:
    """Applies one report exactly once. Duplicates, stale rounds and backwards moves change nothing."""
    key = report.job
    new_phase = NodePhase(report.phase)
    for _ in range(10):
        record = store.get_job(key)
        if record is None or record.uid != report.job_uid:
            return ReportOutcome(False, "job no longer exists")
        if record.round != report.round:
            return ReportOutcome(False, f"report of round {report.round}, job is in round {record.round}")
        if record.state != JobState.RUNNING:
            return ReportOutcome(False, f"job is {record.state}")
        task = store.get_task(key, report.node)
        if task is None or task.round != report.round:
            return ReportOutcome(False, "node is not part of this round")
        if not _accepts(task.phase, ReportKey(task.round, task.attempt, task.seq), new_phase,
                        ReportKey(report.round, report.attempt, report.seq)):
            if task.phase.is_terminal:
                # A redelivery after a crash past the transaction: finish what that run started.
                fill_slots(store, queues, key, now=now)
                finish_if_done(store, key, now=now)
            return ReportOutcome(False, f"{task.phase.value} -> {new_phase.value} is stale or a duplicate")
        fields: dict[str, Any] = {
            "phase": new_phase.value, "attempt": report.attempt, "seq": report.seq, "updated_at": now,
            "message": report.message,
        }
        for name in ("bytes_done", "bytes_total", "image_id"):
            value = getattr(report, name)
            # A final report says what the node ended with: what it omits is cleared, so the stored
            # state does not depend on whether a late progress report arrived before it.
            if value is not None or new_phase.is_terminal:
                fields[name] = value
        if new_phase is NodePhase.SUCCEEDED and report.size_bytes is not None:
            # A pull too quick for a progress report still says how much it brought.
            fields["bytes_total"] = fields.get("bytes_total") or report.size_bytes
            fields["bytes_done"] = fields.get("bytes_done") or report.size_bytes
        if task.started_at is None:
            fields["started_at"] = report.started_at or now
        deltas = _counter_deltas(task.phase, new_phase, dispatched=task.dispatched_at is not None)
        if task.dispatched_at is None:
            fields["dispatched_at"] = now
        if new_phase.is_terminal:
            fields["finished_at"] = report.finished_at or now
        update = ReportUpdate(
            job_key=key, job_uid=record.uid, node=report.node, expected_version=task.version, round=report.round,
            fields=fields, deltas=deltas,
            add_failed_node=new_phase in _FAILED and task.phase not in _FAILED,
            remove_failed_node=task.phase in _FAILED and new_phase is NodePhase.SUCCEEDED,
        )
        try:
            store.apply_update(update)
        except StoreConflictError:
            continue  # another report for this node, or the job changed: decide again on fresh state
        outcome = ReportOutcome(True, "applied", phase=new_phase.value)
        if new_phase.is_terminal and not task.phase.is_terminal:
            started = task.started_at or report.started_at
            outcome.seconds = (fields["finished_at"] - started) if started else None
            fill_slots(store, queues, key, now=now)
            outcome.finished_job = finish_if_done(store, key, now=now)
        return outcome
    raise StoreConflictError(f"node {report.node} of job {key} kept changing; the report will be retried")


@dataclass
class HelloOutcome:
    node: str
    added_to: list[str] = field(default_factory=list)


def register_node(
    store: JobStore,
    queues: TaskQueues,
    cluster: Cluster | None,
    hello: Hello,
    *,
    now: float,
) -> HelloOutcome:
    """Registers an agent's node and adds it at once to every active `Never` job that selects it."""
    store.put_node(RegisteredNode(name=hello.node, labels=dict(hello.labels), architecture=hello.architecture,
                                  os=hello.os, queue_url=hello.queue_url, last_hello=now))
    outcome = HelloOutcome(hello.node)
    node = cluster.get_node(hello.node) if cluster is not None else None
    if node is None:
        # No cluster access (or not visible yet): the agent's own view of its node stands in.
        node = {
            "metadata": {"name": hello.node, "labels": dict(hello.labels)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    for record in store.list_jobs():
        if record.api_kind != "ImagePullJob" or record.state != JobState.RUNNING or record.planned != record.plan_id:
            continue
        job = job_spec(record)
        if job.spec.completion_policy.type != "Never":
            continue
        pods: list[dict[str, Any]] = []
        if job.spec.pod_selector is not None:
            if cluster is None:
                continue
            pods = cluster.list_pods(record.namespace, label_selector=job.spec.pod_selector.to_query() or None,
                                     field_selector=f"spec.nodeName={hello.node}")
        selection = evaluate_nodes(job.placement, [node], pods, platforms=image_platforms(record))
        if hello.node in selection.selected and add_node_to_job(store, record, hello.node, now=now):
            outcome.added_to.append(record.key)
            fill_slots(store, queues, record.key, now=now)
    return outcome
