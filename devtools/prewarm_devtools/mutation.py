"""Mutation testing of the domain rules (`make mutate`): how many small changes to a module its tests catch.

mutmut 3 copies the code it mutates into `mutants/` and finds it there only under `./`, `src/` or
`source/`, while the shared package lives under `layers/shared/python`. So each module is run in a
staging directory of its own, `build/mutation/<name>/`, holding the package as `src/prewarm`, a copy of
`tests/`, and a `pyproject.toml` that tells mutmut which file to mutate and which tests cover it.

The score counts a mutant as caught when a test fails or times out, and leaves out the mutants listed in
`tests/mutation/equivalent.txt`: changes no test can tell apart, each with its reason. An entry names the
mutant and the changed line; an entry whose line no longer matches (the function changed, mutmut
numbered its mutants anew) is stale, excludes nothing, and fails the run until it is corrected.

`--changed` runs only the modules whose source or tests differ from what `tests/mutation/checked.txt`
records (a digest per module, written by a run that reached its goal), so it needs no git history: CI
runs it in a fresh clone (.ci/run), and it is a no-op when no such module changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "shared" / "python" / "prewarm"
EQUIVALENT_FILE = ROOT / "tests" / "mutation" / "equivalent.txt"
CHECKED_FILE = ROOT / "tests" / "mutation" / "checked.txt"
WORK = ROOT / "build" / "mutation"
# The import paths the tests need besides the shared package (which the staging directory provides).
OTHER_SOURCES = ("agent", "cli", "devtools")
GOAL_PERCENT = 95.0
# Each survivor is shown as a diff; past this many (a baseline), the rest are counted.
SHOWN_SURVIVORS = 40
HYPOTHESIS_PLUGIN = "prewarm_devtools.pytest_plugins.mutation_hypothesis"

# mutmut's exit codes per mutant (mutmut/stats.py): a failing test (1, or 3 for a pytest internal error)
# or a timeout catches it; 0 is a survivor; 33 and 5 mean no selected test ran the mutated function.
_CAUGHT = {1, 3, 36, 24, -24, 152, 255}
_SURVIVED = {0}
_NO_TESTS = {5, 33}


@dataclass(frozen=True)
class Target:
    """A module to mutate (relative to the package), the fast tests that cover it, and its goal."""

    module: str
    tests: tuple[str, ...]
    goal: float | None = GOAL_PERCENT

    @property
    def mutant_prefix(self) -> str:
        return "prewarm." + self.module.removesuffix(".py").replace("/", ".") + "."


TARGETS: dict[str, Target] = {
    "status": Target("domain/status.py", (
        "tests/unit/domain/test_status.py", "tests/unit/domain/test_status_properties.py",
        "tests/unit/domain/test_counting_rules.py", "tests/unit/domain/test_waves.py",
    )),
    "placement": Target("domain/placement.py", (
        "tests/unit/domain/test_placement.py", "tests/unit/domain/test_placement_properties.py",
        "tests/unit/domain/test_agent_placement.py", "tests/unit/domain/test_placement_rules.py",
        "tests/unit/domain/test_waves.py",
    )),
    "images": Target("domain/images.py", (
        "tests/unit/domain/test_images.py", "tests/unit/domain/test_images_properties.py",
        "tests/unit/domain/test_image_reference_errors.py",
    )),
    "job": Target("domain/job.py", ("tests/unit/domain/test_stored_job.py",)),
    # Services, with their moto-backed tests: a baseline, no goal yet (docs/performance.md).
    "reports": Target("services/reports.py", ("tests/unit/services/test_control_plane.py",), goal=None),
    "dispatch": Target("services/dispatch.py", ("tests/unit/services/test_control_plane.py",), goal=None),
}
DEFAULT_TARGETS = ("status", "placement", "images", "job")


class MutationError(RuntimeError):
    """The run could not be made or read (a tool failure, not a low score)."""


# --- equivalent mutants -------------------------------------------------------------------------


@dataclass(frozen=True)
class Equivalent:
    """`<mutant> | <changed line as mutated> | <reason>`: the line guards against a renumbered mutant."""

    mutant: str
    line: str
    reason: str


def read_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, Equivalent]:
    entries: dict[str, Equivalent] = {}
    if not path.exists():
        return entries
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        # The code line may hold " | " itself (`int | None`): the mutant is first, the reason last.
        mutant, _, rest = text.partition(" | ")
        line, _, reason = rest.rpartition(" | ")
        mutant, line, reason = mutant.strip(), line.strip(), reason.strip()
        if not (mutant and line and reason):
            raise MutationError(f"{path}:{number}: expected `<mutant> | <mutated line> | <reason>`, got {text!r}")
        if mutant in entries:
            raise MutationError(f"{path}:{number}: {mutant} is listed twice")
        entries[mutant] = Equivalent(mutant, line, reason)
    return entries


def mutated_lines(diff: str) -> list[str]:
    """The lines a mutant adds, stripped, from `mutmut show`'s unified diff."""
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


