"""The services' unit tests run on the in-memory store and queues: no test here imports moto or boto3, not
even through what it imports. What needs them belongs in tests/unit/adapters (or tests/unit/functions)."""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

FORBIDDEN = {"moto", "boto3"}
# Followed through their imports; anything else (the standard library, pydantic, ...) is not.
FIRST_PARTY = {"tests", "prewarm", "prewarm_agent", "prewarm_cli", "prewarm_devtools", "benchmarks"}
HERE = Path(__file__).parent


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _statements(body: list[ast.stmt], *, everywhere: bool) -> Iterator[ast.stmt]:
    """The statements run when the module is imported (`everywhere`: in its functions too)."""
    for node in body:
        if _is_type_checking(node):
            continue
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not everywhere:
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements([n for n in inner if isinstance(n, ast.stmt | ast.ExceptHandler)],  # type: ignore[misc]
                                       everywhere=everywhere)


@functools.cache
def imported(module: str, path: Path, *, everywhere: bool) -> frozenset[str]:
    """The modules `path` (module `module`) imports: `from a import b` counts `a` and `a.b`."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _statements(ast.parse(path.read_text()).body, everywhere=everywhere):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


@functools.cache
def _package_dir(root: str) -> Path | None:
    spec = importlib.util.find_spec(root)  # a top-level name: found without importing anything
    return Path(spec.origin).parent if spec is not None and spec.origin else None


@functools.cache
def _source(module: str) -> Path | None:
    """The file of a first-party module, found on disk (`find_spec` would import its parents)."""
    root, *rest = module.split(".")
    base = _package_dir(root)
    if base is None:
        return None
    for candidate in (base.joinpath(*rest).with_suffix(".py") if rest else None, base.joinpath(*rest, "__init__.py")):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def forbidden_imports(test_file: Path) -> list[str]:
    """Each chain of imports from `test_file` that reaches moto or boto3."""
    start = f"tests.unit.services.{test_file.stem}"
    chains: dict[str, list[str]] = {start: [start]}
    pending: list[tuple[str, Path, bool]] = [(start, test_file, True)]
    found: list[str] = []
    while pending:
        module, path, everywhere = pending.pop()
        named = imported(module, path, everywhere=everywhere)
        # importing `a.b.c` runs `a` and `a.b` first
        parents = {".".join(n.split(".")[:i]) for n in named for i in range(1, n.count(".") + 1)}
        for name in sorted(named | parents):
            root = name.split(".")[0]
            if root in FORBIDDEN:
                found.append(" -> ".join([*chains[module], name]))
            elif root in FIRST_PARTY and name not in chains and (source := _source(name)) is not None:
                chains[name] = [*chains[module], name]
                pending.append((name, source, False))
    return found


def test_no_services_test_imports_moto_or_boto3() -> None:
    files = sorted(HERE.glob("*.py"))
    assert any(f.name == "conftest.py" for f in files)
    found = {f.name: forbidden_imports(f) for f in files}
    assert {name: chains for name, chains in found.items() if chains} == {}


def test_the_check_finds_moto_and_boto3_through_what_a_test_imports(tmp_path: Path) -> None:
    direct = tmp_path / "test_direct.py"
    direct.write_text("def test_x():\n    import moto\n")
    through = tmp_path / "test_through.py"
    through.write_text("from tests.support.aws import mocked_aws\n")  # which imports boto3 and moto
    typing_only = tmp_path / "test_typing.py"
    typing_only.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import boto3\n")
    assert forbidden_imports(direct) == ["tests.unit.services.test_direct -> moto"]
    assert "tests.unit.services.test_through -> tests.support.aws -> boto3" in forbidden_imports(through)
    assert forbidden_imports(typing_only) == []
