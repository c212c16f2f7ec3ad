"""The daily CLI flow against `prewarm local up` in another process: apply a rule, push, watch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prewarm_devtools.localmode import missing_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.node]

PREWARM = str(Path(sys.executable).with_name("prewarm"))
RULE = Path(__file__).resolve().parents[2] / "samplefiles" / "rules" / "platform-base.yaml"


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PREWARM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


@pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")
def test_local_up_apply_push_watch_and_down(tmp_path: Path) -> None:
    env = {**os.environ, "PREWARM_LOCAL_STATE": str(tmp_path / "local.json")}
    up = subprocess.Popen([PREWARM, "local", "up", "--nodes", "2"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "local.json").exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "local up did not start within 60 s"
            time.sleep(0.2)
        applied = run(env, "--local", "apply", "-f", str(RULE))
        assert applied.returncode == 0 and applied.stdout.strip() == "prewarmrule.prewarm.dev/platform-base created"
        pushed = run(env, "local", "push", "platform/web:v7", "--size-mb", "3")
        assert pushed.returncode == 0, pushed.stderr
        digest = pushed.stdout.split("@sha256:")[1][:12]
        job = f"platform-base-{digest}"
        for _ in range(50):
            if job in run(env, "--local", "get", "jobs").stdout:
                break
            time.sleep(0.2)
        watched = run(env, "--local", "watch", "job", job, "--timeout", "60", timeout=90)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        listed = run(env, "--local", "get", "jobs")
        row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(job))
        assert row[1:5] == ["2", "0", "2", "0"] and "completed" in listed.stdout
        untagged = run(env, "local", "push", "platform/web", "--size-mb", "1")
        assert untagged.returncode == 0  # no rule takes untagged platform pushes: nothing to wait for
        down = run(env, "local", "down")
        assert down.returncode == 0, down.stderr
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert not (tmp_path / "local.json").exists()
    assert run(env, "local", "push", "platform/web:v8").returncode == 1  # nothing running
