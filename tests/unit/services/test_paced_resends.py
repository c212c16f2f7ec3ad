"""A paced task waits in its queue for its start (up to 900 s): the sweep does not take it for lost before
that start plus the grace, and a task sent again keeps the start its first send reserved."""

from __future__ import annotations

import pytest

from prewarm.domain.messages import Hello
from prewarm.domain.registry_budget import RegistryBudget, RegistryBudgets
from prewarm.services.dispatch import plan_job, resend_to_nodes
from prewarm.services.jobs import apply_manifest
from prewarm.services.pacing import PacedQueues
from prewarm.services.ports import StoreRetryableError
from prewarm.services.reports import register_node
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.clock import Clock
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, memory_plane
from tests.support.manifests import job_doc

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
BUDGET_ITEM = ("BUDGET#ecr:123456789012:us-west-2", "BUDGET")
NODES = ("n0", "n1", "n2")
RESEND_AFTER = 300
# An image of unknown layers costs 32 requests (`LAYERS_IF_UNKNOWN`): at 0.08 a second, a start every 400 s.
RATE = 0.08


@pytest.fixture
def plane() -> ControlPlane:
    plane = memory_plane(clock=Clock(1_800_000_000, tick=0))
    plane.sqs.clock = plane.clock  # delays on the plane's clock
    return plane


def paced(plane: ControlPlane) -> PacedQueues:
    """The node queues as the control plane sends to them: paced by the registry's budget."""
    return PacedQueues(plane.queues, plane.store, RegistryBudgets(RegistryBudget(requests_per_second=RATE)),
                       clock=plane.clock)


def start(plane: ControlPlane, nodes: tuple[str, ...] = NODES) -> float:
    """Nodes with agents, one job from ECR with a slot for each: planned, its starts reserved."""
    for name in nodes:
        plane.cluster.nodes.append(make_node(name))
        plane.queues.ensure_queue(name)
        register_node(plane.store, paced(plane), None, Hello(node=name), now=plane.now())
    apply_manifest(plane.store, job_doc(image=f"{ECR}/ml/model:v1", parallelism=len(nodes)), now=plane.now())
    t0 = plane.now()
    plan_job(plane.store, plane.cluster, paced(plane), "default/warm", now=t0)
    return t0


def run_sweep(plane: ControlPlane) -> int:
    result = sweep(plane.store, paced(plane), clusters_of(plane.store), now=plane.now(),
                   config=SweepSettings(prefix="pw", resend_after_seconds=RESEND_AFTER))
    return result.resent


def tat(plane: ControlPlane) -> float:
    item = plane.store.table.get(*BUDGET_ITEM)  # type: ignore[attr-defined]
    assert item is not None
    return float(item["tat"])


def sends(plane: ControlPlane, node: str) -> list[float]:
    """When each task in a node's queue becomes visible; taken off it."""
    queue = plane.sqs.queue(plane.queues.queue_url(node))
    seen = sorted([at for at, _ in queue.delayed] + [plane.now()] * len(queue.bodies))
    queue.delayed.clear()
    queue.bodies.clear()
    return seen


def test_each_paced_start_is_recorded_on_its_node_item(plane: ControlPlane) -> None:
    t0 = start(plane)

    starts = {n: t.starts_at for n in NODES if (t := plane.store.get_task("default/warm", n)) is not None}

    assert starts == {"n0": t0, "n1": t0 + 400, "n2": t0 + 800}
    assert tat(plane) == t0 + 1200


def test_the_sweep_does_not_resend_a_task_waiting_for_its_paced_start(plane: ControlPlane) -> None:
    # Before: a task not picked up 300 s after its claim was sent again, and reserved again each time,
    # though its start was up to 900 s ahead: the budget ran 3 more starts (1,200 s) ahead.
    t0 = start(plane)
    for node in NODES:
        sends(plane, node)
    clock = plane.clock
    assert isinstance(clock, Clock)

    clock.advance(RESEND_AFTER + 60)  # n0's start is past: n0 is late; n1 (at +400) and n2 (+800) are not
    assert run_sweep(plane) == 1
    clock.advance(400)  # +760: n1 late too (a late task is sent again each run, as before)
    assert run_sweep(plane) == 2
    clock.advance(400)  # +1,160: n2 too
    assert run_sweep(plane) == 3

    assert tat(plane) == t0 + 1200  # the re-sends reserved nothing more


