"""A dead agent is visible at once and holds its node for a bounded time, whatever the job's pull timeout;
a node with no agent is shown as such and holds a round no longer than the grace, in every round."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.liveness import AGENT_NOT_REPORTING, NO_AGENT_ON_NODE, REPORT_INTERVAL_SECONDS
from prewarm.domain.messages import Hello, PullTask, StatusReport
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.reports import record_report, register_node
from prewarm.services.schedules import SweepSettings, repull_daily, sweep
from prewarm_agent.running import SHUTDOWN_MESSAGE
from prewarm_cli.output import describe_job
from tests.support.clock import Clock
from tests.support.cluster import make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc

KEY = "default/warm"
# An hour per attempt: the old rule (timeoutSeconds + 300 s) would hold a silent node for 65 minutes.
LONG_PULLS = {"pullPolicy": {"timeoutSeconds": 3600}}
GRACE = 120


def clock_of(plane: ControlPlane) -> Clock:
    assert isinstance(plane.clock, Clock)
    return plane.clock


def nodes(plane: ControlPlane, *names: str, agents: bool = True) -> list[str]:
    """Ready nodes in the cluster; with `agents`, each agent's hello registered."""
    for name in names:
        plane.cluster.nodes.append(make_node(name))
        if not agents:
            plane.agentless.add(name)
        else:
            plane.queues.ensure_queue(name)  # as the agent does before its hello
            register_node(plane.store, plane.queues, None, Hello(node=name), now=plane.now())
    return list(names)


def tasks(plane: ControlPlane, *names: str) -> dict[str, PullTask]:
    sent: dict[str, PullTask] = {}
    for name in names:
        for message in plane.node_messages(name):
            if isinstance(message, PullTask):
                sent[name] = message
    return sent


def run_sweep(plane: ControlPlane, **options: Any) -> Any:
    return sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now(),
                 config=SweepSettings(**{"prefix": "pw", "no_agent_grace_seconds": GRACE, **options}))


def node_line(plane: ControlPlane, node: str) -> str:
    now = plane.now()
    view = view_job(plane.store, "default", "warm", now=now, with_tasks=True, with_agents=True)
    return next(line for line in describe_job(view, now=now).splitlines() if line.strip().startswith(node))


def phase_and_message(plane: ControlPlane, node: str) -> tuple[str, str]:
    task = plane.store.get_task(KEY, node)
    assert task is not None
    return task.phase.value, task.message


def test_describe_shows_how_long_ago_each_node_reported(plane: ControlPlane) -> None:
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    assert "REPORTED" in describe_job(view_job(plane.store, "default", "warm", now=plane.now(), with_tasks=True),
                                      now=plane.now())
    plane.report("warm", n0, "Pulling", bytes_done=10, bytes_total=100)
    clock_of(plane).advance(7)
    assert " 8s ago " in node_line(plane, n0)
    assert AGENT_NOT_REPORTING not in node_line(plane, n0)


def test_a_pulling_node_silent_for_three_report_intervals_shows_agent_not_reporting(plane: ControlPlane) -> None:
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    plane.report("warm", n0, "Pulling", message="10 of 100 bytes after 5s")
    clock_of(plane).advance(3 * REPORT_INTERVAL_SECONDS)

    line = node_line(plane, n0)

    assert f"{AGENT_NOT_REPORTING}; 10 of 100 bytes after 5s" in line
    assert "Pulling" in line


def test_a_silent_pulling_node_gets_its_task_again_then_fails_within_the_bound(plane: ControlPlane) -> None:
    clock = clock_of(plane)
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    first = tasks(plane, n0)[n0]
    plane.report("warm", n0, "Pulling")

    clock.advance(30)
    result = run_sweep(plane)
    assert result.resent == 1 and result.silent_nodes == []
    assert tasks(plane, n0)[n0] == first  # the same task: a restarted agent picks it up, a living one ignores it

    clock.advance(60)  # 92 s of silence: still within the bound
    assert run_sweep(plane).silent_nodes == []
    clock.advance(30)
    result = run_sweep(plane)

    assert result.silent_nodes == [f"{KEY}:{n0}"]
    assert phase_and_message(plane, n0) == ("Failed", AGENT_NOT_REPORTING)
    assert view_job(plane.store, "default", "warm", now=plane.now()).message == "job has completed"


