"""`prewarm local node add --image REF`: the images go to the local stack's control server, which pulls
them into the node's containerd before its agent starts (tests/e2e/test_boot_warm.py runs that part)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from prewarm_devtools import commands


def test_each_image_goes_with_the_node_to_the_control_server(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, str, dict[str, Any] | None]] = []

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        sent.append((method, path, body))
        return {"agent": "running", "pid": 42}

    monkeypatch.setattr(commands, "_call", call)
    result = CliRunner().invoke(commands.local, ["node", "add", "gpu-1", "--labels", "pool=gpu",
                                                 "--image", "host/ml/torch@sha256:" + "a" * 64, "--image", "busybox:1"])

    assert result.exit_code == 0, result.output
    ((method, path, body),) = sent
    assert (method, path) == ("POST", "/nodes")
    assert body is not None and body["images"] == ["host/ml/torch@sha256:" + "a" * 64, "busybox:1"]
    assert "node/gpu-1 added, agent running (pid 42)" in result.output
