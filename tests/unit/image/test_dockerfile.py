"""agent/Dockerfile builds from a clean clone: every file it copies is in the build context."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from prewarm_devtools.agent_image import ROOT, Dockerfile


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` (or a folder above it) out of the build context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(p, pattern.removeprefix("**/")) or fnmatch.fnmatch(p, pattern)
               for pattern in patterns for p in prefixes)


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("source", Dockerfile.read().context_sources())
def test_every_copy_source_is_in_the_build_context(source: str) -> None:
    assert (ROOT / source).exists(), f"agent/Dockerfile copies {source}, which the repository does not have"
    assert not ignored(source, dockerignore()), f"agent/Dockerfile copies {source}, which .dockerignore leaves out"


def test_the_sources_of_a_copy_are_read_from_every_form() -> None:
    dockerfile = Dockerfile.parse(
        "FROM a AS build\nCOPY pyproject.toml README.md ./\nCOPY --chown=0:0 agent/x agent/x\n"
        'ADD ["layers/y", "/y"]\nFROM b\nCOPY --from=build /wheels /wheels\n'
        "ENV A=1 \\\n    B=2\nUSER 0:0\nEXPOSE 9102\nENTRYPOINT [\"prewarm-agent\"]\n"
    )
    assert dockerfile.context_sources() == ["pyproject.toml", "README.md", "agent/x", "layers/y"]
    assert dockerfile.final.env == {"A": "1", "B": "2"}
    assert (dockerfile.final.user, dockerfile.final.exposed, dockerfile.final.entrypoint) == (
        "0:0", ["9102/tcp"], ["prewarm-agent"])


def test_a_source_missing_from_the_repository_is_named(tmp_path: Path) -> None:
    dockerfile = Dockerfile.parse("FROM a\nCOPY local/prewarm_local local/prewarm_local\n")
    missing = [s for s in dockerfile.context_sources() if not (ROOT / s).exists()]
    assert missing == ["local/prewarm_local"]
