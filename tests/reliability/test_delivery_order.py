"""Every input delivered twice and out of order ends in the state in-order delivery ends in.

SQS and the table stream deliver at least once and in no order. Hypothesis draws deliveries of a
recorded stream of agent reports for two jobs (with attempts, progress, a failure, a direct success),
interleaved with redeliveries of the jobs' stream records, each input at least once; and deliveries of
ECR push events for two rules. The end state must equal in-order delivery's.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prewarm.domain.messages import StatusReport
from prewarm.domain.push import ImagePush
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest
from prewarm.services.push import handle_push
from prewarm.services.reports import record_report, record_reports
from tests.reliability.faults import InjectedFault
from tests.reliability.invariants import assert_invariant, job_state
from tests.reliability.simulation import Plane, moto_aws
from tests.support.manifests import job_doc

WARM, KEEP = "default/warm", "default/keep"
DIGEST = "sha256:" + "c" * 64

# (job, node, phase, attempt, seq, extra fields), as the agents send them for one pull each.
REPORTS: list[tuple[str, str, str, int, int, dict[str, Any]]] = [
    (WARM, "n0", "Pulling", 1, 1, {"bytes_done": 0, "bytes_total": 100}),
    (WARM, "n0", "Pulling", 1, 2, {"bytes_done": 50, "bytes_total": 100}),
    (WARM, "n0", "Succeeded", 1, 3, {"bytes_done": 100, "bytes_total": 100, "image_id": "sha256:" + "1" * 64}),
    (WARM, "n1", "Pulling", 1, 1, {"bytes_done": 0, "bytes_total": 100}),
    (WARM, "n1", "Failed", 1, 2, {"message": "rpc error: code = NotFound desc = manifest unknown"}),
    (WARM, "n2", "Pulling", 1, 1, {"bytes_done": 0, "bytes_total": 100}),
    (WARM, "n2", "Pulling", 2, 2, {"bytes_done": 10, "bytes_total": 100, "message": "retrying after 10s"}),
    (WARM, "n2", "Succeeded", 2, 3, {"bytes_done": 100, "bytes_total": 100, "image_id": "sha256:" + "2" * 64}),
    (KEEP, "n0", "Pulling", 1, 1, {"bytes_done": 0, "bytes_total": 100}),
    (KEEP, "n0", "Succeeded", 1, 2, {"bytes_done": 100, "bytes_total": 100, "image_id": "sha256:" + "3" * 64}),
    (KEEP, "n1", "Succeeded", 1, 1, {"message": "image already present", "image_id": "sha256:" + "3" * 64}),
]
# The table stream delivers each job's record again at any time: `plan_job` runs again.
REPLANS = [f"plan {WARM}", f"plan {KEEP}"]
INPUTS = list(range(len(REPORTS))) + REPLANS


def fresh_plane(ddb: Any, sqs: Any) -> Plane:
    """Both jobs applied and planned: `warm` (3 nodes, 2 at a time) and `keep` (Never, 2 nodes)."""
    plane = Plane(ddb, sqs, "order")
    plane.add_nodes("n0", "n1", "n2", pool="gpu")
    apply_manifest(plane.store, job_doc("warm", parallelism=2), now=plane.clock())
    apply_manifest(plane.store, job_doc("keep", parallelism=2, completionPolicy={"type": "Never"},
                                        selector={"names": ["n0", "n1"]}), now=plane.clock())
    for key in (WARM, KEEP):
        plan_job(plane.store, plane.cluster, plane.queues, key, now=plane.clock())
    return plane


def deliver(plane: Plane, uids: dict[str, str], what: int | str) -> None:
    if isinstance(what, str):
        plan_job(plane.store, plane.cluster, plane.queues, what.removeprefix("plan "), now=plane.clock())
        return
    job, node, phase, attempt, seq, extra = REPORTS[what]
    report = StatusReport.model_validate({"job": job, "job_uid": uids[job], "round": 0, "node": node,
                                          "phase": phase, "attempt": attempt, "seq": seq, **extra})
    record_report(plane.store, plane.queues, report, now=plane.clock())


def comparable(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The state to compare: all of it. A final report owns the byte fields, so even a failed node's
    progress does not depend on whether its last Pulling report arrived before the Failed one."""
    return state


