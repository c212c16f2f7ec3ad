"""The Lambda layers hold only code the functions' runtime loads, and fit Lambda's size limit (issue #24, 3).

The deps layer is built from PyPI once for the module, by layers/deps/Makefile's own `pip install` line
(`prewarm_devtools.lambda_layers`), and every compiled extension and wheel in it is checked against the
Architectures and Runtime of the functions that use it. The inspector's rule is proven on small
synthetic layers: ELF headers written to files named as extensions, and wheels' `WHEEL` files.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prewarm_devtools.lambda_layers import (
    DEPS_LAYER,
    MB,
    UNZIPPED_LIMIT_BYTES,
    Report,
    check_compiled_code,
    check_layers,
    deps_install_command,
    deps_platforms,
    template_functions,
    wiring_problems,
)

pytestmark = pytest.mark.integration

EM_X86_64 = 62
EM_AARCH64 = 183


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    started = time.monotonic()
    built = check_layers(tmp_path_factory.mktemp("lambda-layers"))
    print(f"\nlayers built and checked in {time.monotonic() - started:.1f} s (build {built.build_seconds:.1f} s; "
          f"deps layer for {built.platform})")
    return built


def deps_layer_id(report: Report) -> str:
    layer_id: str = next(layer.logical_id for fn in report.functions for layer in fn.layers
                         if layer.content_uri == DEPS_LAYER)
    return layer_id


def write_extension(layer: Path, name: str, e_machine: int) -> None:
    """A file named as a compiled extension with a 64-bit little-endian ELF header (shared object)."""
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + (3).to_bytes(2, "little") + e_machine.to_bytes(2, "little")
    path = layer / "python" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + bytes(44))


def write_wheel(layer: Path, dist: str, *tags: str) -> None:
    info = layer / "python" / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                + "".join(f"Tag: {tag}\n" for tag in tags))


# --- The built layers ------------------------------------------------------------------------------------


def test_every_compiled_extension_in_the_built_deps_layer_is_for_its_functions_architecture_and_python(
    report: Report,
) -> None:
    layer_id = deps_layer_id(report)
    checks = {key: check for key, check in report.checks.items() if key[0] == layer_id}
    assert checks, f"no function uses {layer_id}"
    for (_, arch, python), check in checks.items():
        print(f"\n{layer_id} for {arch}, Python {python}: {check.extensions} compiled extensions "
              f"({check.abi3_extensions} abi3), {check.wheels} wheels ({check.pure_wheels} pure), "
              f"{len(check.problems)} problems")
        # pydantic-core and PyYAML ship compiled code: none found means the check read nothing.
        assert check.extensions > 0 and check.wheels > check.pure_wheels
        assert not check.problems, "\n".join(map(str, check.problems))


def test_every_function_with_its_layers_is_under_lambdas_250_mb_unzipped(report: Report) -> None:
    print()
    for size in report.sizes:
        layers = ", ".join(f"{name} {n / MB:.1f} MB" for name, n in size.layer_bytes.items())
        print(f"{size.function.logical_id}: {size.unzipped_bytes / MB:.1f} MB unzipped ({size.share:.1%} of "
              f"250 MB): code {size.code_bytes / 1024:.1f} KB, {layers}")
    over = [s.function.logical_id for s in report.sizes if s.unzipped_bytes > UNZIPPED_LIMIT_BYTES]
    assert report.sizes and not over


def test_every_function_runs_on_an_architecture_and_runtime_its_layers_declare() -> None:
    assert wiring_problems(template_functions()) == []


# --- The inspector's rule, on synthetic layers -----------------------------------------------------------


def test_an_x86_64_extension_in_an_arm64_layer_is_named_as_a_problem(tmp_path: Path) -> None:
    write_extension(tmp_path, "fast/_speedups.cpython-313-x86_64-linux-gnu.so", EM_X86_64)
    write_extension(tmp_path, "fine/_ok.cpython-313-aarch64-linux-gnu.so", EM_AARCH64)

    problems = check_compiled_code(tmp_path, "arm64", "3.13").problems

    assert {(p.where, p.found) for p in problems} == {
        ("python/fast/_speedups.cpython-313-x86_64-linux-gnu.so", "ELF for x86_64 (e_machine 62)"),
        ("python/fast/_speedups.cpython-313-x86_64-linux-gnu.so",
         "an extension tagged cpython-313-x86_64-linux-gnu"),
    }
    assert "aarch64 (e_machine 183)" in str(problems[0])


def test_an_extension_in_a_bundled_library_is_read_by_its_elf_header(tmp_path: Path) -> None:
    write_extension(tmp_path, "pkg.libs/libcrypto-1a2b3c.so.3", EM_X86_64)

    problems = check_compiled_code(tmp_path, "arm64", "3.13").problems

    assert [(p.where, p.found) for p in problems] == [("python/pkg.libs/libcrypto-1a2b3c.so.3",
                                                       "ELF for x86_64 (e_machine 62)")]


def test_a_cp311_extension_and_wheel_in_a_3_13_layer_are_named_as_problems(tmp_path: Path) -> None:
    write_extension(tmp_path, "old/_core.cpython-311-aarch64-linux-gnu.so", EM_AARCH64)
    write_wheel(tmp_path, "old", "cp311-cp311-manylinux_2_17_aarch64", "cp311-cp311-manylinux2014_aarch64")

    problems = check_compiled_code(tmp_path, "arm64", "3.13").problems

    assert [(p.where, p.found) for p in problems] == [
        ("python/old/_core.cpython-311-aarch64-linux-gnu.so", "an extension tagged cpython-311-aarch64-linux-gnu"),
        ("python/old-1.0.dist-info/WHEEL",
         "a wheel tagged cp311-cp311-manylinux_2_17_aarch64, cp311-cp311-manylinux2014_aarch64"),
    ]
    assert "cpython-313-aarch64-linux-gnu or abi3" in problems[0].needed


def test_an_abi3_wheel_for_cp38_passes_in_a_3_13_layer(tmp_path: Path) -> None:
    write_extension(tmp_path, "stable/_rust.abi3.so", EM_AARCH64)
    write_wheel(tmp_path, "stable", "cp38-abi3-manylinux_2_28_aarch64")

    check = check_compiled_code(tmp_path, "arm64", "3.13")

    assert (check.extensions, check.abi3_extensions, check.wheels, check.problems) == (1, 1, 1, ())


def test_an_abi3_wheel_for_a_newer_python_than_the_layers_is_named_as_a_problem(tmp_path: Path) -> None:
    write_wheel(tmp_path, "future", "cp314-abi3-manylinux_2_17_aarch64")

    problems = check_compiled_code(tmp_path, "arm64", "3.13").problems

    assert [p.found for p in problems] == ["a wheel tagged cp314-abi3-manylinux_2_17_aarch64"]


def test_a_pure_python_wheel_passes(tmp_path: Path) -> None:
    write_wheel(tmp_path, "six", "py2-none-any", "py3-none-any")
    write_wheel(tmp_path, "compressed", "py2.py3-none-any")

    check = check_compiled_code(tmp_path, "arm64", "3.13")

    assert (check.extensions, check.wheels, check.pure_wheels, check.problems) == (0, 2, 2, ())


def test_an_extension_that_is_not_an_elf_file_is_named_as_a_problem(tmp_path: Path) -> None:
    macho = tmp_path / "python" / "_mac.cpython-313-darwin.so"
    macho.parent.mkdir(parents=True)
    macho.write_bytes(bytes.fromhex("cffaedfe") + bytes(28))

    found = {p.found for p in check_compiled_code(tmp_path, "arm64", "3.13").problems}

    assert found == {"not an ELF file", "an extension tagged cpython-313-darwin"}


@pytest.mark.parametrize(("tag", "fits"), [
    ("cp313-cp313-manylinux_2_17_aarch64", True),
    ("cp313-cp313-linux_aarch64", True),
    ("py3-none-manylinux2014_aarch64", True),
    ("cp313-cp313-manylinux_2_34_aarch64", True),  # AL2023's glibc
    ("cp313-cp313-manylinux_2_28_aarch64", True),
    ("cp313-cp313-manylinux_2_35_aarch64", False),  # a newer glibc than the runtime's
    ("cp313-cp313-manylinux_2_39_aarch64", False),
    ("cp313-cp313-musllinux_1_2_aarch64", False),
    ("cp313-cp313-manylinux_2_17_x86_64", False),
    ("cp313-cp313-musllinux_1_2_aarch64", False),  # Lambda's runtimes are glibc
    ("cp313-cp313t-manylinux_2_17_aarch64", False),  # free-threaded build
    ("cp313-cp313-macosx_11_0_arm64", False),
    ("py2-none-any", False),
])
def test_a_wheel_passes_only_with_a_tag_for_the_layers_python_and_architecture(tmp_path: Path, tag: str,
                                                                               fits: bool) -> None:
    write_wheel(tmp_path, "w", tag)

    assert (check_compiled_code(tmp_path, "arm64", "3.13").problems == ()) is fits


def test_the_deps_layer_installs_every_manylinux_tag_the_runtimes_glibc_loads(tmp_path: Path) -> None:
    # pip takes one --platform per tag and does not widen manylinux_2_34 to the older glibc versions: a
    # dependency whose only aarch64 wheel is manylinux_2_28 (none for 2014) was not found for the layer.
    platforms = deps_platforms(deps_install_command(tmp_path))

    assert platforms == ["manylinux2014_aarch64", *(f"manylinux_2_{minor}_aarch64" for minor in range(17, 35))]
