"""The sweep forgets departed nodes safely and within its run: it lists nodes as metadata only, reads a
departed node again before its queue and registration go (a node that joined after the list keeps
both), deletes queues in parallel, and starts no deletion when the run is short of time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from prewarm.domain.nodes import RegisteredNode
from prewarm.services.budget import TimeBudget, run_within
from prewarm.services.schedules import SweepSettings, sweep
from tests.support.cluster import make_node, recorded_reads
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane


def register(plane: ControlPlane, name: str) -> None:
    """What an agent does on its node: make its queue, say hello."""
    url = plane.queues.ensure_queue(name)
    plane.store.put_node(RegisteredNode(name=name, labels={}, architecture="amd64", os="linux", queue_url=url,
                                        last_hello=plane.now()))


def queue_names(plane: ControlPlane) -> set[str]:
    return set(plane.queues.list_node_queues())


def registered(plane: ControlPlane) -> set[str]:
    return {n.name for n in plane.store.list_nodes()}


def run(plane: ControlPlane, **options: Any) -> Any:
    return sweep(plane.store, plane.queues, clusters_of(plane.store, plane.cluster), now=plane.now(),
                 config=SweepSettings(prefix="pw"), **options)


def test_a_node_that_joins_after_the_node_list_keeps_its_queue_and_registration(plane: ControlPlane) -> None:
    # Given nodes a and b with their queues and registrations, and a node list taken before b joined
    for name in ("a", "b"):
        plane.cluster.nodes.append(make_node(name))
        register(plane, name)
    stale = [make_node("a")]
    plane.cluster.list_nodes = lambda *_, **__: list(stale)  # type: ignore[method-assign]
    # ... and c, which left: its queue and registration remain
    register(plane, "c")

    # When the sweep runs
    result = run(plane)

    # Then b, read again before anything of it is deleted, keeps its queue and registration
    assert plane.queues.queue_name("b") in queue_names(plane) and "b" in registered(plane)
    assert result.nodes_returned == ["b"]
    # ... and only the departed c loses them
    assert result.queues_deleted == [plane.queues.queue_name("c")] and result.nodes_forgotten == ["c"]
    assert queue_names(plane) == {plane.queues.queue_name(n) for n in ("a", "b")}
    assert registered(plane) == {"a", "b"}


def test_a_registration_without_a_queue_is_read_again_too(plane: ControlPlane) -> None:
    plane.cluster.nodes = [make_node("a")]
    for name in ("a", "gone"):
        register(plane, name)
    plane.sqs.delete_queue(plane.queues.queue_url("gone"))
    reads = recorded_reads(plane.cluster, "get_node_metadata")
    result = run(plane)
    assert (result.queues_deleted, result.nodes_forgotten, reads) == ([], ["gone"], ["gone"])


def test_the_sweep_lists_nodes_as_metadata_only(plane: ControlPlane) -> None:
    # Given a cluster whose full node list must not be read by the sweep
    plane.cluster.nodes = [make_node("a")]
    register(plane, "a")
    register(plane, "left")
    calls: list[str] = []
    depth = 0
    for method in ("list_node_metadata", "get_node_metadata", "get_node", "list_nodes"):
        original = getattr(plane.cluster, method)

        def counted(*args: Any, _name: str = method, _original: Callable[..., Any] = original) -> Any:
            nonlocal depth
            if depth == 0:  # the sweep's own calls, not the fake's calls to itself
                calls.append(_name)
            depth += 1
            try:
                return _original(*args)
            finally:
                depth -= 1

        setattr(plane.cluster, method, counted)
    run(plane)
    # Then it asked for the metadata list and read the departed node's metadata, nothing whole
    assert calls == ["list_node_metadata", "get_node_metadata"]


def test_departed_queues_go_in_parallel_and_only_while_the_run_has_time(plane: ControlPlane) -> None:
    # Given 40 departed nodes, and a DeleteQueue that takes 50 ms
    for i in range(40):
        register(plane, f"gone-{i:02d}")
    in_flight, most = 0, 0
    lock = threading.Lock()
    delete = plane.queues.delete_queue

    def slow_delete(url: str) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.05)
        delete(url)
        with lock:
            in_flight -= 1

    plane.queues.delete_queue = slow_delete  # type: ignore[method-assign]
    # ... and a run with 30 s left at first, whose time runs low once 12 deletions have started
    checks = 0

    def time_left() -> float:
        nonlocal checks
        checks += 1
        return 30.0 if checks <= 12 else 9.0

    started = time.monotonic()
    result = run(plane, budget=TimeBudget(time_left, reserve_seconds=10))
    elapsed = time.monotonic() - started

    # Then deletions ran side by side, and none started once less than the reserve was left
    assert most > 1 and elapsed < 40 * 0.05
    assert len(result.queues_deleted) == 12 == len(result.nodes_forgotten)
    assert result.departures_deferred == 28
    # And the next run, with time, deletes the rest
    again = run(plane)
    assert len(again.queues_deleted) == 28 and again.departures_deferred == 0
    assert queue_names(plane) == set() and registered(plane) == set()


def test_a_node_that_cannot_be_read_again_is_kept_for_the_next_run(plane: ControlPlane) -> None:
    from prewarm.services.ports import ClusterUnavailableError

    register(plane, "gone")

    def busy(name: str) -> dict[str, Any] | None:
        raise ClusterUnavailableError("429 TooManyRequests", status=429, reason="TooManyRequests")

    plane.cluster.get_node_metadata = busy  # type: ignore[method-assign]
    result = run(plane)
    assert (result.queues_deleted, result.nodes_forgotten, result.departures_deferred) == ([], [], 1)
    assert registered(plane) == {"gone"}


def test_run_within_stops_starting_after_an_error_and_raises_it() -> None:
    ran: list[int] = []

    def task(i: int) -> None:
        if i == 2:
            raise RuntimeError("DeleteQueue refused")
        time.sleep(0.01)
        ran.append(i)

    with pytest.raises(RuntimeError, match="DeleteQueue refused"):
        run_within(TimeBudget(), [partial(task, i) for i in range(50)], workers=2)
    assert len(ran) < 49
    with pytest.raises(ValueError, match="workers must be at least 1"):
        run_within(TimeBudget(), [], workers=0)