def end_state(order: list[int | str]) -> dict[str, Any]:
    with moto_aws() as (ddb, sqs):
        plane = fresh_plane(ddb, sqs)
        uids = {r.key: r.uid for r in plane.real_store.list_jobs()}
        for what in order:
            deliver(plane, uids, what)
        assert_invariant(plane.real_store, WARM, KEEP)
        return {key: comparable(job_state(plane.real_store, key)) for key in (WARM, KEEP)}


@functools.cache
def in_order_end_state() -> dict[str, Any]:
    return end_state(list(range(len(REPORTS))))


def deliveries() -> st.SearchStrategy[list[int | str]]:
    """Each report once at least, some again, stream redeliveries anywhere, all in any order."""
    extra = st.lists(st.sampled_from(INPUTS), max_size=len(INPUTS))
    return extra.flatmap(lambda again: st.permutations([*range(len(REPORTS)), *again]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=deliveries())
def test_reports_and_stream_records_in_any_order_and_twice_end_as_in_order(order: list[int | str]) -> None:
    # Given the state in-order delivery of the reports ends in
    expected = in_order_end_state()
    # When the same reports, some twice, and redelivered stream records arrive in the drawn order
    got = end_state(order)
    # Then the jobs end in the same state, with the invariant intact (checked in end_state)
    assert got == expected


def test_in_order_delivery_completes_warm_and_keeps_keep_running() -> None:
    # The reference state itself: what the comparisons are against
    state = in_order_end_state()
    assert state[WARM] is not None and state[KEEP] is not None
    assert (state[WARM]["state"], state[WARM]["counters"], state[WARM]["failed_nodes"]) == (
        "Completed", (3, 0, 0, 2, 1), ["n1"])
    assert (state[KEEP]["state"], state[KEEP]["counters"]) == ("Running", (2, 0, 0, 2, 0))


RULES = [
    {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": name},
     "spec": {"repositories": repositories, "template": {"spec": {"parallelism": 3}}}}
    for name, repositories in (("ml", ["ml/*"]), ("all", ["*"]))
]
PUSHES = [
    ImagePush(account="123456789012", region="us-west-2", repository=repository, digest=digest, tag=tag)
    for repository, digest, tag in (("ml/llm", DIGEST, "v1"), ("ml/llm", "sha256:" + "d" * 64, "v2"),
                                    ("web/app", "sha256:" + "e" * 64, "latest"))
]


def jobs_after(pushes: list[int]) -> list[tuple[Any, ...]]:
    with moto_aws() as (ddb, sqs):
        plane = Plane(ddb, sqs, "push")
        for rule in RULES:
            apply_manifest(plane.store, rule, now=1.0)
        for i in pushes:
            handle_push(plane.store, None, PUSHES[i], now=plane.clock())
        return sorted((r.key, r.spec_hash, r.generation, r.round, r.state) for r in plane.real_store.list_jobs())


@functools.cache
def in_order_jobs() -> list[tuple[Any, ...]]:
    return jobs_after(list(range(len(PUSHES))))


@settings(max_examples=15, deadline=None)
@given(order=st.lists(st.sampled_from(range(len(PUSHES))), max_size=3).flatmap(
    lambda again: st.permutations([*range(len(PUSHES)), *again])))
def test_push_events_in_any_order_and_twice_create_each_job_once(order: list[int]) -> None:
    # Given the jobs in-order delivery of the pushes creates (one per matching rule and digest)
    expected = in_order_jobs()
    # When the same events arrive in the drawn order, some twice
    # Then the same jobs exist, each at its first generation
    assert jobs_after(order) == expected
    assert len(expected) == 5 and {generation for _, _, generation, _, _ in expected} == {1}


# --- The batched path: record_status applies a whole SQS batch at once -----------------------------

WRITES = ("update_task", "apply_updates", "claim_tasks", "finish_job")


class CrashOnce:
    """The store, crashing (as a Lambda timeout would) before its n-th write of the named kinds, once."""

    def __init__(self, store: Any, n: int | None) -> None:
        self.store, self.n, self.writes = store, n, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name not in WRITES:
            return attr

        def write(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            if self.writes == self.n:
                raise InjectedFault(f"crash before write {self.n} ({name})")
            return attr(*args, **kwargs)

        return write


def batched_end_state(batches: list[list[int | str]], crash_at: int | None) -> dict[str, Any]:
    with moto_aws() as (ddb, sqs):
        plane = fresh_plane(ddb, sqs)
        uids = {r.key: r.uid for r in plane.real_store.list_jobs()}
        store = CrashOnce(plane.store, crash_at)
        for batch in batches:
            reports = []
            for what in batch:
                if isinstance(what, str):
                    plan_job(plane.store, plane.cluster, plane.queues, what.removeprefix("plan "), now=plane.clock())
                    continue
                job, node, phase, attempt, seq, extra = REPORTS[what]
                reports.append(StatusReport.model_validate({"job": job, "job_uid": uids[job], "round": 0, "node": node,
                                                            "phase": phase, "attempt": attempt, "seq": seq, **extra}))
            try:
                outcome = record_reports(store, plane.queues, reports, now=plane.clock())
            except InjectedFault:
                # The invocation died: Lambda delivers the whole batch again.
                outcome = record_reports(store, plane.queues, reports, now=plane.clock())
            assert not outcome.retry, [o.reason for o in outcome.outcomes if o.retry]
        assert_invariant(plane.real_store, WARM, KEEP)
        return {key: comparable(job_state(plane.real_store, key)) for key in (WARM, KEEP)}


@st.composite
def batched_deliveries(draw: st.DrawFn) -> list[list[int | str]]:
    """The reports (some twice, stream redeliveries anywhere, any order) cut into batches of any size."""
    order = draw(deliveries())
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=4)))
    bounds = [0, *cuts, len(order)]
    return [order[a:b] for a, b in itertools.pairwise(bounds) if order[a:b]]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batched_deliveries(), crash_at=st.one_of(st.none(), st.integers(1, 12)))
