"""One local stack (template.yaml on a moto server) for the CLI tests, its state file, and the CLI run against it.

The tests play the control plane's other parts themselves, through `ControlPlane`: `plan` with a small
fake cluster stands in for the dispatch function, and `report` for the agents' reports.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm_cli.app import cli
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.sam.aws import MotoServer
from prewarm_devtools.sam.stack import LocalStack
from tests.support.cli import Run
from tests.support.cluster import FakeCluster, make_node
from tests.support.control_plane import ControlPlane
from tests.support.manifests import NODES


@pytest.fixture(scope="package")
def local_stack() -> Iterator[LocalStack]:
    # moto keeps its backends per process, not per server: a stack name of its own keeps this stack's
    # table and queues apart from other tests' stacks.
    with MotoServer() as server:
        yield LocalStack(server.url, parameters={"ClusterName": "local"},
                         stack_name=f"prewarm-cli-{uuid.uuid4().hex[:8]}").deploy()


def stack_state(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local state file naming `stack`, as `prewarm local up` writes one."""
    path = tmp_path_factory.mktemp("prewarm-home") / "local.json"
    return write_local_state(LocalState.of_stack(stack, pid=os.getpid()), path)


def cli_on(state: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """Runs `prewarm --local ARGS...` in-process against the local state file `state`, no other target set."""
    monkeypatch.setenv(STATE_ENV, str(state))
    for name in (ENDPOINT_ENV, STACK_ENV, "PREWARM_DEBUG"):
        monkeypatch.delenv(name, raising=False)

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli, ["--local", *args], catch_exceptions=False)

    return invoke


@pytest.fixture(scope="package")
def state_file(local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stack_state(local_stack, tmp_path_factory)


@pytest.fixture(scope="package")
def control_plane(local_stack: LocalStack) -> ControlPlane:
    """The stack's table and queues, with Ready linux/amd64 nodes `node-a`, `node-b` and `node-c`."""
    env = local_stack.env()
    sqs = local_stack.sqs
    plane = ControlPlane(
        store=DynamoJobStore(env["TABLE_NAME"], client=local_stack.dynamodb),
        queues=NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], dlq_arn=env["NODE_DLQ_ARN"], client=sqs),
        sqs=sqs,
        cluster=FakeCluster(nodes=[make_node(n, pool="general", **{"kubernetes.io/hostname": n}) for n in NODES]),
    )
    plane.start_agents()
    return plane


@pytest.fixture
def cli_env(state_file: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a CLI run: the local state file, and no other target configured."""
    monkeypatch.setenv(STATE_ENV, str(state_file))
    for name in (ENDPOINT_ENV, STACK_ENV, "PREWARM_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return {STATE_ENV: str(state_file)}


@pytest.fixture
def prewarm(cli_env: dict[str, str]) -> Run:
    """Runs `prewarm --local ARGS...` in-process; stdout and stderr are kept apart."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli, ["--local", *args], input=input, catch_exceptions=False)

    return run

