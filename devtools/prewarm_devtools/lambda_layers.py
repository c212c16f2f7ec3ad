"""The Lambda layers as template.yaml ships them: compiled code only for the functions' architecture and
Python, and every function with its layers under Lambda's unzipped size limit (issue #24, item 3).

The deps layer is built by the `pip install` line of layers/deps/Makefile (its own TARGET_FLAGS, its
PLATFORM and VERSION defaults: what `sam build` ships), without the Makefile's `compileall`, which needs
the runtime's Python; the platform tags pip picked are what decides the architecture. It is then checked
against the template: the ELF header and file-name tag of every compiled extension, and the `Tag:` lines
of every installed wheel, for the Architectures and Runtime of the functions that use it. The shared
layer is built by its Makefile with this interpreter (`build_layer`, which `benchmarks/cold_start.py` uses too).

Sizes count what Lambda extracts: the function's CodeUri directory (without bytecode, as `sam build`
copies it) and each of its layers, the deps layer's bytecode estimated by compiling it with this Python
outside the layer (3.13's .pyc are not this Python's, but their size is close).

Run from the checkout's root: `python -m prewarm_devtools.lambda_layers [--out DIR]`. Needs PyPI and make.
Exits 1 on a problem found, 2 when the layers could not be built or read.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm_devtools.sam.template import TemplateError, load_template

# The layers are not packaged into the wheel (setup.py): this runs in a checkout.
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
SHARED_LAYER = ROOT / "layers" / "shared"
DEPS_LAYER = ROOT / "layers" / "deps"

# "Deployment package (.zip file archive) size: 250 MB (unzipped). This quota applies to all the files
# you upload, including layers": https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
# (GetAccountSettings' CodeSizeUnzipped, and the error of a larger function, say 262144000 bytes).
UNZIPPED_LIMIT_BYTES = 262_144_000
MB = 2**20  # Lambda's "250 MB" is 250 * 2**20 bytes

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_E_MACHINE_NAMES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64"}


@dataclass(frozen=True)
class Architecture:
    """A Lambda architecture as template.yaml spells it, and how compiled code names it."""

    name: str
    e_machine: int
    machine: str  # in extension file names (cpython-313-aarch64-linux-gnu) and wheel platform tags


ARCHITECTURES = {"arm64": Architecture("arm64", 183, "aarch64"), "x86_64": Architecture("x86_64", 62, "x86_64")}

# The glibc of the functions' runtimes: python3.12 and later run on Amazon Linux 2023 (glibc 2.34; Lambda
# developer guide, "Lambda runtimes"). A manylinux_2_X wheel needs glibc 2.X or later (PEP 600).
RUNTIME_GLIBC = (2, 34)
_LEGACY_MANYLINUX_GLIBC = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def manylinux_platforms(arch: Architecture, glibc: tuple[int, int] = RUNTIME_GLIBC) -> set[str]:
    """Every manylinux tag from manylinux2014 up to `glibc` for `arch`: what the deps layer installs.

    >>> sorted(manylinux_platforms(ARCHITECTURES["arm64"], (2, 18)))
    ['manylinux2014_aarch64', 'manylinux_2_17_aarch64', 'manylinux_2_18_aarch64']
    """
    return {f"manylinux2014_{arch.machine}"} | {f"manylinux_2_{minor}_{arch.machine}"
                                                 for minor in range(17, glibc[1] + 1)}


def _glibc_fits(platform: str, arch: Architecture, glibc: tuple[int, int]) -> bool:
    """Whether a glibc Linux of `glibc` on `arch` loads a wheel of platform tag `platform`."""
    if platform == "any" or platform == f"linux_{arch.machine}":
        return True
    legacy, _, machine = platform.partition("_")
    if legacy in _LEGACY_MANYLINUX_GLIBC:
        return machine == arch.machine and _LEGACY_MANYLINUX_GLIBC[legacy] <= glibc
    match = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{arch.machine}", platform)
    return match is not None and (int(match[1]), int(match[2])) <= glibc


class LayerBuildError(RuntimeError):
    """A layer could not be built or measured; says which and why."""


@dataclass(frozen=True)
class Problem:
    """Something in a layer, or in the template's wiring, that the function's runtime cannot load."""

    where: str
    found: str
    needed: str

    def __str__(self) -> str:
        return f"{self.where}: {self.found}; the layer needs {self.needed}"


@dataclass(frozen=True)
class CompiledCode:
    """What `check_compiled_code` read in one layer, and what does not fit its target."""

    extensions: int
    abi3_extensions: int
    wheels: int
    pure_wheels: int
    problems: tuple[Problem, ...]

    def summary(self) -> dict[str, Any]:
        return {"extensions": self.extensions, "abi3_extensions": self.abi3_extensions, "wheels": self.wheels,
                "pure_wheels": self.pure_wheels, "problems": len(self.problems)}


# --- Compiled code against an architecture and a Python version -------------------------------------------


def _architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture {name!r}: expected one of {', '.join(ARCHITECTURES)} (template.yaml's)")
    return ARCHITECTURES[name]


def _python_version(version: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"Python version {version!r}: expected major.minor, as in 3.13")
    return int(match[1]), int(match[2])


def _is_extension(path: Path) -> bool:
    return path.is_file() and (path.name.endswith(".so") or ".so." in path.name)


def _elf_problem(path: Path, arch: Architecture) -> str | None:
    """What is wrong with `path`'s ELF header for `arch`, or None."""
    with path.open("rb") as f:
        header = f.read(20)
    if len(header) < 20 or not header.startswith(_ELF_MAGIC):
        return "not an ELF file"
    if header[4] != _ELFCLASS64:
        return f"a 32-bit ELF file (EI_CLASS {header[4]})"
    e_machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    if e_machine != arch.e_machine:
        return f"ELF for {_E_MACHINE_NAMES.get(e_machine, 'another machine')} (e_machine {e_machine})"
    return None


