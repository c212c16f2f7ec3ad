"""Each local function runs in an execution environment of its own (`sam.environments`): a process, as
Lambda's, started on its first invocation with the function's variables, its lines routed to the stack's
function output before its answer, its errors the invocation's, and gone when the stack ends it."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prewarm_devtools.sam.environments import Environments, FunctionError
from prewarm_devtools.sam.invocation import Function

ECHO = Path(__file__).parents[2] / "support" / "functions" / "echo"


def function(name: str = "echo", reserved: int | None = None, timeout: int = 30) -> Function:
    return Function(logical_id=f"{name.title()}Function", name=name, code_dir=ECHO, handler="app.lambda_handler",
                    env={"GREETING": f"hello from {name}"}, timeout=timeout, memory=128, events={},
                    reserved_concurrency=reserved)


@pytest.fixture
def environments() -> Iterator[tuple[Environments, io.StringIO]]:
    output = io.StringIO()
    started = Environments(output)
    yield started, output
    started.end(grace=1)


def invoke(environments: Environments, fn: Function, event: dict[str, Any]) -> Any:
    return environments.invoke(fn, event, lambda: {**os.environ, **fn.env}, lambda: {
        "code_dir": str(fn.code_dir), "handler": fn.handler, "memory": fn.memory, "timeout": fn.timeout,
        "function_name": fn.name, "region": "us-west-2", "account": "123456789012"})


def test_a_function_runs_in_a_process_of_its_own_with_its_variables_and_its_lines_go_to_the_output(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, output = environments
    # When two functions are invoked, one of them twice
    first = invoke(started, function("one"), {"say": "line of one"})
    again = invoke(started, function("one"), {})
    other = invoke(started, function("two"), {"say": "line of two"})
    # Then each has a process of its own, kept for its next invocations, with its own variables
    assert first["pid"] == again["pid"] != other["pid"] and os.getpid() not in (first["pid"], other["pid"])
    assert (first["greeting"], other["greeting"]) == ("hello from one", "hello from two")
    assert 0 < first["remaining_ms"] <= 30_000
    # and what each printed is in the output, whole lines, before its invocation returned
    assert output.getvalue().splitlines() == ["line of one", "line of two"]


def test_a_handler_error_fails_its_invocation_only_and_a_dead_environment_is_replaced(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, output = environments
    fn = function()
    pid = invoke(started, fn, {})["pid"]
    with pytest.raises(FunctionError, match="echo: ValueError: bad input"):
        invoke(started, fn, {"raise": "bad input"})
    assert "ValueError: bad input" in output.getvalue()  # its traceback, in the function's log
    assert invoke(started, fn, {})["pid"] == pid
    with pytest.raises(FunctionError, match=r"echo: Runtime\.MarshalError: the answer is not JSON"):
        invoke(started, fn, {"not_json": True})
    with pytest.raises(FunctionError, match="echo: its event is not JSON"):
        invoke(started, fn, {"when": object()})
    with pytest.raises(FunctionError, match=r"echo: its environment ended \(exit code 3\)"):
        invoke(started, fn, {"exit": True})
    assert invoke(started, fn, {})["pid"] != pid


def test_concurrent_invocations_of_one_function_run_in_processes_of_their_own_up_to_its_reserved_concurrency(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, _ = environments
    for fn in (function("free"), function("reserved", reserved=1)):
        warm = invoke(started, fn, {})["pid"]
        ran: list[dict[str, Any]] = []
        # Long enough for two cold starts on a loaded machine to overlap the warm one's
        sleep = 1 if fn.reserved_concurrency else 4
        threads = [threading.Thread(target=lambda f=fn, s=sleep, into=ran: into.append(
            invoke(started, f, {"sleep": s}))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        begins, ends = sorted(r["ran"][0] for r in ran), sorted(r["ran"][1] for r in ran)
        pids = {r["pid"] for r in ran}
        if fn.reserved_concurrency is None:  # all three at once, each in its own process, the warm one reused
            assert begins[-1] < ends[0] and len(pids) == 3 and warm in pids, ran
            assert invoke(started, fn, {})["pid"] in pids  # kept warm
        else:  # one at a time, in the one warm process
            assert all(end <= begin for end, begin in zip(ends, begins[1:], strict=False)), ran
            assert pids == {warm}, ran


def test_environments_kept_warm_serve_invocations_at_once_without_a_cold_start(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, _ = environments
    fn = function()
    spec = {"code_dir": str(fn.code_dir), "handler": fn.handler, "memory": fn.memory, "timeout": fn.timeout,
            "function_name": fn.name, "region": "us-west-2", "account": "123456789012"}
    # Given three environments kept warm, as provisioned concurrency (asking again starts none)
    for _ in range(2):
        started.warm(fn, lambda: {**os.environ, **fn.env}, lambda: spec, count=3, wait=True)
    assert len(started.processes(fn)) == started.cold_starts(fn) == 3
    # When three invocations overlap
    ran: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: ran.append(invoke(started, fn, {"sleep": 1}))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then each ran in one of the three, and none was started for them; a fourth at once is a cold start
    assert {r["pid"] for r in ran} == {p.pid for p in started.processes(fn)} and started.cold_starts(fn) == 3
    threads = [threading.Thread(target=lambda: invoke(started, fn, {"sleep": 1})) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert started.cold_starts(fn) == 4


def test_an_invocation_past_the_timeout_is_killed_with_its_environment_and_logged_as_lambda_does(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, output = environments
    fn = function(timeout=1)
    pid = invoke(started, fn, {})["pid"]
    began = time.monotonic()
    with pytest.raises(FunctionError, match=r"echo: Sandbox\.Timedout: Task timed out after 1\.00 seconds"):
        invoke(started, fn, {"sleep": 10})
    assert 1 <= time.monotonic() - began < 8  # killed, not after its 10 s sleep
    assert output.getvalue().splitlines()[-1].endswith("Task timed out after 1.00 seconds")
    assert not started.processes(fn) or started.processes(fn)[0].wait(5) is not None
    assert invoke(started, fn, {})["pid"] != pid  # a cold start


def test_past_the_stacks_limit_an_idle_environment_of_another_function_makes_room() -> None:
    started = Environments(io.StringIO(), limit=2)
    try:
        one, two, three = function("one"), function("two"), function("three")
        invoke(started, one, {})
        (first,) = started.processes(one)
        invoke(started, two, {})
        invoke(started, three, {})  # ends one's, the least recently used
        assert first.wait(5) is not None
        assert len(started.processes(two)) == len(started.processes(three)) == 1
    finally:
        started.end(grace=1)


def test_ending_the_environments_kills_a_stuck_handler_and_fails_its_invocation(
        environments: tuple[Environments, io.StringIO]) -> None:
    started, _ = environments
    fn = function()
    invoke(started, fn, {})
    (process,) = started.processes()
    failures: list[str] = []

    def stuck() -> None:
        try:
            invoke(started, fn, {"sleep": 60})
        except FunctionError as e:
            failures.append(str(e))

    thread = threading.Thread(target=stuck)
    thread.start()
    deadline = time.monotonic() + 10  # until the invocation is inside its environment
    while not any(e._pending for e in list(started._busy)) and time.monotonic() < deadline:
        time.sleep(0.01)
    started.end(grace=0.5)
    thread.join(5)
    assert process.poll() is not None and not started.processes()
    assert failures and "echo: its environment ended" in failures[0]
