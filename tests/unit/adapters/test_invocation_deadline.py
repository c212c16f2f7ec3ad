"""The deadline of cluster calls (`prewarm.adapters.bounded.InvocationDeadline`): the plans of one stream batch
run side by side, each on its own thread with the deadline it began; the threads an invocation fans out to
share the one it began."""

from __future__ import annotations

import threading

from prewarm.adapters.bounded import InvocationDeadline


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_plan_begun_later_on_another_thread_does_not_extend_this_ones() -> None:
    clock = Clock()
    deadline = InvocationDeadline(most=60, reserve=0, clock=clock)
    deadline.begin()  # this thread's plan: until 1060
    clock.now += 50
    other: list[float | None] = []
    worker = threading.Thread(target=lambda: (deadline.begin(), other.append(deadline.left())))
    worker.start()
    worker.join()
    # The other plan has its 60 s; this one still its last 10
    assert (deadline.left(), other) == (10.0, [60.0])


def test_threads_an_invocation_fans_out_to_share_its_deadline() -> None:
    clock = Clock()
    deadline = InvocationDeadline(most=15, reserve=10, clock=clock)
    assert deadline.left() is None
    deadline.begin(lambda: 30.0)
    seen: list[float | None] = []
    worker = threading.Thread(target=lambda: seen.append(deadline.left()))
    worker.start()
    worker.join()
    assert seen == [15.0]
