"""Node-side faults against the real thing: local mode's control plane on moto, a private containerd,
the registry that plays ECR, and the agent (in-process, or as its own process when it must die).

Slow pulls go through a throttling proxy so a fault lands mid-download. After every scenario the job
invariant of `tests.reliability.invariants` holds: counters add up, node items agree with them and
with `failedNodes`, and a finished job leaves no node without a final phase.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.job import StoredJob
from prewarm.domain.messages import NodePhase, node_queue_name
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.jobs import apply_manifest
from prewarm_agent.settings import AgentSettings
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.localnodes import LocalNode
from prewarm_devtools.node.throttle import ThrottlingProxy
from tests.reliability.invariants import assert_invariant

pytestmark = [
    pytest.mark.integration,
    pytest.mark.node,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok"),
]

MIB = 1024 * 1024
IMAGE_MB = 8
# 1 MiB/s: an 8 MiB layer takes 8 s, long enough to land a fault in the middle of it.
SLOW_RATE = MIB
# The replaced agent's visibility timeout: how long a killed agent's task stays hidden.
VISIBILITY_SECONDS = 6
T = TypeVar("T")


# --- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def local() -> Iterator[LocalMode]:
    """Local mode with one node (its own containerd and in-process agent), stopped after the test."""
    with LocalMode(nodes=1) as mode:
        yield mode


@pytest.fixture
def node(local: LocalMode) -> LocalNode:
    (only,) = local.nodes.values()
    return only


@pytest.fixture
def store(local: LocalMode) -> DynamoJobStore:
    assert local.stack is not None and local.aws is not None
    return local.job_store()


@pytest.fixture
def slow_link(local: LocalMode, node: LocalNode) -> Iterator[ThrottlingProxy]:
    """The ECR host served to the node through a 1 MiB/s proxy to the registry (`set_rate` changes it)."""
    with ThrottlingProxy(("127.0.0.1", local.registry.port), SLOW_RATE) as proxy:
        # containerd reads hosts.toml on every pull, and the agent's manifest reads use it too.
        node.containerd.add_registry_mirror(ecr_host(), proxy.url)
        yield proxy


def pull_job(name: str, image: str, node: str, *, backoff_limit: int, timeout_seconds: int,
             completion: str = "Always") -> dict[str, Any]:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"image": image, "parallelism": 1, "selector": {"names": [node]},
                 "pullPolicy": {"backoffLimit": backoff_limit, "timeoutSeconds": timeout_seconds},
                 "completionPolicy": {"type": completion}},
    }


def apply(store: DynamoJobStore, doc: dict[str, Any]) -> str:
    """Apply as `prewarm apply` does; the local stack's stream then dispatches it. Returns the job key."""
    apply_manifest(store, doc, now=time.time())
    return f"default/{doc['metadata']['name']}"


def node_task(store: DynamoJobStore, key: str) -> NodeTaskRecord | None:
    tasks = store.get_tasks(key)
    return tasks[0] if tasks else None


