"""Shared pulls and the per-node cap (`PullCoordinator`), with scripted calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from prewarm_agent.clock import SystemClock
from prewarm_agent.pulls import Delivery, PullCoordinator, TaskRun
from tests.support.agent import NEVER, FakeCall, make_run, make_task
from tests.support.clock import Clock

KEY = ("registry.example.com/team/app:v1", "anonymous")


def starter(calls: list[FakeCall], outcome: object = NEVER) -> Callable[[], FakeCall]:
    def start() -> FakeCall:
        call = FakeCall(outcome)
        calls.append(call)
        return call

    return start


def test_a_second_run_with_the_same_key_joins_the_running_call() -> None:
    pulls = PullCoordinator(2, Clock())
    calls: list[FakeCall] = []
    first, second = make_run(make_task(job_uid="a")), make_run(make_task(job_uid="b"))

    shared = pulls.join(first, KEY, starter(calls))
    joined = pulls.join(second, KEY, starter(calls))

    assert joined is shared
    assert len(calls) == 1
    assert shared is not None and shared.waiters == {first, second}
    assert pulls.in_flight == 1


def test_other_credentials_get_their_own_call() -> None:
    pulls = PullCoordinator(2, Clock())
    calls: list[FakeCall] = []

    pulls.join(make_run(), KEY, starter(calls))
    pulls.join(make_run(), (KEY[0], "ci#0123456789abcdef"), starter(calls))

    assert len(calls) == 2


def test_the_call_is_cancelled_only_when_its_last_waiter_leaves() -> None:
    pulls = PullCoordinator(2, Clock())
    calls: list[FakeCall] = []
    first, second = make_run(make_task(job_uid="a")), make_run(make_task(job_uid="b"))
    shared = pulls.join(first, KEY, starter(calls))
    pulls.join(second, KEY, starter(calls))
    assert shared is not None

    pulls.leave(shared, first)
    assert not calls[0].cancelled

    pulls.leave(shared, second)
    assert calls[0].cancelled
    assert pulls.in_flight == 0


def test_a_finished_call_frees_its_slot_and_wakes_its_waiters() -> None:
    pulls = PullCoordinator(1, Clock())
    calls: list[FakeCall] = []
    run = make_run()
    pulls.join(run, KEY, starter(calls))
    run.wake.clear()

    calls[0].finish("sha256:" + "a" * 64)

    assert pulls.in_flight == 0
    assert run.wake.is_set()
    assert pulls.running() == []


def test_a_new_call_waits_for_a_slot_until_the_deadline() -> None:
    clock = Clock()
    pulls = PullCoordinator(1, clock)
    calls: list[FakeCall] = []
    pulls.join(make_run(make_task(job_uid="a")), KEY, starter(calls))

    waited = pulls.join(make_run(make_task(job_uid="b")), ("other:v1", "anonymous"), starter(calls), not_after=3.0)

    assert waited is None
    assert len(calls) == 1
    assert clock.monotonic() == pytest.approx(3.0)


def test_queued_runs_get_slots_in_arrival_order() -> None:
    pulls = PullCoordinator(1, SystemClock())
    calls: list[FakeCall] = []
    pulls.join(make_run(make_task(job_uid="first")), KEY, starter(calls))
    order: list[str] = []
    threads = []
    for name in ("second", "third"):
        run = make_run(make_task(job_uid=name))

        def wait_for_slot(run: TaskRun = run, name: str = name) -> None:
            if pulls.join(run, (f"{name}:v1", "anonymous"), starter(calls, outcome="sha256:" + "b" * 64)):
                order.append(name)

        thread = threading.Thread(target=wait_for_slot)
        thread.start()
        threads.append(thread)
        # Let each queue before the next arrives.
        deadline = threading.Event()
        while pulls.waiting < len(threads) and not deadline.wait(0.01):
            pass

    calls[0].finish("sha256:" + "a" * 64)
    for thread in threads:
        thread.join(timeout=5)

    assert order == ["second", "third"]
    assert len(calls) == 3


def test_cancel_wakes_a_run_waiting_for_a_slot() -> None:
    pulls = PullCoordinator(1, SystemClock())
    calls: list[FakeCall] = []
    pulls.join(make_run(make_task(job_uid="a")), KEY, starter(calls))
    waiting = make_run(make_task(job_uid="b"))
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(pulls.join(waiting, ("b:v1", "x"), starter(calls))))
    thread.start()

    waiting.cancel("job deleted")
    thread.join(timeout=5)

    assert result == [None]
    assert len(calls) == 1


def test_close_turns_away_runs_waiting_for_a_slot_and_starts_nothing() -> None:
    pulls = PullCoordinator(1, Clock())
    calls: list[FakeCall] = []
    pulls.close()

    assert pulls.join(make_run(), KEY, starter(calls)) is None
    assert calls == []


def test_reports_of_a_run_carry_its_identity_and_a_rising_seq() -> None:
    run = make_run(make_task(job_uid="u-9", round=4))
    run.begin_attempt(2, 100.0)

    first, second = run.report("Pulling"), run.report("Pulling", bytes_done=10)

    assert (first.job_uid, first.round, first.node, first.attempt, first.started_at) == ("u-9", 4, "node-a", 2, 100.0)
    assert (first.seq, second.seq) == (1, 2)


def test_the_first_cancel_reason_is_kept() -> None:
    run = make_run()

    run.cancel("job deleted")
    run.cancel("agent shutting down", shutdown=True)

    assert (run.cancel_reason, run.shutdown) == ("job deleted", False)


def test_a_fresh_run_numbers_its_reports_from_first_seq_and_a_run_again_from_the_last_report() -> None:
    # A restarted agent's run starts from the clock in ms: above anything the old agent sent.
    fresh = TaskRun(make_task(), Delivery("m-2", "r-2"), first_seq=1_700_000_000_000)
    assert fresh.report("Pulling").seq == 1_700_000_000_001

    again = TaskRun(make_task(), Delivery("m-3", "r-3"), after=fresh.report("Succeeded"), first_seq=5)
    assert again.report("Pulling").seq == 1_700_000_000_003
