"""Local mode runs each function in a process of its own: each logs under its own service name, and its
lines reach the stack's function output, not whatever this process's stdout is meanwhile."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

import pytest

from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.local_functions import make_wait

pytestmark = pytest.mark.integration


def test_each_function_logs_under_its_own_service_name() -> None:
    # Given a local stack whose functions write their logs to one stream
    output = io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=output).deploy()

        # When two functions run one after the other
        stack.fire("sweep")
        stack.fire("repull_daily")
        stack.fire("sweep")

    # Then each line carries the service of the function that wrote it, as template.yaml names it
    lines = [json.loads(line) for line in output.getvalue().splitlines() if line.startswith("{")]
    services = [doc["service"] for doc in lines if "service" in doc]
    assert [doc["service"] for doc in lines if doc.get("message") == "sweep"] == ["sweep", "sweep"]
    lines_by_function = {name: [s for s in services if s == name] for name in ("sweep", "repull_daily")}
    assert set(services) == {"sweep", "repull_daily"}, services
    assert all(lines_by_function.values())
    assert stack.function("sweep").env["POWERTOOLS_SERVICE_NAME"] == "sweep"
    # and the function's own Logger's lines name that function as their logger, as its own process on AWS
    # does (before, every function's lines named whichever function the process loaded first)
    names = [(doc["service"], doc["name"]) for doc in lines if "level" in doc]
    own = [(service, name) for service, name in names if not name.startswith("prewarm.")]
    assert own and all(service == name for service, name in own), names


def test_what_other_threads_print_while_a_function_runs_stays_on_stdout(tmp_path: Path) -> None:
    # Given a local stack whose functions write to their own output, and a handler that prints, then
    # waits while the rest of the process goes on
    functions, stdout = io.StringIO(), io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url), contextlib.redirect_stdout(stdout):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=functions).deploy()
        waiting = make_wait(stack, "sweep", tmp_path)
        invocation = threading.Thread(target=stack.invoke, args=("sweep", {}))
        invocation.start()
        waiting.wait_started()
        # When another thread prints during the invocation (the CLI, the demo's JSON report)
        print("printed by the CLI")
        waiting.release()
        invocation.join(10)
        stack.stop()

    # Then each line lands where its writer meant it
    assert "printed by the CLI" in stdout.getvalue() and "printed by the CLI" not in functions.getvalue()
    assert "printed by the function" in functions.getvalue()
    assert "printed by the function" not in stdout.getvalue()


def test_a_cli_run_that_ends_while_a_function_runs_leaves_no_stale_stdout_behind(tmp_path: Path) -> None:
    # Given a function that starts while a CLI run (CliRunner) holds sys.stdout, and waits
    stdout, cli_output, functions = io.StringIO(), io.StringIO(), io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url), contextlib.redirect_stdout(stdout):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=functions).deploy()
        waiting = make_wait(stack, "sweep", tmp_path)
        invocation = threading.Thread(target=stack.invoke, args=("sweep", {}))
        with contextlib.redirect_stdout(cli_output):
            invocation.start()
            waiting.wait_started()
        # When the CLI run ends first, then the function
        waiting.release()
        invocation.join(10)
        stack.stop()
        # Then what is printed next reaches stdout, not the ended CLI run's stream, and the function's line
        # reached the functions' output alone
        print("printed after both")
    assert "printed after both" in stdout.getvalue() and "printed after both" not in cli_output.getvalue()
    assert "printed by the function" in functions.getvalue()
    assert "printed by the function" not in stdout.getvalue() + cli_output.getvalue()


def test_a_key_one_invocation_appends_is_not_on_the_next_invocations_lines() -> None:
    # Given a local stack whose functions log through the shared package's one Logger
    from tests.support.events import load_event

    output = io.StringIO()
    with MotoServer() as aws, aws_environment(aws.url):
        stack = LocalStack(aws.url, parameters={"ClusterName": "local"}, function_output=output).deploy()
        push = load_event("ecr_push")

        # When on_image_push handles a push (it appends the image to its lines), then the sweep runs, then
        # on_image_push ignores a failed push
        stack.invoke("on_image_push", push)
        stack.fire("sweep")
        stack.invoke("on_image_push", load_event("ecr_push_failed"))

    # Then only the push's own lines carry its image (before, the sweep's and the next push's did too)
    lines = [json.loads(line) for line in output.getvalue().splitlines() if line.startswith("{")]
    with_image = [(doc["service"], doc.get("message")) for doc in lines if "image" in doc]
    assert with_image and {message for _service, message in with_image} == {"push handled"}, with_image
    assert [doc for doc in lines if doc.get("message") == "ignored: not a successful push" and "image" not in doc]