# `_yaml.cpython-313-aarch64-linux-gnu.so`, `_rust.abi3.so`, `x.pypy310-pp73-x86_64-linux-gnu.so`; a bare
# `x.so` (or a bundled `libfoo.so.1`) loads in any CPython, so only its ELF header says anything.
_EXTENSION_TAG = re.compile(r"\.(cpython-[^.]+|pypy[^.]*|abi3)\.so$")


def _wheel_tag_fits(tag: str, arch: Architecture, version: tuple[int, int]) -> bool:
    """Whether CPython `version` on Linux/glibc for `arch` installs a wheel tagged `tag` (one expanded tag)."""
    parts = tag.split("-")
    if len(parts) != 3:
        return False
    interpreter, abi, platform = parts
    # Lambda's runtimes are glibc (2.34): manylinux tags up to it and plain linux tags, not musllinux.
    if not _glibc_fits(platform, arch, RUNTIME_GLIBC):
        return False
    match = re.fullmatch(r"(py|cp)(\d)(\d*)", interpreter)
    if match is None or int(match[2]) != version[0]:
        return False
    minor = int(match[3]) if match[3] else None
    if abi == "none":
        return minor is None or minor <= version[1]
    if abi == "abi3":  # the stable ABI: the tag names the oldest CPython it runs on
        return match[1] == "cp" and minor is not None and minor <= version[1]
    return interpreter == abi == f"cp{version[0]}{version[1]}"


def _expanded(tag: str) -> list[str]:
    """A compressed tag set (`py2.py3-none-any`) as single tags; WHEEL files usually list them so already."""
    return ["-".join(p) for p in itertools.product(*(part.split(".") for part in tag.split("-")))]


