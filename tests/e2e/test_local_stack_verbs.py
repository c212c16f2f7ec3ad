"""`prewarm local ...` verbs against a real `prewarm local up` (containerd, registry and agent processes),
and a stack killed with SIGKILL cleaned up by `prewarm local down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm_devtools.localmode import missing_prerequisites
from prewarm_devtools.localrun import kubeconfig_path, read_run_record, run_record_path
from prewarm_devtools.node.process import process_running

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

PREWARM = str(Path(sys.executable).with_name("prewarm"))
RULE = Path(__file__).resolve().parents[2] / "samplefiles" / "rules" / "platform-base.yaml"
BANDWIDTH = 2 * 1024 * 1024  # 2MiB/s


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PREWARM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        return [line.split()[4] for line in mountinfo if line.split()[4].startswith(path)]


def start_up(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    state = Path(env["PREWARM_LOCAL_STATE"])
    up = subprocess.Popen([PREWARM, "local", "up", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not state.exists():
        if up.poll() is not None or time.monotonic() > deadline:
            up.kill()
            pytest.fail(f"local up did not start: {up.communicate()[0]}")
        time.sleep(0.2)
    return up


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PREWARM_LOCAL_STATE": str(tmp_path / "local.json")}


@pytest.fixture
def stack(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    up = start_up(env, "--nodes", "1", "--registry-bandwidth", "2MiB/s")
    try:
        yield up
    finally:
        if up.poll() is None:
            run(env, "local", "down")
            up.wait(timeout=60)


def status_nodes(env: dict[str, str]) -> dict[str, list[str]]:
    out = run(env, "local", "status").stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("nodes ("))
    # NAME AGENT PID CONTAINERD-PID CONTAINERD-SOCKET LAST-EXIT, the last in words; the socket left out
    return {cells[0]: cells[1:4] + cells[5:] for cells in (line.split(maxsplit=5) for line in out[start + 2:])}


def test_every_local_verb_on_a_running_stack(stack: subprocess.Popen[str], env: dict[str, str]) -> None:
    # Given a stack with one node, its agent a process of its own, pulls limited to 2MiB/s
    status = run(env, "local", "status")
    assert status.returncode == 0, status.stderr
    for endpoint in ("aws:", "kubernetes:", "registry:", "registry (nodes, limited):", "control:"):
        assert f"  {endpoint}" in status.stdout
    (first, (agent, pid, _containerd, last_exit)), = status_nodes(env).items()
    assert agent == "running" and process_running(int(pid)) and last_exit == "-"
    # and the node's own containerd socket, for crictl or ctr
    assert Path(next(w for w in status.stdout.split() if w.endswith("/containerd.sock"))).is_socket()

    # The cluster admin's kubeconfig beside the state file (the official client's view of it is tested in
    # tests/integration/cli/test_local_mode.py, kubectl's in tests/e2e/test_resource_jobs.py)
    kubeconfig = kubeconfig_path(Path(env["PREWARM_LOCAL_STATE"]))
    assert f"kubeconfig:        {kubeconfig}  (kubectl: export KUBECONFIG={kubeconfig})" in status.stdout

    # fire: each schedule runs its function on the running stack, which logs under its own name
    for schedule, function in (("repull", "repull_daily"), ("sweep", "sweep"), ("refresh", "refresh_ecr_credentials")):
        fired = run(env, "local", "fire", schedule)
        assert (fired.returncode, fired.stdout.split(":")[0]) == (0, f"fired {function}"), fired.stderr
    follow = subprocess.Popen([PREWARM, "local", "logs", "--function", "sweep", "-f"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert run(env, "local", "fire", "sweep").returncode == 0
        time.sleep(1.5)
    finally:
        follow.terminate()
    followed = [json.loads(line) for line in follow.communicate(timeout=10)[0].splitlines()]
    assert len([d for d in followed if d.get("message") == "sweep"]) == 2
    assert {d["service"] for d in followed} == {"sweep"}
    assert "hello sent" in run(env, "local", "logs", "--agent", first).stdout

    # --registry-bandwidth: a 6 MB image takes about 3 s to reach the node
    assert run(env, "--local", "apply", "-f", str(RULE)).returncode == 0
    pushed = run(env, "local", "push", "platform/slow:v1", "--size-mb", "6")
    assert pushed.returncode == 0, pushed.stderr
    job = "platform-base-" + pushed.stdout.split("@sha256:")[1][:12]
    started = time.monotonic()
    for _ in range(50):
        if job in run(env, "--local", "get", "jobs").stdout:
            break
        time.sleep(0.2)
    watched = run(env, "--local", "watch", "job", job, "--timeout", "90")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert time.monotonic() - started >= 6e6 / BANDWIDTH * 0.8

    # node add / remove, with and without an agent
    added = run(env, "local", "node", "add", "gpu-1", "--labels", "pool=gpu,node.kubernetes.io/instance-type=g5.xlarge",
                "--taint", "nvidia.com/gpu=true:NoSchedule")
    assert added.returncode == 0 and added.stdout.startswith("node/gpu-1 added, agent running (pid "), added.stderr
    bare = run(env, "local", "node", "add", "bare-1", "--no-agent")
    assert bare.stdout == "node/bare-1 added, no agent\n"
    assert run(env, "local", "node", "add", "gpu-1").returncode == 1  # already there
    nodes = status_nodes(env)
    assert nodes["gpu-1"][0] == "running" and nodes["bare-1"] == ["none", "-", "-", "-"]
    registered = run(env, "--local", "get", "node", "gpu-1").stdout.splitlines()[1].split()
    assert registered[:4] == ["gpu-1", "Registered", registered[2], "g5.xlarge"]
    assert run(env, "--local", "get", "node", "bare-1").stdout.splitlines()[1].split()[:2] == ["bare-1", "Absent"]

    # agent stop (drains and exits), start, kill (at once)
    pid = int(nodes["gpu-1"][1])
    stopped = run(env, "local", "agent", "stop", "gpu-1")
    assert stopped.stdout == "agent of gpu-1 stopped\n" and not process_running(pid)
    gpu = status_nodes(env)["gpu-1"]
    assert (gpu[:2], gpu[3]) == (["stopped", "-"], "exit code 0, on request")
    assert run(env, "local", "agent", "stop", "gpu-1").returncode == 1
    restarted = run(env, "local", "agent", "start", "gpu-1")
    new_pid = int(restarted.stdout.split("pid ")[1].rstrip(")\n"))
    assert new_pid != pid and process_running(new_pid)
    killed = run(env, "local", "agent", "kill", "gpu-1")
    assert killed.stdout == "agent of gpu-1 killed\n" and not process_running(new_pid)
    gpu = status_nodes(env)["gpu-1"]
    assert (gpu[0], gpu[3]) == ("killed", "killed by SIGKILL, on request")
    # an agent killed by someone else (kill -9, the OOM killer) is dead, not stopped (issue #25)
    restarted = run(env, "local", "agent", "start", "gpu-1")
    os.kill(int(restarted.stdout.split("pid ")[1].rstrip(")\n")), signal.SIGKILL)
    deadline = time.monotonic() + 10  # the stack notices the exit when it reaps the process
    while (gpu := status_nodes(env)["gpu-1"])[0] != "dead" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (gpu[:2], gpu[3]) == (["dead", "-"], "killed by SIGKILL, unexpectedly")
    assert run(env, "local", "agent", "start", "nope").returncode == 1

    removed = run(env, "local", "node", "remove", "gpu-1")
    assert removed.stdout == "node/gpu-1 removed with its agent and containerd\n"
    assert "gpu-1" not in status_nodes(env)

    # down returns only once the stack and every process it started have exited
    record = read_run_record(run_record_path(Path(env["PREWARM_LOCAL_STATE"])))
    assert record is not None
    down = run(env, "local", "down")
    assert down.returncode == 0, down.stderr
    assert not process_running(stack.pid)
    assert not [c for c in record.children if c.running]
    assert not Path(record.run_dir).exists() and not mounts_under(record.run_dir)
    assert not kubeconfig.exists()
    assert stack.wait(timeout=10) == 0


def test_local_down_cleans_up_after_local_up_killed_with_sigkill(env: dict[str, str]) -> None:
    # Given a stack with two nodes, killed with SIGKILL
    up = start_up(env, "--nodes", "2")
    record_path = run_record_path(Path(env["PREWARM_LOCAL_STATE"]))
    record = read_run_record(record_path)
    assert record is not None and len(record.children) == 5  # the registry, two containerds, two agents
    up.send_signal(signal.SIGKILL)
    up.wait(timeout=10)
    if up.stdout is not None:
        up.stdout.close()

    # Then its children die with it
    deadline = time.monotonic() + 10
    while [c for c in record.children if c.running] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c.name for c in record.children if c.running]

    # When local down runs
    down = run(env, "local", "down")

    # Then it says what it cleaned, and no process, mount or file is left
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith(f"local stack (pid {up.pid}) was not running (it crashed or was killed)\n")
    assert f"  removed {record.run_dir} (" in down.stdout
    kubeconfig = kubeconfig_path(Path(env["PREWARM_LOCAL_STATE"]))
    assert f"  removed its kubeconfig {kubeconfig}\n" in down.stdout
    assert not Path(record.run_dir).exists() and not mounts_under(record.run_dir)
    assert not record_path.exists() and not Path(env["PREWARM_LOCAL_STATE"]).exists() and not kubeconfig.exists()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _names(p, record.run_dir)]


def _names(proc: Path, run_dir: str) -> bool:
    try:
        return run_dir.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
