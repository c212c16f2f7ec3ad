"""The shape of the product's code: no import circles, and files that read in one sitting.

import-linter (make test's `contracts`) checks the direction of imports between layers; these checks
cover what its contracts cannot: a circle between two modules of one layer, and a file that grew.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("prewarm", "prewarm_agent", "prewarm_cli")
PRODUCT_DIRS = (ROOT / "layers/shared/python/prewarm", ROOT / "agent/prewarm_agent", ROOT / "cli/prewarm_cli",
                ROOT / "functions")
GENERATED = ROOT / "agent/prewarm_agent/cri/gen"
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


def test_the_product_has_no_import_circles() -> None:
    graph = grimp.build_graph(*PRODUCT_PACKAGES)
    assert import_circles(graph, PRODUCT_PACKAGES) == []


def test_a_circle_between_two_modules_is_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert ("p.a", "p.b", "p.c", "p.a") in import_circles(graph, ("p",))


def product_files() -> list[Path]:
    return sorted(f for d in PRODUCT_DIRS for f in d.rglob("*.py") if GENERATED not in f.parents)


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_product_file_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concern"