def check_compiled_code(layer: Path, architecture: str, python: str) -> CompiledCode:
    """Every compiled extension and installed wheel under `layer` (an installed layer's directory) that
    CPython `python` (`3.13`) on `architecture` (`arm64`, `x86_64`) could not load."""
    arch, version = _architecture(architecture), _python_version(python)
    extension_tag = f"cpython-{version[0]}{version[1]}-{arch.machine}-linux-gnu"
    problems: list[Problem] = []
    extensions = abi3 = wheels = pure = 0
    for path in sorted(p for p in layer.rglob("*") if _is_extension(p)):
        where = str(path.relative_to(layer))
        extensions += 1
        elf = _elf_problem(path, arch)
        if elf is not None:
            problems.append(Problem(where, elf, f"a 64-bit ELF for {arch.machine} (e_machine {arch.e_machine})"))
        match = _EXTENSION_TAG.search(path.name)
        if match is not None and match[1] == "abi3":
            abi3 += 1
        elif match is not None and match[1] != extension_tag:
            problems.append(Problem(where, f"an extension tagged {match[1]}", f"{extension_tag} or abi3"))
    for wheel in sorted(layer.rglob("*.dist-info/WHEEL")):
        where = str(wheel.relative_to(layer))
        wheels += 1
        tags = [tag for line in wheel.read_text(encoding="utf-8", errors="replace").splitlines()
                if line.startswith("Tag:") for tag in _expanded(line.partition(":")[2].strip())]
        if tags and all(tag.endswith("-none-any") for tag in tags):
            pure += 1
        if not any(_wheel_tag_fits(tag, arch, version) for tag in tags):
            problems.append(Problem(
                where, f"a wheel tagged {', '.join(tags) or '(no Tag: line)'}",
                f"cp{version[0]}{version[1]}-cp{version[0]}{version[1]}, cp3X-abi3 (X <= {version[1]}) or "
                f"py3-none, on any or a manylinux (glibc <= {RUNTIME_GLIBC[0]}.{RUNTIME_GLIBC[1]})/linux "
                f"{arch.machine} platform",
            ))
    return CompiledCode(extensions, abi3, wheels, pure, tuple(problems))


# --- The template's functions and layers -------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    logical_id: str
    content_uri: Path
    compatible_architectures: tuple[str, ...]
    compatible_runtimes: tuple[str, ...]


@dataclass(frozen=True)
class LambdaFunction:
    logical_id: str
    code_uri: Path
    layers: tuple[Layer, ...]
    architecture: str
    runtime: str

    @property
    def python(self) -> str:
        """`3.13` of `python3.13`."""
        return self.runtime.removeprefix("python")


def _local_path(template: Path, where: str, value: Any) -> Path:
    if not isinstance(value, str):
        raise TemplateError(f"{template}: {where} is {value!r}, not a local path this check can measure")
    return (template.parent / value).resolve()


def template_functions(template: Path = TEMPLATE) -> list[LambdaFunction]:
    """Every AWS::Serverless::Function of `template`, with Globals.Function applied as SAM applies them
    (its own values replace the global ones, its lists add to them) and its layers resolved."""
    doc = load_template(template)
    globals_ = doc.get("Globals", {}).get("Function", {})
    resources: dict[str, Any] = doc["Resources"]
    layers = {}
    for logical_id, resource in resources.items():
        if resource.get("Type") == "AWS::Serverless::LayerVersion":
            props = resource.get("Properties", {})
            layers[logical_id] = Layer(
                logical_id, _local_path(template, f"{logical_id}.ContentUri", props.get("ContentUri")),
                tuple(props.get("CompatibleArchitectures", [])), tuple(props.get("CompatibleRuntimes", [])),
            )
    functions = []
    for logical_id, resource in resources.items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        own = resource.get("Properties", {})
        props = {**globals_, **own}
        # SAM adds a function's list to Globals' (one in both places makes two, which Lambda refuses);
        # none is Lambda's default, x86_64.
        architectures = [*globals_.get("Architectures", []), *own.get("Architectures", [])]
        if len(architectures) > 1:
            raise TemplateError(f"{template}: {logical_id} has Architectures {architectures}: Lambda takes one")
        refs = [*globals_.get("Layers", []), *own.get("Layers", [])]
        resolved = []
        for ref in refs:
            name = ref.get("Ref") if isinstance(ref, dict) else None
            if name not in layers:
                raise TemplateError(f"{template}: {logical_id} has layer {ref!r}, not a layer of this template "
                                    "(its contents cannot be measured)")
            resolved.append(layers[name])
        runtime = props.get("Runtime")
        if not isinstance(runtime, str) or not re.fullmatch(r"python\d+\.\d+", runtime):
            raise TemplateError(f"{template}: {logical_id} has Runtime {runtime!r}, not a Python runtime")
        functions.append(LambdaFunction(
            logical_id, _local_path(template, f"{logical_id}.CodeUri", props.get("CodeUri")), tuple(resolved),
            (architectures or ["x86_64"])[0], runtime,
        ))
    return functions