def test_a_task_sent_again_before_its_start_is_held_back_to_that_start(plane: ControlPlane) -> None:
    t0 = start(plane)
    for node in NODES:
        sends(plane, node)
    clock = plane.clock
    assert isinstance(clock, Clock)
    clock.advance(100)

    # n2's queue was made again (its first hello's send found none): the task, sent again, keeps its start
    record, task = plane.store.get_job("default/warm"), plane.store.get_task("default/warm", "n2")
    assert record is not None and task is not None
    assert resend_to_nodes(paced(plane), [record], {record.key: {"n2": task}})[0] == {"n2": 1}

    assert sends(plane, "n2") == [t0 + 800]
    assert tat(plane) == t0 + 1200


def test_a_task_held_back_for_want_of_a_start_is_reserved_when_the_sweep_sends_it(plane: ControlPlane) -> None:
    t0 = start(plane, (*NODES, "n3"))  # n3's start (+1,200 s) is beyond SQS's 900 s
    held = plane.store.get_task("default/warm", "n3")
    assert held is not None and held.dispatched_at is not None and held.starts_at is None  # no start within 900 s
    clock = plane.clock
    assert isinstance(clock, Clock)

    clock.advance(RESEND_AFTER + 1)
    run_sweep(plane)

    assert (task := plane.store.get_task("default/warm", "n3")) is not None and task.starts_at == t0 + 1200
    assert tat(plane) == t0 + 1600


def test_a_task_the_budget_holds_back_past_the_silence_limit_is_not_failed_as_silent(plane: ControlPlane) -> None:
    # Before: a held-back task was never sent, yet counted silent from its claim: timeoutSeconds (600) +
    # 300 s later its node failed with "node has not responded", while the budget still held it back.
    nodes = tuple(f"n{i}" for i in range(6))
    t0 = start(plane, nodes)  # starts every 400 s: n0-n2 now, n3 from +300 s, n4 from +700 s, n5 from +1,100 s
    clock = plane.clock
    assert isinstance(clock, Clock)

    for _ in range(20):  # the sweep each minute, to +1,200 s
        clock.advance(60)
        run_sweep(plane)

    tasks = {n: plane.store.get_task("default/warm", n) for n in nodes[3:]}
    assert {n: (t.phase.value, t.starts_at) for n, t in tasks.items() if t is not None} == {
        "n3": ("Waiting", t0 + 1200), "n4": ("Waiting", t0 + 1600), "n5": ("Waiting", t0 + 2000)}
    assert tat(plane) == t0 + 2400


class ThrottledOnce:
    """The table, refusing the first write of pull starts for now, as DynamoDB throttles."""

    def __init__(self, store: object) -> None:
        self.store, self.refused = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def record_pull_starts(self, *args: object, **kwargs: object) -> None:
        if not self.refused:
            self.refused += 1
            raise StoreRetryableError("ThrottlingException: throughput exceeds the current capacity")
        self.store.record_pull_starts(*args, **kwargs)  # type: ignore[attr-defined]


def test_starts_the_table_refuses_for_now_are_written_after_a_backoff_not_lost(plane: ControlPlane) -> None:
    # Before: a refused write of the starts was only logged, so the sweep could send such a task again
    # before its start, and reserve it again.
    for name in NODES:
        plane.cluster.nodes.append(make_node(name))
        plane.queues.ensure_queue(name)
        register_node(plane.store, paced(plane), None, Hello(node=name), now=plane.now())
    apply_manifest(plane.store, job_doc(image=f"{ECR}/ml/model:v1", parallelism=len(NODES)), now=plane.now())
    throttled, slept = ThrottledOnce(plane.store), []
    queues = PacedQueues(plane.queues, throttled, RegistryBudgets(RegistryBudget(requests_per_second=RATE)),  # type: ignore[arg-type]
                         clock=plane.clock, sleep=slept.append)
    t0 = plane.now()
    plan_job(plane.store, plane.cluster, queues, "default/warm", now=t0)
    starts = {n: t.starts_at for n in NODES if (t := plane.store.get_task("default/warm", n)) is not None}
    assert throttled.refused == 1 and len(slept) == 1
    assert starts == {"n0": t0, "n1": t0 + 400, "n2": t0 + 800}