def test_batches_of_reports_in_any_order_twice_and_after_a_crash_end_as_in_order(
    batches: list[list[int | str]], crash_at: int | None
) -> None:
    # Given the state in-order delivery of the reports, one at a time, ends in
    expected = in_order_end_state()
    # When the same reports arrive in batches (a node's reports may share one), duplicated and shuffled,
    # and one invocation crashes before one of its writes and its whole batch is delivered again
    got = batched_end_state(batches, crash_at)
    # Then the jobs end in the same state, with exact counters (the invariant is checked in the run)
    assert got == expected


def test_one_batch_of_a_jobs_phase_changes_writes_its_job_item_once() -> None:
    with moto_aws() as (ddb, sqs):
        plane = fresh_plane(ddb, sqs)
        uids = {r.key: r.uid for r in plane.real_store.list_jobs()}
        reports = [StatusReport.model_validate({"job": job, "job_uid": uids[job], "round": 0, "node": node,
                                                "phase": phase, "attempt": attempt, "seq": seq, **extra})
                   for job, node, phase, attempt, seq, extra in REPORTS if job == KEEP or node == "n0"]
        outcome = record_reports(plane.store, plane.queues, reports, now=plane.clock())
    # Two jobs with phase changes in the batch: one counter write each, whatever the number of reports
    assert all(o.applied for o in outcome.outcomes)
    assert outcome.job_writes == 2