def test_the_silence_bound_is_configurable(plane: ControlPlane) -> None:
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    plane.report("warm", n0, "Pulling")
    clock_of(plane).advance(200)

    assert run_sweep(plane, agent_silence_seconds=300).silent_nodes == []
    assert phase_and_message(plane, n0)[0] == "Pulling"


def test_a_long_pull_with_regular_progress_is_never_failed(plane: ControlPlane) -> None:
    clock = clock_of(plane)
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    tasks(plane, n0)
    for minute in range(45):  # far past 120 s, and past the old timeoutSeconds + 300 s for the first attempt
        for _ in range(12):
            plane.report("warm", n0, "Pulling", bytes_done=minute, bytes_total=100)
            clock.advance(REPORT_INTERVAL_SECONDS - 1)  # each report call ticks the clock a second
        result = run_sweep(plane)
        assert result.silent_nodes == [] and result.resent == 0
    assert tasks(plane, n0) == {}
    assert phase_and_message(plane, n0)[0] == "Pulling"
    assert plane.report("warm", n0, "Succeeded").applied


def test_a_node_without_an_agent_shows_it_and_fails_after_the_grace(plane: ControlPlane) -> None:
    clock = clock_of(plane)
    (n0,) = nodes(plane, "n0")
    (bare,) = nodes(plane, "bare", agents=False)
    apply_manifest(plane.store, job_doc(parallelism=2, **LONG_PULLS), now=plane.now())
    plane.plan("warm")
    # bare has no queue (no agent created one): its task goes when an agent there says hello.
    assert sorted(tasks(plane, n0, bare)) == ["n0"]
    plane.report("warm", n0, "Succeeded")

    assert NO_AGENT_ON_NODE in node_line(plane, bare)
    assert NO_AGENT_ON_NODE not in node_line(plane, n0)
    clock.advance(GRACE - 10)
    assert run_sweep(plane).agentless_nodes == []
    clock.advance(20)
    result = run_sweep(plane)

    assert result.agentless_nodes == [f"{KEY}:bare"]
    assert phase_and_message(plane, bare) == ("Failed", NO_AGENT_ON_NODE)
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert (view.failed_nodes, view.message) == (["bare"], "job has completed")


def test_an_agent_that_says_hello_within_the_grace_pulls_its_task(plane: ControlPlane) -> None:
    clock = clock_of(plane)
    (late,) = nodes(plane, "late", agents=False)
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    clock.advance(GRACE - 30)
    plane.queues.ensure_queue(late)  # the agent starts: its queue, then its hello
    outcome = register_node(plane.store, plane.queues, None, Hello(node=late), now=plane.now())
    assert NO_AGENT_ON_NODE not in node_line(plane, late)
    assert outcome.resent == 1
    assert late in tasks(plane, late)  # sent again at the hello: the first send found no queue

    clock.advance(60)
    assert run_sweep(plane).agentless_nodes == []
    assert plane.report("warm", late, "Succeeded").applied


def test_the_daily_round_treats_a_node_without_an_agent_as_the_first_round_does(plane: ControlPlane) -> None:
    clock = clock_of(plane)
    nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(completionPolicy={"type": "Never"}, **LONG_PULLS), now=plane.now())
    plane.plan("warm")
    plane.report("warm", "n0", "Succeeded")
    nodes(plane, "bare", agents=False)  # joins after the first round was planned: only a hello adds it then
    assert [t.node for t in plane.store.get_tasks(KEY)] == ["n0"]

    assert repull_daily(plane.store) == [KEY]
    plane.plan("warm")
    plane.report("warm", "n0", "Succeeded")
    assert NO_AGENT_ON_NODE in node_line(plane, "bare")
    clock.advance(GRACE + 1)
    assert run_sweep(plane).agentless_nodes == [f"{KEY}:bare"]
    assert phase_and_message(plane, "bare") == ("Failed", NO_AGENT_ON_NODE)

    # A node with no agent from the start: the first round holds it just as long.
    apply_manifest(plane.store, job_doc("other", **LONG_PULLS), now=plane.now())
    plane.plan("other")
    other = "default/other"
    clock.advance(GRACE + 1)
    assert run_sweep(plane).agentless_nodes == [f"{other}:bare"]


