"""The shape of the code: no import circles, files that read in one sitting, and tools no larger than the product.

import-linter (make test's `contracts`) checks the direction of imports between layers; these checks
cover what its contracts cannot: a circle between two modules of one layer, a file that grew, and dev
tools that outgrow what they serve. They hold for every tree but tests/: the product, the dev tools and
the benchmarks.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every package outside tests/: the product's, the dev tools' and the benchmarks'.
PACKAGES = ("prewarm", "prewarm_agent", "prewarm_cli", "prewarm_devtools", "benchmarks")
PRODUCT_DIRS = (ROOT / "layers/shared/python/prewarm", ROOT / "agent/prewarm_agent", ROOT / "cli/prewarm_cli",
                ROOT / "functions")
DEVTOOLS_DIR = ROOT / "devtools/prewarm_devtools"
GENERATED = ROOT / "agent/prewarm_agent/cri/gen"
# Not code of the project: tests, build output, virtual environments and other hidden directories.
NOT_CODE = {"tests", "build", "__pycache__", "node_modules"}
MAX_LINES = 600


def import_circles(graph: grimp.ImportGraph, packages: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each pair of modules that import each other, directly or through others (the shortest chain)."""
    modules = sorted(m for m in graph.modules if m.split(".")[0] in packages)
    circles = []
    for module in modules:
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.split(".")[0] not in packages or imported == module:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append((module, *back))
    return circles


@cache
def graph() -> grimp.ImportGraph:
    # Without grimp's cache: graphs of other package sets (lint-imports') share its per-package mtimes, so a
    # cached graph can miss a change another build already recorded. Building it takes well under a second.
    return grimp.build_graph(*PACKAGES, cache_dir=None)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package: str) -> None:
    assert import_circles(graph(), (package,)) == []


def test_a_circle_between_two_modules_is_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert ("p.a", "p.b", "p.c", "p.a") in import_circles(graph, ("p",))


def is_code(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return (GENERATED not in path.parents and not NOT_CODE.intersection(parts)
            and not any(part.startswith(".") for part in parts))


def code_files() -> list[Path]:
    """Every Python file of the project outside tests/ (generated code excluded)."""
    return sorted(f for f in ROOT.rglob("*.py") if is_code(f))


def lines_of(*dirs: Path) -> int:
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for d in dirs for f in d.rglob("*.py") if is_code(f))


@pytest.mark.parametrize("path", code_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concern"


def test_the_dev_tools_are_no_larger_than_the_product() -> None:
    # The dev tools serve the product's tests; docs/architecture.md ("Code layout") keeps both figures.
    product, devtools = lines_of(*PRODUCT_DIRS), lines_of(DEVTOOLS_DIR)
    assert devtools <= product, (f"devtools/prewarm_devtools has {devtools:,} lines, the product {product:,}: "
                                 "the dev tools must not outgrow what they serve")
