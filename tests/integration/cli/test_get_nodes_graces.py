"""`prewarm get nodes` times the sweep's removal of a startup taint by the stack's own settings: a Ready,
tainted node whose agent never said hello is freed `NoAgentGraceSeconds` after it became Ready, whatever the
stack set it to, as the sweep does (the target carries the stack's parameter)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from prewarm.domain.kubernetes import format_time
from prewarm_cli.app import cli
from prewarm_cli.output import rfc3339
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.stack import LocalStack

pytestmark = pytest.mark.integration

TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}
READY_AGO = 10


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[KubeApiServer, float]]:
    """A cluster with one node, `bare-1`, that joined with the startup taint and became Ready 10 s ago."""
    ready = float(int(time.time()) - READY_AGO)
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "bare-1", "creationTimestamp": format_time(ready - 5),
                         "labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
            "spec": {"taints": [dict(TAINT)]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": format_time(ready)}]}}
    with KubeApiServer() as server:
        server.seed_objects([node])
        yield server, ready


def get_nodes(stack: LocalStack, api: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              **settings: str) -> str:
    """The message of `bare-1` in `prewarm get nodes`, the stack's environment carrying `settings`."""
    state = write_local_state(LocalState(stack.endpoint_url, stack.region, {**stack.env(), **settings},
                                         pid=os.getpid()), tmp_path / "local.json")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv(STATE_ENV, str(state))
    for name in (ENDPOINT_ENV, STACK_ENV):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["--local", "get", "nodes", "--kubeconfig", str(kubeconfig)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    (row,) = [r for r in rows if r.startswith("bare-1 ")]
    return row[header.index("MESSAGE"):]


def test_a_tainted_node_with_no_agent_is_freed_the_stacks_no_agent_grace_after_it_became_ready(
    local_stack: LocalStack, api: tuple[KubeApiServer, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ready = api
    # A stack deployed with NoAgentGraceSeconds=300
    message = get_nodes(local_stack, server, tmp_path, monkeypatch, NO_AGENT_GRACE_SECONDS="300")
    assert message.startswith("startup taint held and no agent has reported from this node; the sweep removes it "
                              f"after {rfc3339(ready + 300)} (in "), message

    # One that names no setting: the template's default, 120 s
    message = get_nodes(local_stack, server, tmp_path, monkeypatch)
    assert f"the sweep removes it after {rfc3339(ready + 120)} (in " in message, message


class CloudFormation:
    """A deployed stack as DescribeStacks answers: Prewarm's outputs, and the sweep's graces as parameters."""

    class meta:
        region_name = "us-west-2"

    def describe_stacks(self, StackName: str) -> dict[str, object]:
        outputs = {"JobsTableName": "t", "StatusQueueUrl": "https://sqs/q", "NodeQueuePrefix": "pw-node"}
        return {"Stacks": [{"Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()],
                            "Parameters": [{"ParameterKey": "NoAgentGraceSeconds", "ParameterValue": "300"},
                                           {"ParameterKey": "StartupTaintGraceSeconds", "ParameterValue": "90"}]}]}


def test_a_deployed_stacks_target_carries_its_sweep_graces() -> None:
    from prewarm_cli.targets import stack_target

    env = stack_target("pw", cloudformation=CloudFormation()).env
    assert (env["NO_AGENT_GRACE_SECONDS"], env["STARTUP_TAINT_GRACE_SECONDS"]) == ("300", "90")