def wiring_problems(functions: Iterable[LambdaFunction]) -> list[Problem]:
    """A function on an architecture or runtime one of its layers does not declare compatible."""
    problems = []
    for fn in functions:
        for layer in fn.layers:
            for value, declared, name in ((fn.architecture, layer.compatible_architectures, "CompatibleArchitectures"),
                                          (fn.runtime, layer.compatible_runtimes, "CompatibleRuntimes")):
                if value not in declared:
                    problems.append(Problem(f"{TEMPLATE.name}: {fn.logical_id}",
                                            f"runs {value} with {layer.logical_id}",
                                            f"{value} in its {name} ({', '.join(declared) or 'none'})"))
    return problems


# --- Building and measuring -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltLayer:
    """A layer's contents as its zip holds them (`root/python/...`), and their unzipped size."""

    root: Path
    unzipped_bytes: int
    note: str = ""


def tree_bytes(root: Path, *, bytecode: bool = True) -> int:
    """The unzipped size of the files under `root`: their bytes, as Lambda counts them."""
    return sum(p.stat().st_size for p in root.rglob("*")
               if p.is_file() and (bytecode or ("__pycache__" not in p.parts and p.suffix != ".pyc")))


def deps_install_command(artifacts: Path) -> list[str]:
    """layers/deps/Makefile's `pip install` line for `artifacts` (its ARTIFACTS_DIR), run by this Python."""
    # PLATFORM and VERSION are `?=` there: the environment's would replace the Makefile's own.
    env = {k: v for k, v in os.environ.items() if k not in ("PLATFORM", "VERSION", "MAKEFLAGS")}
    command = ["make", "-n", "-s", "-C", str(DEPS_LAYER), "build-DepsLayer", f"ARTIFACTS_DIR={artifacts}",
               f"PYTHON={sys.executable}"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError as e:
        raise LayerBuildError("make is needed to read layers/deps/Makefile (apt-get install -y make)") from e
    lines = [line for line in done.stdout.splitlines() if " -m pip install " in line]
    if done.returncode != 0 or len(lines) != 1:
        raise LayerBuildError(f"{DEPS_LAYER / 'Makefile'}: expected one `pip install` line from `make -n "
                              f"build-DepsLayer`, found {len(lines)} (exit {done.returncode}): {done.stderr[-500:]}")
    return shlex.split(lines[0])


def _flag(command: Sequence[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def deps_platforms(command: Sequence[str]) -> list[str]:
    """The platform tags of the Makefile's `pip install` line, in its order (one `--platform` each)."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word == "--platform"]


def build_deps_layer(into: Path) -> tuple[BuiltLayer, str]:
    """The deps layer's contents in `into/deps-layer/python`, as the Makefile installs them, not compiled;
    with the platform it was installed for. Its size counts bytecode estimated outside the layer."""
    artifacts = into / "deps-layer"
    (artifacts / "python").mkdir(parents=True)
    command = deps_install_command(artifacts)
    done = subprocess.run(command, cwd=DEPS_LAYER, capture_output=True, text=True, timeout=1200, check=False)
    if done.returncode != 0:
        raise LayerBuildError(f"{DEPS_LAYER / 'requirements.txt'}: pip exited with {done.returncode}:\n"
                              f"{done.stderr[-3000:]}")
    tags = deps_platforms(command)
    shown = " .. ".join(dict.fromkeys([tags[0], tags[-1]])) if tags else "this machine"
    platform = f"{shown}, Python {_flag(command, '--python-version') or '?'}"
    bytecode, uncompiled = estimated_bytecode(artifacts / "python", into / "deps-bytecode")
    note = f"built for {platform}; bytecode estimated with Python {sys.version_info[0]}.{sys.version_info[1]}"
    if uncompiled:
        note += f" ({uncompiled} modules it could not compile counted without)"
    return BuiltLayer(artifacts, tree_bytes(artifacts) + bytecode, note), platform


def estimated_bytecode(python_dir: Path, into: Path) -> tuple[int, int]:
    """The bytes of the .pyc the Makefile's `compileall` adds, compiled by this Python into `into`
    (PYTHONPYCACHEPREFIX) so the layer stays as pip left it; and how many modules did not compile."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(into)}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(python_dir)], env=env, capture_output=True, timeout=1200, check=False)
    sources = sum(1 for _ in python_dir.rglob("*.py"))
    compiled = sum(1 for _ in into.rglob("*.pyc")) if into.is_dir() else 0
    return (tree_bytes(into) if into.is_dir() else 0), max(sources - compiled, 0)


def build_layer(name: str, into: Path, **variables: str) -> Path:
    """Layer `name` (layers/<name>/Makefile, target `build-<Name>Layer`) as `sam build` makes it, with
    bytecode compiled by this interpreter. Returns the layer's `python/` directory (Lambda's /opt/python).
    """
    artifacts = into / f"{name}-layer"
    target = f"build-{name.capitalize()}Layer"
    command = ["make", "-s", "-C", str(ROOT / "layers" / name), target, f"ARTIFACTS_DIR={artifacts}",
               f"PYTHON={sys.executable}", *(f"{k}={v}" for k, v in variables.items())]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except FileNotFoundError as e:
        raise LayerBuildError("make is needed to build the layers (apt-get install -y make)") from e
    if done.returncode != 0:
        raise LayerBuildError(f"the {name} layer's build exited with {done.returncode}:\n{done.stderr[-3000:]}")
    python = artifacts / "python"
    sources = sorted(python.rglob("*.py"))
    compiled = {p.parent.parent / f"{p.name.split('.')[0]}.py" for p in python.rglob("__pycache__/*.pyc")}
    if not sources or set(sources) - compiled:
        raise LayerBuildError(f"the {name} layer's build left modules without bytecode in {python}")
    return python


def build_layers(into: Path) -> list[Path]:
    """The shared layer, then the dependencies layer (for this machine's platform and Python), in the
    order template.yaml lists them: Lambda puts each on sys.path under /opt/python."""
    return [build_layer("shared", into), build_layer("deps", into, PLATFORM="", VERSION="")]


def build_shared_layer(into: Path) -> BuiltLayer:
    """layers/shared/Makefile's layer, with this Python's bytecode (as `benchmarks/cold_start.py` loads it)."""
    root = build_layer("shared", into).parent
    return BuiltLayer(root, tree_bytes(root), f"bytecode of Python {sys.version_info[0]}.{sys.version_info[1]}")


def set_writable(root: Path, writable: bool) -> None:
    """chmod -R u+w (`writable`) or a-w on `root`. Root ignores the mode: PYTHONDONTWRITEBYTECODE does not."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@contextmanager
def lambda_code_dir(keep: Path | None = None) -> Iterator[Path]:
    """A directory for the built layers and read-only copies: temporary, or `keep` (empty or new), which
    stays for a look at what Lambda would load. Made writable again at the end either way."""
    with ExitStack() as stack:
        if keep is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prewarm-cold-start-")))
        else:
            keep.mkdir(parents=True, exist_ok=True)
            if any(keep.iterdir()):
                raise LayerBuildError(f"--keep {keep}: the directory is not empty")
            root = keep
        try:
            yield root
        finally:
            set_writable(root, True)


@dataclass(frozen=True)
class FunctionSize:
    function: LambdaFunction
    code_bytes: int
    layer_bytes: dict[str, int]

    @property
    def unzipped_bytes(self) -> int:
        return self.code_bytes + sum(self.layer_bytes.values())

    @property
    def share(self) -> float:
        return self.unzipped_bytes / UNZIPPED_LIMIT_BYTES


def function_sizes(functions: Iterable[LambdaFunction], built: Mapping[str, BuiltLayer]) -> list[FunctionSize]:
    """Each function's code (without bytecode: `sam build` leaves it out) and its layers, unzipped."""
    return [FunctionSize(fn, tree_bytes(fn.code_uri, bytecode=False),
                         {layer.logical_id: built[layer.logical_id].unzipped_bytes for layer in fn.layers})
            for fn in functions]


def layer_targets(functions: Iterable[LambdaFunction], layer_id: str) -> set[tuple[str, str]]:
    """The (architecture, Python version) pairs that load layer `layer_id`."""
    return {(fn.architecture, fn.python) for fn in functions if any(x.logical_id == layer_id for x in fn.layers)}


@dataclass
class Report:
    functions: list[LambdaFunction]
    built: dict[str, BuiltLayer]
    platform: str
    checks: dict[tuple[str, str, str], CompiledCode]  # (layer, architecture, python)
    wiring: list[Problem]
    sizes: list[FunctionSize]
    build_seconds: float

    def problems(self) -> list[str]:
        return [*(str(p) for p in self.wiring),
                *(f"{layer}: {p}" for (layer, _, _), check in self.checks.items() for p in check.problems),
                *(f"{s.function.logical_id}: {s.unzipped_bytes} bytes unzipped with its layers, over Lambda's "
                  f"{UNZIPPED_LIMIT_BYTES}" for s in self.sizes if s.unzipped_bytes > UNZIPPED_LIMIT_BYTES)]

    def check_of(self, fn: LambdaFunction) -> str:
        found = sum(len(self.checks[(x.logical_id, fn.architecture, fn.python)].problems) for x in fn.layers)
        return "ok" if not found else f"{found} problems"

    def summary(self) -> dict[str, Any]:
        return {
            "limit_bytes": UNZIPPED_LIMIT_BYTES,
            "functions": {s.function.logical_id: {"unzipped_bytes": s.unzipped_bytes, "share": round(s.share, 4),
                                                  "architecture": s.function.architecture,
                                                  "runtime": s.function.runtime} for s in self.sizes},
            "layers": {layer_id: {"unzipped_bytes": b.unzipped_bytes, "note": b.note}
                       for layer_id, b in self.built.items()},
            "compiled_code": {f"{layer}/{arch}/{python}": c.summary()
                              for (layer, arch, python), c in self.checks.items()},
            "deps_platform": self.platform,
            "build_seconds": round(self.build_seconds, 1),
            "problems": self.problems(),
        }


def check_layers(into: Path, template: Path = TEMPLATE) -> Report:
    """Builds the template's layers into `into`, checks their compiled code and measures every function."""
    functions = template_functions(template)
    layers = {layer.logical_id: layer for fn in functions for layer in fn.layers}
    started = time.monotonic()
    built: dict[str, BuiltLayer] = {}
    platform = ""
    for layer in layers.values():
        if layer.content_uri == SHARED_LAYER:
            built[layer.logical_id] = build_shared_layer(into)
        elif layer.content_uri == DEPS_LAYER:
            built[layer.logical_id], platform = build_deps_layer(into)
        else:
            raise LayerBuildError(f"{template}: {layer.logical_id} has ContentUri {layer.content_uri}, which this "
                                  "check does not know how to build")
    seconds = time.monotonic() - started
    checks = {(layer_id, arch, python): check_compiled_code(built[layer_id].root, arch, python)
              for layer_id in built for arch, python in sorted(layer_targets(functions, layer_id))}
    return Report(functions, built, platform, checks, wiring_problems(functions), function_sizes(functions, built),
                  seconds)


def print_report(report: Report) -> None:
    print(f"layers built in {report.build_seconds:.0f} s:")
    for layer_id, b in report.built.items():
        print(f"  {layer_id:24} {b.unzipped_bytes / MB:7.1f} MB  {b.note}")
    for (layer_id, arch, python), c in report.checks.items():
        print(f"  {layer_id} for {arch}, Python {python}: {c.extensions} compiled extensions ({c.abi3_extensions} "
              f"abi3), {c.wheels} wheels ({c.pure_wheels} pure): {len(c.problems)} problems")
    width = max(len(fn.logical_id) for fn in report.functions)
    print(f"  {'function':{width}}  {'arch':7} {'runtime':10} {'unzipped':>10}  {'of 250 MB':>9}  compiled code")
    for s in report.sizes:
        fn = s.function
        print(f"  {fn.logical_id:{width}}  {fn.architecture:7} {fn.runtime:10} {s.unzipped_bytes / MB:7.1f} MB  "
              f"{s.share:9.1%}  {report.check_of(fn)}")
    for problem in report.problems():
        print(f"  PROBLEM {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prewarm_devtools.lambda_layers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="build the layers into DIR (empty or new) and keep them; a temporary directory otherwise")
    args = parser.parse_args(argv)
    try:
        # Absolute: the layers' Makefiles run in their own directories (make -C), ARTIFACTS_DIR with them.
        with lambda_code_dir(args.out.resolve() if args.out else None) as into:
            report = check_layers(into)
    except (LayerBuildError, ValueError) as e:  # ValueError: TemplateError, a bad value
        print(f"lambda_layers: {e}", file=sys.stderr)
        return 2
    print_report(report)
    print(json.dumps(report.summary()), flush=True)
    return 1 if report.problems() else 0


if __name__ == "__main__":
    raise SystemExit(main())
