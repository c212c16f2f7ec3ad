"""Pull starts paced by each registry's budget, shared by every job and cluster of the stack."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from prewarm.domain.messages import CancelTask, PullTask
from prewarm.domain.registry_budget import RegistryBudget, RegistryBudgets
from prewarm.services.pacing import PacedQueues
from prewarm.services.ports import StoreError
from tests.support.memory_queues import MemorySqs, MemoryTaskQueues
from tests.support.memory_store import MemoryJobStore

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
NOW = 1_000.0
STATUS = "https://sqs.us-west-2.amazonaws.com/123456789012/prewarm-status"


def task(node: str, *, image: str = f"{ECR}/team/app:v1", layers: int | None = 8, job: str = "default/a",
         cluster: str = "") -> PullTask:
    return PullTask(job=job, job_uid="u", round=1, node=node, image=image, layers=layers, cluster=cluster)


def paced(budget: RegistryBudget, store: MemoryJobStore | None = None) -> PacedQueues:
    return PacedQueues(MemoryTaskQueues("prewarm", STATUS), store or MemoryJobStore(), RegistryBudgets(budget),
                       clock=lambda: NOW)


def test_one_batch_of_tasks_is_paced_by_its_registry_s_budget_in_one_write() -> None:
    # 10 requests a pull at 20 requests a second: two pulls a second, one second's worth at once
    queues = paced(RegistryBudget(requests_per_second=20, burst_seconds=1.0))

    sent = queues.paced([task(f"n{i}") for i in range(6)])

    # starts at +0, +0, +0.5, +1, +1.5, +2 s: held back by whole seconds, rounded down
    assert [t.delay_seconds for t in sent if isinstance(t, PullTask)] == [0, 0, 0, 1, 1, 2]
    item = queues.budgets.table.get("BUDGET#ecr:123456789012:us-west-2", "BUDGET")  # type: ignore[attr-defined]
    assert item is not None and item["version"] == 1 and item["tat"] == NOW + 3.0


def test_jobs_and_clusters_share_the_registry_s_budget_and_other_registries_have_their_own() -> None:
    store = MemoryJobStore()
    budget = RegistryBudget(requests_per_second=10, burst_seconds=1.0)
    first, second = paced(budget, store), paced(budget, store)  # two Lambda containers, one table

    first.paced([task("n1", job="default/a")])
    (later,) = second.paced([task("n1", job="prod:default/b", cluster="prod")])
    (elsewhere,) = second.paced([task("n2", image="ghcr.io/team/app:v1")])

    assert isinstance(later, PullTask) and later.delay_seconds == 1
    assert isinstance(elsewhere, PullTask) and elsewhere.delay_seconds == 0


def test_unknown_layers_are_costed_as_a_large_image_and_cancels_pass_unchanged() -> None:
    queues = paced(RegistryBudget(requests_per_second=32, burst_seconds=1.0))
    cancel = CancelTask(job="default/a", job_uid="u", round=1, node="n0")

    out = queues.paced([cancel, task("n1", layers=None), task("n2", layers=None)])

    assert out[0] is cancel
    assert [t.delay_seconds for t in out[1:] if isinstance(t, PullTask)] == [0, 1]


def test_no_budget_sends_at_once_and_a_budget_that_cannot_be_written_sends_unpaced() -> None:
    assert [t.delay_seconds for t in paced(RegistryBudget(requests_per_second=0)).paced([task("a"), task("b")])
            if isinstance(t, PullTask)] == [0, 0]

    class Refusing(MemoryJobStore):
        def reserve_pull_starts(self, key: str, costs: Sequence[float], *, now: float,
                                burst_seconds: float, horizon: float | None = None,
                                budget: RegistryBudget | None = None) -> tuple[float, ...]:
            raise StoreError("throttled")

    queues = paced(RegistryBudget(requests_per_second=1), Refusing())
    assert [t.delay_seconds for t in queues.paced([task("a"), task("b")]) if isinstance(t, PullTask)] == [0, 0]


def test_send_many_sends_every_task_with_its_start() -> None:
    inner = MemoryTaskQueues("prewarm", STATUS, sqs=MemorySqs(STATUS.rsplit("/", 1)[0], clock=lambda: NOW))
    queues = PacedQueues(inner, MemoryJobStore(), RegistryBudgets(RegistryBudget(requests_per_second=10)),
                         clock=lambda: NOW)
    for node in ("a", "b", "c"):
        inner.ensure_queue(node)

    assert queues.send_many([task("a"), task("b"), task("c")]) == []
    assert queues.send(task("a")) is True

    # 10 requests a pull at 10 a second: one start a second, each held back to it
    held = {node: (len(q.bodies), [at - NOW for at, _ in q.delayed])
            for node in ("a", "b", "c") if (q := inner.sqs.queue(inner.queue_url(node))) is not None}
    assert held == {"a": (1, [3.0]), "b": (0, [1.0]), "c": (0, [2.0])}


def test_a_task_the_budget_has_no_start_for_within_15_minutes_is_held_back_not_sent_early() -> None:
    # Before: a start 20 minutes away was sent with SQS's longest delay, 900 s, and began 5 minutes early.
    inner = MemoryTaskQueues("prewarm", STATUS, sqs=MemorySqs(STATUS.rsplit("/", 1)[0], clock=lambda: NOW))
    store = MemoryJobStore()
    # 32 requests a pull (30 layers) at 0.08 a second: a start every 400 s
    queues = PacedQueues(inner, store, RegistryBudgets(RegistryBudget(requests_per_second=0.08)), clock=lambda: NOW)
    for node in ("a", "b", "c", "d"):
        inner.ensure_queue(node)

    assert queues.send_many([task(n, layers=30) for n in ("a", "b", "c", "d")]) == []

    delays = {node: [at - NOW for at, _ in q.delayed] + [0.0] * len(q.bodies)
              for node in ("a", "b", "c", "d") if (q := inner.sqs.queue(inner.queue_url(node))) is not None}
    assert delays == {"a": [0.0], "b": [400.0], "c": [800.0], "d": []}  # d: no start within 900 s, not sent
    # ... and it took none of the budget: sent again later (the sweep), it gets the next start
    item = store.table.get("BUDGET#ecr:123456789012:us-west-2", "BUDGET")
    assert item is not None and item["tat"] == NOW + 1200.0
    assert queues.send(task("d", layers=30)) is True  # held back again, as nothing was sent


def test_a_byte_budget_alone_paces_pulls_by_their_size_and_sends_those_of_unknown_size_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Before: requestsPerSecond 0 skipped the registry, and RegistryBytesPerSecond paced nothing.
    store = MemoryJobStore()
    queues = paced(RegistryBudget(requests_per_second=0, bytes_per_second=1000), store)
    sized = [task(f"n{i}").model_copy(update={"size_bytes": 2000}) for i in range(3)]

    sent = queues.paced(sized)

    # 2,000 bytes at 1,000 a second: a start every 2 s
    assert [t.delay_seconds for t in sent if isinstance(t, PullTask)] == [0, 2, 4]
    item = store.table.get("BUDGET#ecr:123456789012:us-west-2", "BUDGET")
    assert item is not None and item["tat"] == NOW + 6.0
    # A task of unknown size takes none of the budget: sent at once, not reserved, and said so
    with caplog.at_level(logging.WARNING, logger="prewarm.services.pacing"):
        unsized = queues.paced([task("n9")])
    assert [t.delay_seconds for t in unsized if isinstance(t, PullTask)] == [0]
    after = store.table.get("BUDGET#ecr:123456789012:us-west-2", "BUDGET")
    assert after is not None and after["tat"] == NOW + 6.0
    assert "counts bytes only: 1 pulls of unknown size start unpaced" in caplog.text