def wait_until(condition: Callable[[], T | None], timeout: float, what: Callable[[], str]) -> T:
    """Poll `condition` until it returns something truthy; fail with `what()` (the state) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if result := condition():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s; {what()}")
        time.sleep(0.1)


def describe(store: DynamoJobStore, key: str) -> Callable[[], str]:
    def show() -> str:
        record = store.get_job(key)
        task = node_task(store, key)
        if record is None:
            return f"job {key} does not exist"
        c = record.counters
        where = "no node item" if task is None else (
            f"node {task.phase.value} round {task.round} attempt {task.attempt} seq {task.seq} "
            f"bytes {task.bytes_done}/{task.bytes_total} message {task.message!r}")
        return (f"job {key} {record.state} round {record.round} desired {c.desired} waiting {c.waiting} "
                f"active {c.active} succeeded {c.succeeded} failed {c.failed}; {where}")
    return show


def pulling_bytes(store: DynamoJobStore, key: str, proxy: ThrottlingProxy, at_least: int) -> bool:
    """The node reported Pulling and at least `at_least` layer bytes went through the proxy: mid-pull."""
    task = node_task(store, key)
    return task is not None and task.phase is NodePhase.PULLING and proxy.bytes_to_client >= at_least


def completed(store: DynamoJobStore, key: str) -> StoredJob | None:
    record = store.get_job(key)
    return record if record is not None and record.state == "Completed" else None


def finished(store: DynamoJobStore, key: str) -> NodeTaskRecord | None:
    task = node_task(store, key)
    return task if task is not None and task.phase.is_terminal else None


# --- 1. the agent killed mid-pull ---------------------------------------------------------------


class AgentProcess:
    """`python -m prewarm_agent` for one node, its JSON log lines in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "prewarm_agent"], env={**os.environ, **self.env},
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a node crash would: no drain, no release, no report."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def logged(self, message: str, job: str) -> bool:
        """True when a log line of `job` starts with `message`."""
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        entries = [json.loads(line) for line in lines if line.startswith("{")]
        return any(e.get("job") == job and str(e.get("message", "")).startswith(message) for e in entries)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def agent_environment(settings: AgentSettings, **overrides: str) -> dict[str, str]:
    """The environment that gives `python -m prewarm_agent` these settings, with `overrides`."""
    env = {name: str(value) for name, value in settings.model_dump(by_alias=True).items() if value is not None}
    return {**env, **overrides}


def queue_depth(local: LocalMode, node: str) -> tuple[int, int]:
    """(visible, in flight) messages of the node's queue."""
    assert local.aws is not None and local.stack is not None
    sqs = local.aws.client("sqs")
    url = sqs.get_queue_url(QueueName=node_queue_name(local.stack.env()["NODE_QUEUE_PREFIX"], node))["QueueUrl"]
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])



def test_an_agent_killed_mid_pull_is_replaced_and_the_node_counts_once(
    local: LocalMode, node: LocalNode, store: DynamoJobStore, slow_link: ThrottlingProxy, tmp_path: Path
) -> None:
    # Given the node's agent running as its own process with a 6 s visibility timeout
    node.agent.stop(0)  # the in-process one would compete for the queue
    # Signed as the agents' role: the process environment may hold a running function's keys.
    env = agent_environment(node.agent.settings, NODE_QUEUE_VISIBILITY_SECONDS=str(VISIBILITY_SECONDS),
                            **local.agent_identity_of(node.name).environment())
    first = AgentProcess(env, tmp_path / "agent-1.log").start()
    second = AgentProcess(env, tmp_path / "agent-2.log")
    try:
        # And a throttled pull of an 8 MiB image under way on it
        pushed = local.push("faults/agent-killed", "v1", size_mb=IMAGE_MB)
        key = apply(store, pull_job("agent-killed", pushed.reference, node.name, backoff_limit=1,
                                    timeout_seconds=120))
        wait_until(lambda: pulling_bytes(store, key, slow_link, 2 * MIB), 30, describe(store, key))
        assert queue_depth(local, node.name) == (0, 1)  # the task is held by the agent that pulls it

        # When the agent is killed with SIGKILL and another one starts for the node
        first.kill()
        killed_at = time.monotonic()
        slow_link.set_rate(None)
        second.start()

        # Then the task comes back only after its visibility timeout, and the new agent finishes it
        wait_until(lambda: second.logged("task received", key), 30, second.log_text)
        reappeared_after = time.monotonic() - killed_at
        done = wait_until(lambda: finished(store, key), 60, describe(store, key))
    finally:
        first.stop()
        second.stop()
    assert done.phase is NodePhase.SUCCEEDED, describe(store, key)()
    assert second.logged("Succeeded", key)
    # The last heartbeat may have come up to a third of the timeout before the kill.
    assert reappeared_after >= VISIBILITY_SECONDS * 2 / 3 - 1, reappeared_after
    assert node.image_present(pushed.reference)
    # And the job completed with the node counted once
    # (completion is its own write after the report's transaction: wait for it)
    record = wait_until(lambda: completed(store, key), 30, describe(store, key))
    c = record.counters
    assert (c.desired, c.succeeded, c.failed, c.active, c.waiting) == (1, 1, 0, 0, 0)
    assert store.failed_nodes(record.key) == []
    assert_invariant(store, key)


