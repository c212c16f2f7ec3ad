"""The agent with slow pulls (a throttling proxy in front of the registry): byte progress, cancellation
that stops containerd's download, timeouts with retries, the per-node cap, shared pulls, visibility
heartbeats and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from prewarm.domain.messages import StatusReport
from prewarm.domain.status import PULL_DEADLINE_EXCEEDED_MESSAGE
from prewarm_agent.cri.client import ContentStatusReader, CriImageClient
from prewarm_agent.running import SHUTDOWN_MESSAGE
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.node.throttle import ConnectionRecord, ThrottlingProxy
from prewarm_devtools.pytest_plugins.node import OciImageFactory
from tests.support.agent_harness import AgentHarness
from tests.support.waiting import busiest

pytestmark = [pytest.mark.node, pytest.mark.integration]

Agents = Callable[..., AgentHarness]
MIB = 1024 * 1024


@pytest.fixture
def slow_link(node_runtime: PrivateContainerd, throttled_registry: ThrottlingProxy) -> ThrottlingProxy:
    """The registry at 1 MiB/s (change with `set_rate`), served to containerd and the agent by hosts.toml."""
    node_runtime.add_registry_mirror(throttled_registry.host, throttled_registry.url)
    return throttled_registry


# More than any manifest or config: a connection that carried this much was downloading a layer.
LAYER_BYTES = 100_000


def _layer_connections(proxy: ThrottlingProxy) -> list[ConnectionRecord]:
    return [c for c in proxy.connections() if c.bytes_to_client > LAYER_BYTES]


def _downloading(proxy: ThrottlingProxy) -> list[ConnectionRecord]:
    """Open connections that carried layer bytes (idle keep-alive ones may stay open)."""
    return [c for c in _layer_connections(proxy) if c.open]


def _with_bytes(reports: list[StatusReport]) -> list[StatusReport]:
    return [r for r in reports if r.phase == "Pulling" and r.bytes_done]


def _monotonic(wall: float) -> float:
    """A `time.time()` value on the `time.monotonic()` clock (the proxy records monotonic times)."""
    return wall - (time.time() - time.monotonic())


def test_progress_reports_grow_towards_the_layers_size(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given a 6 MiB layer at 2 MiB/s and progress every half second
    slow_link.set_rate(2 * MIB)
    image = oci_image_factory.push(registry, "slow/progress", size_mb=6).with_host(slow_link.host)
    agent = agents(PROGRESS_INTERVAL_SECONDS="0.5")
    task = agent.task(image.reference)

    # When it is pulled
    agent.send(task)
    final = agent.final(task)

    # Then Pulling reports carried growing byte counts of the known total, with rising seq
    reports = agent.reports(task)
    progress = _with_bytes(reports)
    assert len(progress) >= 3, reports
    done = [r.bytes_done or 0 for r in progress]
    assert done == sorted(done) and len(set(done)) >= 3
    assert {r.bytes_total for r in progress} == {image.layer_sizes[0]}
    assert done[-1] <= image.layer_sizes[0]
    assert [r.seq - reports[0].seq for r in reports] == list(range(len(reports)))
    assert all(r.attempt == 1 and r.started_at == final.started_at for r in reports)
    assert progress[0].message.endswith("s") and " of " in progress[0].message
    assert final.phase == "Succeeded"
    assert final.bytes_done == final.bytes_total == image.layer_sizes[0]


def test_two_pulls_at_once_each_count_only_their_own_layers(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given two images of different sizes pulled at the same time over one 3 MiB/s link
    slow_link.set_rate(3 * MIB)
    small = oci_image_factory.push(registry, "slow/small", size_mb=3).with_host(slow_link.host)
    large = oci_image_factory.push(registry, "slow/large", size_mb=5).with_host(slow_link.host)
    agent = agents(PROGRESS_INTERVAL_SECONDS="0.4")
    tasks = [agent.task(small.reference), agent.task(large.reference)]

    # When both run
    for task in tasks:
        agent.send(task)
    finals = [agent.final(task) for task in tasks]

    # Then each task's progress is measured against its own manifest's layers
    assert [f.phase for f in finals] == ["Succeeded", "Succeeded"]
    for task, image in zip(tasks, (small, large), strict=True):
        progress = _with_bytes(agent.reports(task))
        assert progress, f"no byte progress for {image.reference}"
        assert {r.bytes_total for r in progress} == {image.layer_sizes[0]}
        assert all((r.bytes_done or 0) <= image.layer_sizes[0] for r in progress)


def test_cancel_stops_containerds_download_within_two_seconds(
    agents: Agents,
    registry: LocalRegistry,
    slow_link: ThrottlingProxy,
    oci_image_factory: OciImageFactory,
    node_runtime: PrivateContainerd,
    cri: CriImageClient,
) -> None:
    # Given a 16 MiB pull at 1 MiB/s that has started writing bytes
    image = oci_image_factory.push(registry, "slow/cancel", size_mb=16).with_host(slow_link.host)
    layer_ref = f"layer-{image.layer_digests[0]}"
    agent = agents()
    task = agent.task(image.reference)
    agent.send(task)
    agent.wait_for(task, lambda rs: bool(_with_bytes(rs)), timeout=15)

    # When the control plane cancels it
    sent_at = time.monotonic()
    agent.cancel(task, reason="job deleted")
    final = agent.final(task, timeout=10)

    # Then it reports Cancelled with the reason ...
    assert (final.phase, final.message) == ("Cancelled", "job deleted")
    # ... containerd hung up on the registry within 2 s of the cancel being sent ...
    assert slow_link.wait_for(lambda proxy: not busiest(proxy).open, timeout=3)
    connection = busiest(slow_link)
    assert connection.closed_by == "client"
    assert connection.upstream_closed_at is not None and connection.upstream_closed_at - sent_at < 2
    # ... its ingest stopped growing and no bytes flow any more ...
    with ContentStatusReader(str(node_runtime.socket_path)) as ingests:
        status = ingests.status(layer_ref)
        forwarded = slow_link.bytes_to_client
        time.sleep(1)
        again = ingests.status(layer_ref)
    # (containerd may also drop the abandoned ingest altogether)
    assert again is None or (status is not None and again.offset == status.offset)
    assert slow_link.bytes_to_client == forwarded < 16 * MIB
    assert cri.image_status(image.reference) is None
    # ... and both the task and the cancel messages are deleted
    deadline = time.monotonic() + 5
    while agent.queue_depth() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agent.queue_depth() == (0, 0)


def test_timeouts_are_retried_with_backoff_then_fail(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given a pull that cannot finish in 1 s, with one retry allowed
    image = oci_image_factory.push(registry, "slow/timeout", size_mb=16).with_host(slow_link.host)
    agent = agents()
    task = agent.task(image.reference, timeout_seconds=1, backoff_limit=1)

    # When it runs
    agent.send(task)
    final = agent.final(task, timeout=20)

    # Then two attempts of 1 s each, 1 s apart, then Failed with the timeout
    assert final.phase == "Failed"
    assert final.attempt == 2
    assert final.message == f"pulling image {image.reference} timed out after 1s"
    starts = [r for r in agent.reports(task) if r.phase == "Pulling" and r.bytes_done is None and not r.message]
    assert [r.attempt for r in starts] == [1, 2]
    assert final.started_at is not None and final.finished_at is not None
    assert 2.9 <= final.finished_at - final.started_at < 6
    # ... each timed-out attempt cancelled its call: containerd hung up both layer downloads
    assert agent.metric("prewarm_agent_pull_calls_total") == 2
    assert slow_link.wait_for(lambda proxy: not any(_downloading(proxy)), timeout=3)
    assert [c.closed_by for c in _layer_connections(slow_link)] == ["client", "client"]


def test_the_task_deadline_cuts_the_attempt_short(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "slow/deadline", size_mb=16).with_host(slow_link.host)
    agent = agents()
    task = agent.task(image.reference, timeout_seconds=600, backoff_limit=3, deadline=time.time() + 1.5)

    agent.send(task)

    final = agent.final(task, timeout=15)
    assert final.phase == "Failed"
    assert final.message.startswith(PULL_DEADLINE_EXCEEDED_MESSAGE + "; last error: pulling image ")
    assert final.attempt == 1
    assert final.finished_at is not None and final.finished_at <= (task.deadline or 0) + 1.5


def test_the_per_node_cap_makes_a_second_pull_wait_for_a_slot(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given an agent allowed one pull at a time and two different images of 2 MiB at 2 MiB/s
    slow_link.set_rate(2 * MIB)
    first = oci_image_factory.push(registry, "slow/cap-a", size_mb=2).with_host(slow_link.host)
    second = oci_image_factory.push(registry, "slow/cap-b", size_mb=2).with_host(slow_link.host)
    agent = agents(MAX_CONCURRENT_PULLS="1")
    tasks = [agent.task(first.reference), agent.task(second.reference)]

    # When both tasks arrive together
    for task in tasks:
        agent.send(task)
    in_flight = []
    while not all(any(r.phase == "Succeeded" for r in agent.reports(t)) for t in tasks):
        in_flight.append(agent.metric("prewarm_agent_pulls_in_flight"))
        time.sleep(0.05)

    # Then never more than one pull ran, and the second started after the first finished
    assert max(in_flight) == 1
    finals = sorted((agent.final(t) for t in tasks), key=lambda r: r.started_at or 0)
    assert finals[1].started_at is not None and finals[0].finished_at is not None
    assert finals[1].started_at >= finals[0].finished_at - 0.05


def test_identical_requests_share_one_pull(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given two jobs asking for the same image at the same time
    slow_link.set_rate(2 * MIB)
    image = oci_image_factory.push(registry, "slow/shared", size_mb=3).with_host(slow_link.host)
    agent = agents()
    tasks = [agent.task(image.reference), agent.task(image.reference)]

    for task in tasks:
        agent.send(task)
    finals = [agent.final(task) for task in tasks]

    # Then both succeed with the same image from a single PullImage call
    assert [f.phase for f in finals] == ["Succeeded", "Succeeded"]
    assert finals[0].image_id == finals[1].image_id == image.config_digest
    assert agent.metric("prewarm_agent_pull_calls_total") == 1


def test_a_duplicate_message_of_a_running_task_joins_it(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    slow_link.set_rate(2 * MIB)
    image = oci_image_factory.push(registry, "slow/duplicate", size_mb=3).with_host(slow_link.host)
    agent = agents()
    task = agent.task(image.reference)
    agent.send(task)
    agent.wait_for(task, lambda rs: any(r.phase == "Pulling" for r in rs), timeout=10)

    agent.send(task)
    agent.final(task)

    time.sleep(0.5)
    assert [r.phase for r in agent.reports(task)].count("Succeeded") == 1
    assert agent.metric("prewarm_agent_messages_received_total", kind="duplicate") == 1
    assert agent.metric("prewarm_agent_pull_calls_total") == 1
    assert agent.queue_depth() == (0, 0)


def test_heartbeats_keep_a_long_pull_invisible(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given a 3 s visibility timeout and a pull of about 6 s
    image = oci_image_factory.push(registry, "slow/heartbeat", size_mb=6).with_host(slow_link.host)
    agent = agents(NODE_QUEUE_VISIBILITY_SECONDS="3")
    task = agent.task(image.reference)

    # When it runs
    agent.send(task)
    final = agent.final(task, timeout=20)

    # Then the message never came back while it ran: one receive, one pull, then deleted
    assert final.phase == "Succeeded"
    assert final.finished_at is not None and final.started_at is not None
    assert final.finished_at - final.started_at > 4
    assert agent.metric("prewarm_agent_messages_received_total", kind="task") == 1
    assert agent.metric("prewarm_agent_messages_received_total", kind="duplicate") == 0
    assert agent.metric("prewarm_agent_pull_calls_total") == 1
    assert agent.queue_depth() == (0, 0)


def test_stop_lets_a_pull_finish_within_the_grace_period_and_releases_queued_tasks(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given one pull running and another task waiting for the only slot
    slow_link.set_rate(2 * MIB)
    image = oci_image_factory.push(registry, "slow/finish", size_mb=3).with_host(slow_link.host)
    queued_image = oci_image_factory.push(registry, "slow/queued", size_mb=1).with_host(slow_link.host)
    agent = agents(MAX_CONCURRENT_PULLS="1")
    task, queued = agent.task(image.reference), agent.task(queued_image.reference)
    agent.send(task)
    agent.wait_for(task, lambda rs: any(r.phase == "Pulling" for r in rs), timeout=10)
    agent.send(queued)
    deadline = time.monotonic() + 5
    while agent.metric("prewarm_agent_messages_received_total", kind="task") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)

    # When the agent stops with a grace period long enough for the running pull
    agent.stop(grace=15)

    # Then the running pull finished and was reported; the queued task reported nothing and is back
    assert agent.final(task, timeout=1).phase == "Succeeded"
    assert agent.reports(queued) == []
    answer = agent.sqs.receive_message(QueueUrl=agent.queue_url, WaitTimeSeconds=1)
    (message,) = answer["Messages"]
    assert json.loads(message["Body"])["job_uid"] == queued.job_uid


def test_sigterm_cancels_the_pull_releases_its_message_and_exits_0(
    agents: Agents, registry: LocalRegistry, slow_link: ThrottlingProxy, oci_image_factory: OciImageFactory
) -> None:
    # Given `python -m prewarm_agent` pulling 16 MiB at 1 MiB/s, with a 2 s shutdown grace
    image = oci_image_factory.push(registry, "slow/sigterm", size_mb=16).with_host(slow_link.host)
    harness = agents(start=False)
    harness.make_queue()
    process = subprocess.Popen(
        [sys.executable, "-m", "prewarm_agent"], env={**os.environ, **harness.environment},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not harness.hellos():
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "the agent never said hello"
            time.sleep(0.1)
        task = harness.task(image.reference)
        harness.send(task)
        harness.wait_for(task, lambda rs: bool(_with_bytes(rs)), timeout=15)

        # When it gets SIGTERM
        process.send_signal(signal.SIGTERM)
        signalled_at = time.monotonic()
        _, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    # Then it exits 0 after the grace period, its last report leaving the node Pulling (not a final
    # phase, which would count it failed though the restarted agent pulls again) ...
    assert process.returncode == 0, stderr.decode()
    assert time.monotonic() - signalled_at < 2 + 1 + 5
    last = harness.wait_for(task, lambda rs: any(r.message == SHUTDOWN_MESSAGE for r in rs), timeout=5)[-1]
    assert (last.phase, last.message) == ("Pulling", SHUTDOWN_MESSAGE)
    # ... containerd's download was stopped ...
    assert slow_link.wait_for(lambda proxy: not busiest(proxy).open, timeout=2)
    assert busiest(slow_link).bytes_to_client < 16 * MIB
    # ... the task's message is visible again at once, for the restarted agent ...
    answer = harness.sqs.receive_message(QueueUrl=harness.queue_url, WaitTimeSeconds=1,
                                         MessageSystemAttributeNames=["ApproximateReceiveCount"])
    (message,) = answer["Messages"]
    assert json.loads(message["Body"])["job_uid"] == task.job_uid
    assert message["Attributes"]["ApproximateReceiveCount"] == "2"
    # ... and every log line was JSON naming the node
    lines = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
    assert lines and all(line["node"] == harness.node for line in lines if line["logger"].startswith("prewarm_agent"))
    assert any(line["message"] == "stopped" for line in lines)
