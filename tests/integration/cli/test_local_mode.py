"""`prewarm local up|status|down` as a user runs them: a control-plane-only local stack in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, read_local_state, write_local_state
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration

PREWARM = Path(sys.executable).with_name("prewarm")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in (ENDPOINT_ENV, STACK_ENV, "PREWARM_DEBUG")}
    return {**base, STATE_ENV: str(tmp_path / "local.json")}


@pytest.fixture
def local_up(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`prewarm local up --no-agents`, waited for until its state file appears; killed if a test leaves it up."""
    process = subprocess.Popen([str(PREWARM), "local", "up", "--no-agents"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    state = Path(env[STATE_ENV])
    deadline = time.monotonic() + 60
    while not state.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"local up did not come up (exit {process.returncode}): {out}{err}")
        time.sleep(0.1)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _prewarm(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PREWARM), *args], input=stdin, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_local_up_serves_the_cli_until_local_down_stops_it(
    local_up: subprocess.Popen[str], env: dict[str, str]
) -> None:
    # Given a running local stack
    state = read_local_state(env[STATE_ENV])
    assert state.pid == local_up.pid and state.endpoint_url.startswith("http://127.0.0.1:")

    # When the CLI uses it, a second one is started, and it is stopped
    applied = _prewarm("--local", "apply", "-f", "-", env=env, stdin=job_yaml("local-up"))
    listed = _prewarm("get", "jobs", "-o", "name", env=env)
    status = _prewarm("local", "status", env=env)
    second = _prewarm("local", "up", "--no-agents", env=env)
    down = _prewarm("local", "down", env=env)
    exit_code = local_up.wait(timeout=30)
    after = _prewarm("local", "status", env=env)

    # Then the CLI reached it, the second start was refused, and down stopped it cleanly and removed its state
    assert applied.stdout == "imagepulljob.apps.kruise.io/local-up created\n"
    assert listed.stdout == "imagepulljob.apps.kruise.io/local-up\n"
    assert status.returncode == 0 and "running:           yes" in status.stdout
    assert second.returncode == 1
    assert second.stderr == f"error: a local stack is already running (pid {local_up.pid}, {state.endpoint_url}); " \
                            "stop it with `prewarm local down`\n"
    assert (down.returncode, down.stdout) == (0, f"local stack (pid {local_up.pid}) stopped\n")
    assert exit_code == 0
    assert not Path(env[STATE_ENV]).exists()
    assert after.returncode == 1 and after.stderr.startswith("error: no local stack:")


def test_local_down_clears_the_state_of_a_stack_that_already_exited(env: dict[str, str]) -> None:
    # Given a state file whose process has exited
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                            check=True)
    write_local_state(LocalState("http://127.0.0.1:1", "us-west-2", {"TABLE_NAME": "t"}, pid=int(exited.stdout)),
                      env[STATE_ENV])

    # When local down runs
    down = _prewarm("local", "down", env=env)

    # Then it removes the stale state and says so
    assert (down.returncode, down.stdout) == (0, f"no local stack was running; removed its stale state "
                                                 f"{env[STATE_ENV]}\n")
    assert not Path(env[STATE_ENV]).exists()
