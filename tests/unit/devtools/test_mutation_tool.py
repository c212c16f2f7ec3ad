"""`make mutate`'s own rules: the equivalent-mutant list, the digests that decide what CI re-runs, scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from prewarm_devtools import mutation
from prewarm_devtools.mutation import (
    TARGETS,
    ModuleResult,
    MutationError,
    changed_targets,
    mutated_lines,
    read_equivalents,
    write_checked,
)


def test_every_target_names_a_module_and_tests_that_exist() -> None:
    for name, target in TARGETS.items():
        assert (mutation.PACKAGE / target.module).is_file(), name
        assert all((mutation.ROOT / test).exists() for test in target.tests), name
    assert {"status", "placement", "images", "job"} <= {n for n, t in TARGETS.items() if t.goal == 95.0}


def test_the_shipped_equivalent_list_reads_and_names_only_known_modules() -> None:
    prefixes = tuple(t.mutant_prefix for t in TARGETS.values())
    for mutant, entry in read_equivalents().items():
        assert mutant.startswith(prefixes) and "__mutmut_" in mutant
        assert entry.line and entry.reason


def test_an_equivalent_entry_needs_the_mutant_its_line_and_a_reason(tmp_path: Path) -> None:
    listed = tmp_path / "equivalent.txt"
    listed.write_text("# comment\n\nprewarm.domain.x.x_f__mutmut_1 | a = 1 | a is never read\n")
    assert read_equivalents(listed)["prewarm.domain.x.x_f__mutmut_1"].reason == "a is never read"
    listed.write_text("m__mutmut_2 | x: int | None = 1 | x is never read\n")
    assert read_equivalents(listed)["m__mutmut_2"].line == "x: int | None = 1"
    listed.write_text("prewarm.domain.x.x_f__mutmut_1 | a = 1\n")
    with pytest.raises(MutationError, match=r"equivalent.txt:1: expected `<mutant> \| <mutated line> \| <reason>`"):
        read_equivalents(listed)
    listed.write_text("m__mutmut_1 | a | why\nm__mutmut_1 | a | why\n")
    with pytest.raises(MutationError, match="m__mutmut_1 is listed twice"):
        read_equivalents(listed)


def test_the_mutated_line_is_read_from_mutmuts_diff() -> None:
    diff = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    x = 1\n+    x = 2\n"
    assert mutated_lines(diff) == ["x = 2"]


def test_only_modules_whose_source_or_tests_changed_since_their_recorded_run_are_rerun(tmp_path: Path) -> None:
    root = tmp_path
    for rel in ["layers/shared/python/prewarm/domain/status.py", *TARGETS["status"].tests,
                "layers/shared/python/prewarm/domain/images.py", *TARGETS["images"].tests]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# v1\n")
    checked = root / "checked.txt"
    assert changed_targets(["status", "images"], checked, root) == ["status", "images"]

    def result(name: str) -> ModuleResult:
        return ModuleResult(name, TARGETS[name], total=10, caught=10, survivors=[], no_tests=[], equivalent=[],
                            stale=[], seconds=1.0)

    write_checked([result("status"), result("images")], checked, root)
    assert changed_targets(["status", "images"], checked, root) == []
    assert "status " in checked.read_text() and "100.0% (10/10)" in checked.read_text()
    (root / TARGETS["images"].tests[0]).write_text("# v2: a test changed\n")
    assert changed_targets(["status", "images"], checked, root) == ["images"]
    (root / "layers/shared/python/prewarm/domain/status.py").write_text("# v2\n")
    assert changed_targets(["status", "images"], checked, root) == ["status", "images"]


def test_the_score_leaves_out_equivalent_mutants_and_a_stale_entry_fails_the_run() -> None:
    r = ModuleResult("status", TARGETS["status"], total=100, caught=95, survivors=["a"], no_tests=[],
                     equivalent=["b", "c", "d", "e"], stale=[], seconds=1.0)
    assert (r.counted, round(r.score, 1), r.passed) == (96, 99.0, True)
    below = ModuleResult("status", TARGETS["status"], total=100, caught=90, survivors=["a"] * 10, no_tests=[],
                         equivalent=[], stale=[], seconds=1.0)
    assert not below.passed
    stale = ModuleResult("status", TARGETS["status"], total=10, caught=10, survivors=[], no_tests=[], equivalent=[],
                         stale=["x: no such mutant"], seconds=1.0)
    assert not stale.passed
    baseline = ModuleResult("reports", TARGETS["reports"], total=10, caught=1, survivors=[], no_tests=[],
                            equivalent=[], stale=[], seconds=1.0)
    assert baseline.passed  # the services have no goal yet


def test_unknown_modules_and_bad_process_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        mutation.main(["nosuch"])
    assert "unknown module nosuch: choose from status" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mutation.main(["--max-children", "0"])
    assert "--max-children must be >= 1, got 0" in capsys.readouterr().err
