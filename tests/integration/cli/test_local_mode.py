"""`prewarm local up|status|down` as a user runs them: a control-plane-only local stack in its own process,
and the cluster admin's kubeconfig it writes for kubectl, as the official client loads it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, AuthorizationV1Api, Configuration, CoreV1Api, V1SelfSubjectAccessReview
from kubernetes.config import kube_config

from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, read_local_state, write_local_state
from prewarm_devtools.kubeapi.seed import load_objects
from prewarm_devtools.localrun import kubeconfig_path
from prewarm_devtools.node.process import process_running
from tests.support.kube import SAMPLE_CLUSTER, call
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

    # When the CLI uses it, kubectl's kubeconfig is loaded, a second one is started, and it is stopped
    kubeconfig = kubeconfig_path(Path(env[STATE_ENV]))
    admin = _admin_through(kubeconfig)
    applied = _prewarm("--local", "apply", "-f", "-", env=env, stdin=job_yaml("local-up"))
    listed = _prewarm("get", "jobs", "-o", "name", env=env)
    status = _prewarm("local", "status", env=env)
    second = _prewarm("local", "up", "--no-agents", env=env)
    down = _prewarm("local", "down", env=env)
    exited_when_down_returned = not process_running(local_up.pid)
    exit_code = local_up.wait(timeout=30)
    after = _prewarm("local", "status", env=env)

    # Then the CLI reached it, the second start was refused, and down stopped it cleanly and removed its state
    assert applied.stdout == "imagepulljob.apps.kruise.io/local-up created\n"
    assert listed.stdout == "imagepulljob.apps.kruise.io/local-up\n"
    assert status.returncode == 0 and f"running:           yes (pid {local_up.pid})" in status.stdout
    endpoints = dict(line.split() for line in status.stdout.splitlines() if line.startswith("  ") and ": " in line)
    assert endpoints["aws:"] == state.endpoint_url
    assert endpoints["kubernetes:"].startswith("https://127.0.0.1:") and endpoints["control:"].startswith("http://")
    assert f"kubeconfig:        {kubeconfig}  (kubectl: export KUBECONFIG={kubeconfig})" in status.stdout
    assert admin == {"server": endpoints["kubernetes:"], "mode": 0o600, "nodes": _sample_nodes(), "admin": True,
                     "without token": 401}
    assert second.returncode == 1
    assert second.stderr == f"error: a local stack is already running (pid {local_up.pid}, {state.endpoint_url}); " \
                            "stop it with `prewarm local down`\n"
    assert (down.returncode, down.stdout) == (0, f"local stack (pid {local_up.pid}) stopped\n")
    assert exited_when_down_returned
    assert exit_code == 0
    assert not Path(env[STATE_ENV]).exists() and not kubeconfig.exists()
    assert after.returncode == 1 and after.stderr.startswith("error: no local stack:")


def _admin_through(kubeconfig: Path) -> dict[str, object]:
    """What the official client sees with the kubeconfig (`load_kube_config`, as kubectl reads it)."""
    configuration = Configuration()
    kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration,
                                 persist_config=False)
    with ApiClient(configuration) as client:
        review = AuthorizationV1Api(client).create_self_subject_access_review(V1SelfSubjectAccessReview(
            spec={"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}))
        return {"server": configuration.host, "mode": kubeconfig.stat().st_mode & 0o777,
                "nodes": sorted(n.metadata.name for n in CoreV1Api(client).list_node().items),
                "admin": review.status.allowed,
                "without token": call(client, "GET", "/api/v1/nodes", authenticate=False).status}


def _sample_nodes() -> list[str]:
    return sorted(o["metadata"]["name"] for o in load_objects(SAMPLE_CLUSTER) if o.get("kind") == "Node")


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


def test_local_down_without_a_state_file_has_nothing_to_stop_and_exits_0(env: dict[str, str]) -> None:
    # Given no local stack and no state file
    assert not Path(env[STATE_ENV]).exists()

    # When local down runs, Then it says so and succeeds, as with a stale state file
    down = _prewarm("local", "down", env=env)

    assert (down.returncode, down.stdout) == (0, f"no local stack was running (no state file {env[STATE_ENV]})\n")


def test_local_down_after_a_crash_stops_what_the_stack_left_and_removes_its_files(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given a stack killed with SIGKILL: its state and run record name a process still running from its
    # run directory (as a containerd would) and the run directory's files
    from prewarm_devtools.localrun import RunRecord, run_record_path, write_run_record

    run_dir = tmp_path / "pw-crashed"
    (run_dir / "n0" / "root").mkdir(parents=True)
    (run_dir / "n0" / "root" / "blob").write_bytes(b"x" * 4096)
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    state_path = Path(env[STATE_ENV])
    write_local_state(LocalState("http://127.0.0.1:1", "us-west-2", {"TABLE_NAME": "t"}, pid=int(dead.stdout)),
                      state_path)
    record = RunRecord(pid=int(dead.stdout), run_dir=str(run_dir))
    record.add_child("containerd of node-a", left.pid, None)
    write_run_record(record, run_record_path(state_path))

    try:
        # When local down runs
        down = _prewarm("local", "down", env=env)

        # Then it stopped the process, removed the run directory, the state and the record, and said so
        assert down.returncode == 0, down.stderr
        assert left.wait(timeout=5) is not None
        assert down.stdout.splitlines() == [
            f"local stack (pid {dead.stdout.strip()}) was not running (it crashed or was killed)",
            f"  stopped containerd of node-a (pid {left.pid})",
            f"  removed {run_dir} (4.0 KiB)",
        ]
        assert not run_dir.exists() and not state_path.exists() and not run_record_path(state_path).exists()
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
