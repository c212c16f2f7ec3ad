"""`prewarm demo` end to end, as a user runs it: a subprocess, real containerd and registry per node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prewarm_devtools.localmode import missing_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.node]

PREWARM = Path(sys.executable).with_name("prewarm")


@pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")
def test_demo_with_three_nodes_pulls_and_verifies_on_every_node(tmp_path: Path) -> None:
    env = {**os.environ, "PREWARM_LOCAL_STATE": str(tmp_path / "local.json")}
    command = [str(PREWARM) if PREWARM.exists() else shutil.which("prewarm") or "prewarm",
               "demo", "--nodes", "3", "--image-mb", "8", "--output", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    job = report["job"]
    assert job["name"].startswith("platform-base-")
    assert (job["desired"], job["active"], job["succeeded"], job["failed"]) == (3, 0, 3, 0)
    assert job["failedNodes"] == [] and job["message"] == "job has completed"
    assert len(report["nodes"]) == 3
    for node in report["nodes"]:
        assert node["phase"] == "Succeeded" and node["verified_present"] is True
        assert node["bytes"] > 8_000_000 and node["seconds"] >= 0
    assert report["excluded"] == []
    timings = report["timings"]
    assert 0 <= timings["push_to_first_pull_s"] <= timings["push_to_done_s"]
    assert not (tmp_path / "local.json").exists()  # torn down: no state left behind