def test_a_node_whose_agent_said_hello_may_wait_for_its_pull_slots_past_the_grace(plane: ControlPlane) -> None:
    # Its agent holds the task until one of its pulls ends: that is not silence, and no report comes before.
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(pullPolicy={"timeoutSeconds": 600}), now=plane.now())
    plane.plan("warm")
    clock_of(plane).advance(GRACE * 3)

    result = run_sweep(plane)

    assert result.agentless_nodes == [] and result.silent_nodes == []
    assert phase_and_message(plane, n0)[0] == "Waiting"


def test_a_paused_job_keeps_its_waiting_nodes_without_agents(plane: ControlPlane) -> None:
    nodes(plane, "bare", agents=False)
    apply_manifest(plane.store, job_doc(parallelism=0), now=plane.now())
    plane.plan("warm")
    clock_of(plane).advance(GRACE * 3)

    assert run_sweep(plane).agentless_nodes == []


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_node_is_never_shown_as_silent(plane: ControlPlane, phase: str) -> None:
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(), now=plane.now())
    plane.plan("warm")
    plane.report("warm", n0, phase)
    clock_of(plane).advance(600)

    line = node_line(plane, n0)

    assert AGENT_NOT_REPORTING not in line and NO_AGENT_ON_NODE not in line


def test_get_jobs_and_watch_say_how_many_agents_are_not_reporting(plane: ControlPlane) -> None:
    from prewarm.services.jobs import list_views
    from prewarm_cli.commands.watch import watch_state
    from prewarm_cli.output import jobs_table

    # Given two nodes pulling, one of whose agents goes quiet (killed mid-pull)
    n0, n1 = nodes(plane, "n0", "n1")
    apply_manifest(plane.store, job_doc(parallelism=2, **LONG_PULLS), now=plane.now())
    plane.plan("warm")
    plane.report("warm", n0, "Pulling", bytes_done=10, bytes_total=100)
    plane.report("warm", n1, "Pulling", bytes_done=10, bytes_total=100)
    assert list_views(plane.store, namespace=None, now=plane.now())[0].silent_agents == 0
    clock_of(plane).advance(3 * REPORT_INTERVAL_SECONDS)
    plane.report("warm", n1, "Pulling", bytes_done=20, bytes_total=100)

    # Then `get jobs` says so beside the job's message, and `watch` beside its counts
    now = plane.now()
    (view,) = list_views(plane.store, namespace=None, now=now)
    assert view.silent_agents == 1
    (row,) = [line for line in jobs_table([view], now=now).splitlines() if line.startswith("warm ")]
    assert row.rstrip().endswith("job is running, progress 0.0%; 1 agent not reporting")
    watched = view_job(plane.store, "default", "warm", now=now, with_tasks=True)
    assert watch_state(watched).line().endswith("; 1 agent not reporting")


def test_a_drained_agent_leaves_its_node_pulling_and_the_restarted_agent_finishes_the_job(plane: ControlPlane) -> None:
    # Given a one-node `Always` job whose agent is on its third attempt
    clock = clock_of(plane)
    (n0,) = nodes(plane, "n0")
    apply_manifest(plane.store, job_doc(**LONG_PULLS), now=plane.now())
    plane.plan("warm")
    task = tasks(plane, n0)[n0]
    old_base = int(plane.now() * 1000)

    def send(phase: str, attempt: int, seq: int, message: str = "") -> bool:
        report = StatusReport(job=task.job, job_uid=task.job_uid, round=task.round, node=n0, phase=phase,
                              attempt=attempt, seq=seq, message=message)
        return record_report(plane.store, plane.queues, report, now=plane.now()).applied

    assert send("Pulling", 3, old_base + 40)
    # When the node is drained: the agent's last report, and a restarted agent's run (attempt 1 again)
    assert send("Pulling", 3, old_base + 41, SHUTDOWN_MESSAGE)
    assert view_job(plane.store, "default", "warm", now=plane.now()).completion_time is None
    clock.advance(90)
    new_base = int(plane.now() * 1000)
    for i in range(1, 10):  # progress every 5 s: the node is not silent
        assert send("Pulling", 1, new_base + i)
        clock.advance(REPORT_INTERVAL_SECONDS)
        assert run_sweep(plane).silent_nodes == []
    # Then the restarted agent's Succeeded completes the job with no failed node
    assert send("Succeeded", 1, new_base + 10)
    view = view_job(plane.store, "default", "warm", now=plane.now())
    assert (view.message, view.succeeded, view.failed) == ("job has completed", 1, 0)
