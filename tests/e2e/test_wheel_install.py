"""`pip install` of the wheel works outside a checkout: the CLI runs and local mode finds its files.

The wheel is built from a copy of the checkout (so no `build/` is left in the repository) and
installed without its dependencies into a fresh venv in a temporary directory; the third-party
packages come from this venv's site-packages through a `.pth` line, which adds them as plain
paths (this venv's editable install of prewarm stays out of it). Every command runs from a
temporary working directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from prewarm_devtools import project_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHECKOUT = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                    ".*_cache", ".hypothesis", ".aws-sam", "tmp")

# Run by the installed interpreter: where its packages and the project's files are, and a deploy
# of template.yaml on a moto server whose ECR push handler is loaded from the installed functions/.
PROBE = """
import json, pathlib, prewarm, prewarm_cli, prewarm_devtools
from prewarm_devtools import project_files
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack

files = project_files()
with MotoServer() as aws, aws_environment(aws.url):
    stack = LocalStack(aws.url, parameters={"ClusterName": "local"}).deploy()
    stack.invoke("on_image_push", json.loads((files.events / "ecr_push.json").read_text()))
    handler = stack.function("on_image_push").handler_file
    stack.stop()
print(json.dumps({
    "packages": [prewarm.__file__, prewarm_cli.__file__, prewarm_devtools.__file__],
    "files": [str(files.template), str(files.events), str(files.samplefiles), str(files.functions)],
    "functions": sorted(p.parent.name for p in files.functions.glob("*/app.py")),
    "rules": sorted(p.name for p in (files.samplefiles / "rules").glob("*.yaml")),
    "handler": handler,
}))
"""


def run(command: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv, outside the repository, with the wheel built from this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PIP_REQUIRE_VIRTUALENV"}}
    source = tmp / "source"
    shutil.copytree(CHECKOUT, source, ignore=NOT_SOURCE)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist",
         source], tmp, env)
    (wheel,) = (tmp / "dist").glob("prewarm-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, env)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        tmp, env)
    site_packages = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp, env)
                         .strip())
    (site_packages / "project_venv_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.fixture
def elsewhere(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the repository, and an environment without PYTHONPATH."""
    return tmp_path, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_installed_cli_has_the_local_mode_commands(installed: Path, elsewhere: tuple[Path, dict[str, str]]) -> None:
    cwd, env = elsewhere
    # When the installed `prewarm` is asked for the plugin commands' help
    demo = run([installed / "bin" / "prewarm", "demo", "--help"], cwd, env)
    up = run([installed / "bin" / "prewarm", "local", "up", "--help"], cwd, env)
    # Then both answer
    assert "Usage: prewarm demo" in demo
    assert "Usage: prewarm local up" in up and "--nodes" in up


def test_installed_package_finds_the_project_files_in_its_own_tree(
    installed: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = elsewhere
    # When the installed package deploys template.yaml locally and runs the push handler
    found = json.loads(run([installed / "bin" / "python", "-c", PROBE], cwd, env).strip().splitlines()[-1])
    # Then the code, the project's files and the handler all come from the installed tree, not the checkout
    for path in [*found["packages"], *found["files"], found["handler"]]:
        assert Path(path).is_relative_to(installed), f"{path} is outside the installed venv {installed}"
        assert Path(path).exists()
    # And they are the checkout's files, all of them
    checkout = project_files()
    assert found["functions"] == sorted(p.parent.name for p in checkout.functions.glob("*/app.py"))
    assert found["rules"] == sorted(p.name for p in (checkout.samplefiles / "rules").glob("*.yaml"))
