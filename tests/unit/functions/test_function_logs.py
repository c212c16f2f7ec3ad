"""Each function in a process of its own, as on AWS: its services' lines are JSON with its service and
the correlation keys, as its own Logger's are, not the runtime's plain text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FUNCTIONS = sorted(p.name for p in (ROOT / "functions").iterdir() if (p / "app.py").is_file())

# Imports the handler module as the Lambda runtime does (its directory first on the path), then logs
# as a service module does and as the handler does.
_RUN = """
import logging, app
logging.getLogger("prewarm.services.example").info("from a service")
app.logger.info("from the handler")
"""


@pytest.mark.parametrize("function", FUNCTIONS)
def test_a_functions_service_lines_are_json_under_its_service(function: str) -> None:
    env = {**os.environ, "POWERTOOLS_SERVICE_NAME": function, "AWS_DEFAULT_REGION": "us-west-2",
           "PYTHONPATH": str(ROOT / "layers" / "shared" / "python")}
    env.pop("POWERTOOLS_LOG_LEVEL", None)
    done = subprocess.run([sys.executable, "-c", _RUN], cwd=ROOT / "functions" / function, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # Before: the service's line was not there (the runtime's root handler, text, at WARNING here)
    assert [(d["message"], d["service"], d["name"]) for d in lines] == [
        ("from a service", function, "prewarm.services.example"), ("from the handler", function, function)], \
        done.stdout + done.stderr
