"""The one retry-on-conflict loop and the back-off every retry uses."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from prewarm.domain.retry import Backoff, doubling, retry_on_conflict


class Conflict(Exception):
    pass


class GaveUpError(Exception):
    pass


def refusing(times: int, answer: str = "done") -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            raise Conflict(f"refusal {len(calls)}")
        return answer

    return calls, attempt


def test_an_attempt_refused_by_a_conflict_runs_again_until_it_returns() -> None:
    calls, attempt = refusing(2)
    assert retry_on_conflict(attempt, conflict=Conflict, attempts=3) == "done"
    assert calls == [1, 2, 3]


def test_the_last_refusal_raises_what_exhausted_makes_from_it() -> None:
    calls, attempt = refusing(5)
    with pytest.raises(GaveUpError, match="kept changing") as caught:
        retry_on_conflict(attempt, conflict=Conflict, attempts=3,
                          exhausted=lambda: GaveUpError("kept changing"))
    assert calls == [1, 2, 3]
    assert isinstance(caught.value.__cause__, Conflict) and str(caught.value.__cause__) == "refusal 3"


def test_without_exhausted_the_last_refusal_itself_is_raised() -> None:
    _, attempt = refusing(5)
    with pytest.raises(Conflict, match="refusal 2"):
        retry_on_conflict(attempt, conflict=Conflict, attempts=2)


def test_other_errors_are_not_retried() -> None:
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise ValueError("not a conflict")

    with pytest.raises(ValueError, match="not a conflict"):
        retry_on_conflict(attempt, conflict=Conflict, attempts=5)
    assert calls == [1]


def test_sleeps_follow_the_backoff_between_refusals_only() -> None:
    slept: list[float] = []
    _, attempt = refusing(3)
    retry_on_conflict(attempt, conflict=Conflict, attempts=4, backoff=Backoff(0.5, 1.5),
                      sleep=slept.append)
    assert slept == [0.5, 1.0, 1.5]
    slept.clear()
    _, attempt = refusing(9)
    with pytest.raises(Conflict):
        retry_on_conflict(attempt, conflict=Conflict, attempts=2, backoff=Backoff(0.5, 1.5),
                          sleep=slept.append)
    assert slept == [0.5]  # none after the last refusal


def test_no_backoff_means_trying_again_at_once() -> None:
    slept: list[float] = []
    _, attempt = refusing(2)
    retry_on_conflict(attempt, conflict=Conflict, attempts=3, sleep=slept.append)
    assert slept == []


def test_jittered_delays_stay_below_the_doubling_ceiling() -> None:
    backoff = Backoff(0.05, 2.0, jitter=True, rng=random.Random(7))
    for number in range(1, 12):
        ceiling = doubling(0.05, 2.0, number - 1)
        assert all(0 <= backoff.delay(number) <= ceiling for _ in range(50))
    assert len({backoff.delay(3) for _ in range(20)}) > 1


def test_attempts_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1, got 0"):
        retry_on_conflict(lambda: None, conflict=Conflict, attempts=0)


def test_doubling_is_capped_and_never_overflows() -> None:
    assert [doubling(1, 30, n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert doubling(1, 30, 10**9) == 30