# --- digests: what a run checked ----------------------------------------------------------------


def digest(target: Target, root: Path = ROOT) -> str:
    """A digest of the module's source and its tests' files: a change to either asks for a new run."""
    h = hashlib.sha256()
    paths = [root / "layers/shared/python/prewarm" / target.module, *(root / t for t in target.tests)]
    for path in [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() if path.exists() else b"<missing>")
        h.update(b"\0")
    return h.hexdigest()[:16]


def read_checked(path: Path = CHECKED_FILE) -> dict[str, tuple[str, str]]:
    """`<module> <digest> <score ...>` lines: the digest each module had when a run reached its goal."""
    checked: dict[str, tuple[str, str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
        if line.strip() and not line.startswith("#"):
            name, value, *score = line.split()
            checked[name] = (value, " ".join(score))
    return checked


def write_checked(results: Iterable[ModuleResult], path: Path = CHECKED_FILE, root: Path = ROOT) -> None:
    checked = read_checked(path)
    for result in results:
        checked[result.name] = (digest(result.target, root),
                                f"{result.score:.1f}% ({result.caught}/{result.counted})")
    lines = ["# Written by `make mutate` on reaching the goal: <module> <digest of module and tests> <score>.",
             "# `make mutate-changed` (CI) runs the modules whose digest differs: commit this file with the change."]
    lines += [f"{name} {value} {score}".rstrip() for name, (value, score) in sorted(checked.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def changed_targets(names: Sequence[str], checked_file: Path = CHECKED_FILE, root: Path = ROOT) -> list[str]:
    """Of `names`, the modules whose source or tests differ from the last run that reached its goal."""
    checked = read_checked(checked_file)
    return [name for name in names if checked.get(name, ("", ""))[0] != digest(TARGETS[name], root)]


# --- one module's run ---------------------------------------------------------------------------


@dataclass
class ModuleResult:
    name: str
    target: Target
    total: int
    caught: int
    survivors: list[str]
    no_tests: list[str]
    equivalent: list[str]
    stale: list[str]
    seconds: float

    @property
    def counted(self) -> int:
        return self.total - len(self.equivalent)

    @property
    def score(self) -> float:
        return 100.0 * self.caught / self.counted if self.counted else 100.0

    @property
    def passed(self) -> bool:
        return not self.stale and (self.target.goal is None or self.score >= self.target.goal)


def _stage(name: str, target: Target) -> Path:
    stage = WORK / name
    shutil.rmtree(stage, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    shutil.copytree(PACKAGE, stage / "src" / "prewarm", ignore=ignore)
    shutil.copytree(ROOT / "tests", stage / "tests", ignore=ignore)
    for test in target.tests:
        if not (ROOT / test).exists():
            raise MutationError(f"{name}: test file {test} does not exist")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_options = project["tool"]["pytest"]["ini_options"]
    config = {
        "source_paths": ["src"],
        "only_mutate": [f"src/prewarm/{target.module}"],
        # Forked per mutant, so no xdist; Hypothesis derandomised and without deadlines (HYPOTHESIS_PLUGIN).
        "pytest_add_cli_args": ["-p", "no:xdist", "-p", "no:cacheprovider", "-p", HYPOTHESIS_PLUGIN, "-q"],
        "pytest_add_cli_args_test_selection": list(target.tests),
        "use_git_change_detection": False,
    }
    (stage / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n" + _toml_table(pytest_options) + "\n[tool.mutmut]\n" + _toml_table(config),
        encoding="utf-8",
    )
    return stage


def _toml_table(values: dict[str, object]) -> str:
    # json's strings, numbers, booleans and lists are valid TOML values.
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The shared package must come from the staging directory's mutants/, never from a checkout's.
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not (Path(p) / "prewarm").is_dir()]
    env["PYTHONPATH"] = os.pathsep.join([*(str(ROOT / p) for p in OTHER_SOURCES), *kept])
    return env


def _mutmut(stage: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=stage, env=_env(), text=True,
                          capture_output=capture, check=False)


def run_module(name: str, max_children: int, equivalents: dict[str, Equivalent]) -> ModuleResult:
    target = TARGETS[name]
    stage = _stage(name, target)
    started = time.monotonic()
    log = stage / "mutmut.log"
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)],
                              cwd=stage, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True, check=False)
    seconds = time.monotonic() - started
    meta = stage / "mutants" / "src" / "prewarm" / (target.module + ".meta")
    if proc.returncode != 0 or not meta.exists():
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise MutationError(f"{name}: mutmut run failed (exit {proc.returncode}); the end of {log}:\n{tail}")
    codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    unchecked = [m for m, code in codes.items() if code is None]
    if unchecked:
        raise MutationError(f"{name}: {len(unchecked)} mutants were not run, e.g. {unchecked[0]} (see {log})")
    survivors = sorted(m for m, code in codes.items() if code in _SURVIVED)
    no_tests = sorted(m for m, code in codes.items() if code in _NO_TESTS)
    caught = sum(1 for code in codes.values() if code in _CAUGHT)
    equivalent, stale = [], []
    for mutant, entry in equivalents.items():
        if not mutant.startswith(target.mutant_prefix):
            continue
        if mutant not in codes:
            stale.append(f"{mutant}: no such mutant")
        elif entry.line not in mutated_lines(_mutmut(stage, "show", mutant, capture=True).stdout):
            stale.append(f"{mutant}: its mutated line is no longer `{entry.line}`")
        elif codes[mutant] in _CAUGHT:
            # Counted as caught, not left out: a test that fails on it (or a timeout on a loaded machine).
            print(f"  note: {mutant} is listed as equivalent but was caught; check its entry", flush=True)
        else:
            equivalent.append(mutant)
    listed = set(equivalent)
    return ModuleResult(name, target, total=len(codes), caught=caught,
                        survivors=[m for m in survivors if m not in listed],
                        no_tests=[m for m in no_tests if m not in listed], equivalent=equivalent, stale=stale,
                        seconds=seconds)


def _show(stage: Path, mutant: str) -> str:
    diff = _mutmut(stage, "show", mutant, capture=True).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return "\n".join(f"      {line}" for line in changed)


def report(results: Sequence[ModuleResult]) -> str:
    lines = [f"{'module':<22} {'mutants':>7} {'equiv.':>6} {'caught':>6} {'score':>7}  goal    time"]
    for r in results:
        goal = f"{r.target.goal:.0f} %" if r.target.goal is not None else "none"
        verdict = "" if r.passed else "  BELOW GOAL" if not r.stale else "  STALE EQUIVALENTS"
        lines.append(f"{r.target.module:<22} {r.total:>7} {len(r.equivalent):>6} {r.caught:>6} {r.score:>6.1f}%"
                     f"  {goal:<6} {r.seconds:>5.0f} s{verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prewarm_devtools.mutation", description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(TARGETS)} (default: {' '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--changed", action="store_true",
                        help="only the modules whose source or tests differ from tests/mutation/checked.txt")
    parser.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--no-record", action="store_true", help="do not update tests/mutation/checked.txt")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    if args.max_children < 1:
        parser.error(f"--max-children must be >= 1, got {args.max_children}")
    names = list(args.modules or DEFAULT_TARGETS)
    if args.changed:
        names = changed_targets(names)
        if not names:
            print("mutation testing: no module changed since tests/mutation/checked.txt; nothing to run")
            return 0
    try:
        equivalents = read_equivalents()
        results = []
        for name in names:
            print(f"mutation testing {TARGETS[name].module} with {' '.join(TARGETS[name].tests)}", flush=True)
            result = run_module(name, args.max_children, equivalents)
            results.append(result)
            stage = WORK / name
            missed = result.survivors + result.no_tests
            for mutant in missed[:SHOWN_SURVIVORS]:
                kind = "survived" if mutant in result.survivors else "no test ran it"
                print(f"  {kind}: {mutant}\n{_show(stage, mutant)}", flush=True)
            if len(missed) > SHOWN_SURVIVORS:
                print(f"  ... and {len(missed) - SHOWN_SURVIVORS} more: `python -m mutmut results` in {stage}")
            for problem in result.stale:
                print(f"  stale entry in {EQUIVALENT_FILE.relative_to(ROOT)}: {problem}", flush=True)
    except MutationError as e:
        print(f"mutation testing: {e}", file=sys.stderr)
        return 2
    print(report(results))
    passed = [r for r in results if r.passed and r.target.goal is not None]
    if passed and not args.no_record:
        write_checked(passed)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
