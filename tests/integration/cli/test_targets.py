"""How the CLI finds its stack: the local state file, `PREWARM_ENDPOINT_URL`, and deployed stacks by name."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from prewarm_cli.app import cli
from prewarm_cli.targets import (
    ENDPOINT_ENV,
    STACK_ENV,
    STATE_ENV,
    LocalState,
    clear_local_state,
    read_local_state,
    write_local_state,
)
from prewarm_devtools.sam.aws import aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.cli import Run
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration


def _run(*args: str, env: dict[str, str | None]) -> tuple[int, str, str]:
    base: dict[str, str | None] = {STATE_ENV: None, ENDPOINT_ENV: None, STACK_ENV: None}
    result = CliRunner().invoke(cli, list(args), env={**base, **env})
    return result.exit_code, result.stdout, result.stderr


def _stack_template(outputs: dict[str, str]) -> str:
    return json.dumps({
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "prewarm-cli-marker"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    })


def test_the_state_file_round_trips_and_only_its_owner_can_read_it(tmp_path: Path) -> None:
    # Given the state of a local stack
    state = LocalState("http://127.0.0.1:4566", "eu-west-1", {"TABLE_NAME": "t", "STATUS_QUEUE_URL": "u"}, pid=42)

    # When it is written into a directory that does not exist yet, read back, then cleared
    path = write_local_state(state, tmp_path / "home" / "local.json")
    read = read_local_state(path)
    cleared, again = clear_local_state(path), clear_local_state(path)

    # Then it reads back equal, and clearing twice reports the second as a no-op
    assert read == state
    assert (cleared, again) == (True, False)


def test_the_state_file_is_written_owner_only(tmp_path: Path) -> None:
    path = write_local_state(LocalState("http://127.0.0.1:1", "us-west-2", {"TABLE_NAME": "t"}), tmp_path / "s.json")

    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_without_a_target_the_cli_says_how_to_get_one(tmp_path: Path) -> None:
    code, _, stderr = _run("get", "jobs", env={STATE_ENV: str(tmp_path / "none.json")})

    assert code == 2
    assert stderr.startswith("error: no stack to talk to: pass --stack NAME (or set PREWARM_STACK)")


def test_local_without_a_state_file_names_the_file(tmp_path: Path) -> None:
    code, _, stderr = _run("--local", "get", "jobs", env={STATE_ENV: str(tmp_path / "none.json")})

    assert code == 1
    assert stderr == f"error: no local stack: {tmp_path / 'none.json'} does not exist; start one with " \
                     f"`prewarm local up` (or set {STATE_ENV} to its state file)\n"


def test_a_state_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "local.json"
    broken.write_text("{endpoint")

    code, _, stderr = _run("--local", "get", "jobs", env={STATE_ENV: str(broken)})

    assert code == 1 and stderr.startswith(f"error: {broken}: not valid JSON")


def test_a_state_file_of_a_stopped_local_stack_is_recognised(tmp_path: Path) -> None:
    # Given a state file left by a process that has exited
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    path = write_local_state(LocalState("http://127.0.0.1:1", "us-west-2", {"TABLE_NAME": "t"},
                                        pid=int(finished.stdout)), tmp_path / "local.json")

    # When the CLI is pointed at it
    code, _, stderr = _run("--local", "get", "jobs", env={STATE_ENV: str(path)})

    # Then it says the stack is not running instead of timing out on the endpoint
    assert code == 1
    assert stderr == f"error: the local stack (pid {finished.stdout.strip()}) is not running any more; " \
                     "start it again with `prewarm local up`\n"


def test_with_a_state_file_present_local_is_the_default_and_flags_go_after_the_command(
    state_file: Path, prewarm: Run
) -> None:
    # Given a job on the local stack
    assert prewarm("apply", "-f", "-", input=job_yaml("target-default")).exit_code == 0

    # When jobs are listed with no target flag, and with --local after the command
    implicit = _run("get", "jobs", "target-default", "-o", "name", env={STATE_ENV: str(state_file)})
    trailing = _run("get", "jobs", "target-default", "-o", "name", "--local", env={STATE_ENV: str(state_file)})

    # Then both reach the local stack
    assert implicit == trailing == (0, "imagepulljob.apps.kruise.io/target-default\n", "")


def test_the_endpoint_variable_overrides_the_state_file_and_a_dead_endpoint_is_one_line(state_file: Path) -> None:
    code, _, stderr = _run("get", "jobs", env={STATE_ENV: str(state_file), ENDPOINT_ENV: "http://127.0.0.1:9"})

    assert code == 1
    assert stderr == 'error: Could not connect to the endpoint URL: "http://127.0.0.1:9/": is the local stack ' \
                     "running? Start it with `prewarm local up`\n"


def test_local_and_stack_together_is_a_usage_error(state_file: Path) -> None:
    code, _, stderr = _run("--local", "--stack", "prod", "get", "jobs", env={STATE_ENV: str(state_file)})

    assert (code, stderr) == (2, "error: --local and --stack exclude each other: choose one target\n")


def test_a_deployed_stack_is_found_by_name_from_its_outputs(local_stack: LocalStack, prewarm: Run) -> None:
    # Given a job, and a CloudFormation stack whose outputs name the local stack's table and queues
    assert prewarm("apply", "-f", "-", input=job_yaml("target-stack")).exit_code == 0
    env = local_stack.env()
    outputs = {"JobsTableName": env["TABLE_NAME"], "StatusQueueUrl": env["STATUS_QUEUE_URL"],
               "NodeQueuePrefix": env["NODE_QUEUE_PREFIX"], "NodeDLQArn": env["NODE_DLQ_ARN"]}
    with aws_environment(local_stack.endpoint_url, local_stack.region):
        cfn = boto3.client("cloudformation")
        cfn.create_stack(StackName="prewarm-cli-deployed", TemplateBody=_stack_template(outputs))

        # When the CLI is pointed at it by --stack, and by PREWARM_STACK
        by_flag = _run("--stack", "prewarm-cli-deployed", "--region", local_stack.region, "get", "job",
                       "target-stack", "-o", "name", env={})
        by_env = _run("get", "job", "target-stack", "-o", "name", env={STACK_ENV: "prewarm-cli-deployed"})
        missing = _run("--stack", "nope", "get", "jobs", env={})

    # Then both read the same table; a missing stack is named with its region
    assert by_flag == by_env == (0, "imagepulljob.apps.kruise.io/target-stack\n", "")
    assert missing == (1, "", f"error: stack 'nope' not found in {local_stack.region}\n")


def test_a_stack_without_prewarm_outputs_is_refused(local_stack: LocalStack) -> None:
    with aws_environment(local_stack.endpoint_url, local_stack.region):
        cfn = boto3.client("cloudformation")
        cfn.create_stack(StackName="prewarm-cli-other", TemplateBody=_stack_template({"Other": "x"}))
        code, _, stderr = _run("--stack", "prewarm-cli-other", "get", "jobs", env={})

    assert code == 1
    assert stderr == "error: stack 'prewarm-cli-other' has no output JobsTableName, StatusQueueUrl, NodeQueuePrefix: " \
                     "is it a Prewarm stack, fully deployed?\n"


def test_store_errors_name_the_target_and_debug_adds_the_traceback(local_stack: LocalStack, tmp_path: Path) -> None:
    # Given a state file naming a table that does not exist
    state = LocalState.of_stack(local_stack, pid=os.getpid())
    path = write_local_state(LocalState(state.endpoint_url, state.region, {**state.env, "TABLE_NAME": "gone"}),
                             tmp_path / "local.json")

    # When a job is described, without and with --debug
    plain = _run("--local", "describe", "job", "x", env={STATE_ENV: str(path)})
    debug = _run("--local", "--debug", "describe", "job", "x", env={STATE_ENV: str(path)})

    # Then the error is one line naming the table and the stack; --debug shows the traceback before it
    assert plain[0] == 1
    assert plain[2] == (f"error: get job: ResourceNotFoundException: Requested resource not found (local stack at "
                        f"{state.endpoint_url}, table gone)\n")
    assert debug[0] == 1
    assert "Traceback (most recent call last)" in debug[2]
    assert debug[2].endswith(plain[2])
