"""Where local mode finds the project's own files: `template.yaml`, `events/`, `samplefiles/`, `functions/`.

An installed wheel carries them as package data in `prewarm_devtools/_project/` (setup.py copies
them there when it builds); a source checkout, editable install included, reads them where they are
in the repository. The SAM emulator loads each function from `root / CodeUri`, so both places keep
the repository's layout.

>>> files = project_files()
>>> files.template.name
'template.yaml'
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Copied into the wheel by setup.py; the checkout keeps them at its top level.
PACKAGED = Path(__file__).resolve().parent / "_project"
CHECKOUT = Path(__file__).resolve().parents[2]


class ProjectFilesError(RuntimeError):
    """Neither the installed package nor a source checkout holds the project's files."""


@dataclass(frozen=True)
class ProjectFiles:
    """The project's files under one root, laid out as in the repository."""

    root: Path

    @property
    def template(self) -> Path:
        return self.root / "template.yaml"

    @property
    def events(self) -> Path:
        return self.root / "events"

    @property
    def samplefiles(self) -> Path:
        return self.root / "samplefiles"

    @property
    def functions(self) -> Path:
        return self.root / "functions"


@cache
def project_files() -> ProjectFiles:
    """The installed copy when the package carries one, otherwise the source checkout it was imported from."""
    for root in (PACKAGED, CHECKOUT):
        if (root / "template.yaml").is_file() and (root / "functions").is_dir():
            return ProjectFiles(root)
    raise ProjectFilesError(
        f"template.yaml and functions/ are neither in {PACKAGED} nor in {CHECKOUT}: reinstall prewarm from "
        "a wheel built by `pip wheel .` in the repository, or install the checkout with `pip install -e .`"
    )
