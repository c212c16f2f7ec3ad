"""The installed `prewarm` console script: exit codes and stderr of a real process, and a light start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration

PREWARM = Path(sys.executable).with_name("prewarm")


def _prewarm(*args: str, state_file: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENDPOINT_ENV, STACK_ENV, "PREWARM_DEBUG")}
    env[STATE_ENV] = str(state_file)
    return subprocess.run([str(PREWARM), *args], input=stdin, capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_the_console_script_applies_lists_and_reports_exit_codes(state_file: Path, tmp_path: Path) -> None:
    # Given a valid job on stdin, a file that is not YAML, and a job that does not exist
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")

    # When the installed script runs each
    applied = _prewarm("--local", "apply", "-f", "-", state_file=state_file, stdin=job_yaml("entry-web"))
    listed = _prewarm("get", "jobs", "entry-web", "--local", state_file=state_file)
    invalid = _prewarm("--local", "apply", "-f", str(bad), state_file=state_file)
    missing = _prewarm("--local", "describe", "job", "entry-missing", state_file=state_file)

    # Then the exit codes are 0, 0, 2 and 1, and every error is one line without a traceback
    assert (applied.returncode, applied.stdout) == (0, "imagepulljob.apps.kruise.io/entry-web created\n")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].startswith("entry-web ")
    assert invalid.returncode == 2
    assert invalid.stderr.count("\n") == 1 and invalid.stderr.startswith(f"error: {bad}: invalid YAML")
    assert missing.returncode == 1
    assert missing.stderr == 'error: job "entry-missing" not found in namespace "default"\n'


def test_an_unknown_option_is_one_line_with_exit_code_2(state_file: Path) -> None:
    result = _prewarm("get", "jobs", "--frobnicate", state_file=state_file)

    assert result.returncode == 2
    assert result.stderr == "error: No such option '--frobnicate' (see 'prewarm get --help')\n"


def test_help_and_version_load_neither_boto3_nor_pydantic_nor_rich() -> None:
    # Given the CLI started for --help in a fresh interpreter
    probe = (
        "import sys\n"
        "from prewarm_cli.app import cli\n"
        "code = cli.main(['--help'], standalone_mode=False)\n"
        "heavy = sorted(m for m in ('boto3', 'botocore', 'pydantic', 'rich', 'yaml') if m in sys.modules)\n"
        "print('loaded:', ','.join(heavy) or 'none')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    version = subprocess.run([str(PREWARM), "--version"], capture_output=True, text=True, timeout=60, check=False)

    # Then no heavy module was imported, and the version is the package's
    assert result.stdout.splitlines()[-1] == "loaded: none"
    assert version.returncode == 0 and version.stdout.startswith("prewarm ")
