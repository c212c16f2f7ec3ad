"""Packs the project's own files into the wheel, so `pip install .` runs local mode outside a checkout.

Local mode deploys `template.yaml`, loads each function from its `CodeUri` under `functions/`,
seeds from `samplefiles/` and replays `events/`. A wheel carries them in
`prewarm_devtools/_project/`, laid out as in the repository (see `prewarm_devtools.project`).
An editable install reads them in the checkout, so nothing is copied for it. Everything else
about the package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROJECT_FILES = ("template.yaml", "events", "samplefiles", "functions")
PACKAGED = Path("prewarm_devtools") / "_project"


class BuildPyWithProjectFiles(build_py):
    """`build_py`, then the project's files copied into `prewarm_devtools/_project/`."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / PACKAGED
        shutil.rmtree(target, ignore_errors=True)
        for name in PROJECT_FILES:
            source = HERE / name
            if not source.exists():
                raise FileNotFoundError(f"{source} is missing: the wheel needs it for local mode")
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildPyWithProjectFiles})