# --- 2. containerd restarted mid-pull ------------------------------------------------------------


def test_a_containerd_restart_mid_pull_is_retried_until_the_pull_succeeds(
    local: LocalMode, node: LocalNode, store: DynamoJobStore, slow_link: ThrottlingProxy
) -> None:
    # Given a throttled pull with retries (backoffLimit 3) under way on the node
    pushed = local.push("faults/containerd-restart", "v1", size_mb=IMAGE_MB)
    key = apply(store, pull_job("containerd-restart", pushed.reference, node.name, backoff_limit=3,
                                timeout_seconds=120))
    wait_until(lambda: pulling_bytes(store, key, slow_link, 2 * MIB), 30, describe(store, key))

    # When the node's containerd restarts in the middle of it
    node.containerd.restart()
    slow_link.set_rate(None)

    # Then the agent retries and the pull succeeds: the job completes with the node Succeeded
    done = wait_until(lambda: finished(store, key), 60, describe(store, key))
    assert done.phase is NodePhase.SUCCEEDED, describe(store, key)()
    assert done.attempt >= 2, f"the pull succeeded on attempt {done.attempt}: the restart missed it"
    assert node.image_present(pushed.reference)
    # (completion is its own write after the report's transaction: wait for it)
    record = wait_until(lambda: completed(store, key), 30, describe(store, key))
    c = record.counters
    assert (c.desired, c.succeeded, c.failed) == (1, 1, 0)
    assert_invariant(store, key)


# --- 3. the registry down -------------------------------------------------------------------------


def test_a_node_fails_while_the_registry_is_down_and_succeeds_in_the_next_daily_round(
    local: LocalMode, node: LocalNode, store: DynamoJobStore
) -> None:
    # Given an image in the registry that plays ECR, and then the registry down
    assert local.stack is not None and local.registry is not None
    pushed = local.push("faults/registry-down", "v1", size_mb=1)
    reference = f"{ecr_host()}/faults/registry-down:v1"
    local.registry.stop()

    # When a Never job with one retry and a 10 s pull timeout is applied for it
    key = apply(store, pull_job("registry-down", reference, node.name, backoff_limit=1, timeout_seconds=10,
                                completion="Never"))

    # Then the node ends Failed after both attempts, with containerd's error in its message
    failed = wait_until(lambda: finished(store, key), 60, describe(store, key))
    assert failed.phase is NodePhase.FAILED, describe(store, key)()
    assert failed.attempt == 2
    assert "connection refused" in failed.message and "faults/registry-down" in failed.message, failed.message
    assert failed.started_at is not None and failed.finished_at is not None
    assert failed.finished_at - failed.started_at >= 1.0  # the 1 s back-off between the attempts
    record = store.get_job(key)
    assert record is not None and record.state == "Running"  # a Never job keeps running
    assert (record.counters.failed, store.failed_nodes(record.key)) == (1, [node.name])
    assert_invariant(store, key)

    # When the registry is back (on a new port: the node's hosts.toml follows it) and the daily round runs
    local.registry.start()
    node.containerd.add_registry_mirror(ecr_host(), local.registry.url)
    # moto never fires EventBridge schedules: fire repull_daily's the way the scheduler would.
    local.stack.fire("repull_daily")

    # Then the node succeeds in round 1, and round 0's failure no longer counts
    again = wait_until(lambda: (t := finished(store, key)) and t.round == 1 and t, 60, describe(store, key))
    assert again.phase is NodePhase.SUCCEEDED, describe(store, key)()
    assert node.image_present(pushed.reference)
    record = store.get_job(key)
    assert record is not None and (record.state, record.round) == ("Running", 1)
    c = record.counters
    assert (c.desired, c.succeeded, c.failed, store.failed_nodes(record.key)) == (1, 1, 0, [])
    assert_invariant(store, key)
