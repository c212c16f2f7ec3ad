"""Builds the agent image without a Docker daemon, by the steps `agent/Dockerfile` says.

No container registry but the package registries can be reached from where Prewarm is built and
tested, so the Dockerfile's `python:*-slim` base cannot be pulled. This builds the same image from
Debian's packages instead:

1. the base: `mmdebstrap --variant=minbase` of Debian trixie with python3 and ca-certificates, for the
   target architecture (a foreign one runs its package scripts under qemu-user-static); its Python must
   be the Dockerfile's (`FROM python:3.13-slim`: trixie's python3 is 3.13);
2. the wheels: the Dockerfile's build stage (its `COPY` sources staged as the context has them, its
   `pip wheel` command), with the dependencies' wheels for the target's Python and every manylinux tag
   the base's glibc allows (the host's own Python and packages are not the image's);
3. the install: those wheels into the base's Python, compiled by it, and the `prewarm-agent` entry point;
4. the image: one layer (umoci), with the final stage's `ENV`, `USER`, `EXPOSE` and `ENTRYPOINT` read
   from the Dockerfile, tagged with the package version, written as an OCI archive that
   `ctr images import` and `skopeo copy oci-archive:...` read;
5. with `--index`, once every architecture's archive is built: `prewarm-agent.tar`, one OCI archive whose
   image is an index of them all (`skopeo copy --all` pushes it; containerd imports the platform asked).

Run as root (mmdebstrap and umoci unpack as root): `make agent-image`, or
`python -m prewarm_devtools.agent_image --arch arm64 --index --out build/agent-image`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "agent" / "Dockerfile"
IMAGE_NAME = "prewarm-agent"
# The archive whose image is an index of every architecture's (`--index`), beside theirs.
INDEX_ARCHIVE = f"{IMAGE_NAME}.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
SUITE = "trixie"
# The Debian packages of the base: what the Dockerfile's python:*-slim base gives the agent.
BASE_PACKAGES = ("python3", "ca-certificates")
# Left out of the base: documentation, manual pages and translations nobody reads in a container.
_BASE_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                  "/usr/share/lintian/*")
# What the Dockerfile's python:*-slim base puts in the image's environment, before its own ENV.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Each architecture's machine name, and the oldest glibc its manylinux wheels can target (PEP 600).
ARCHITECTURES = {"amd64": ("x86_64", 5), "arm64": ("aarch64", 17)}
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci"}


class ImageBuildError(RuntimeError):
    """The image could not be built; says which step and why."""


# --- The Dockerfile, read -------------------------------------------------------------------------


@dataclass
class Stage:
    """One `FROM` stage: what it copies from the build context, what it runs, and its image settings."""

    base: str
    name: str = ""
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (context sources, destination)
    runs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    exposed: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)


@dataclass
class Dockerfile:
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    @property
    def build(self) -> Stage:
        """The stage that builds the wheels (the first)."""
        return self.stages[0]

    @property
    def python(self) -> str:
        """The Python version of the final stage's base: `3.13` from `python:3.13-slim`."""
        if (match := re.match(r"python:(\d+\.\d+)", self.final.base)) is None:
            raise ImageBuildError(f"agent/Dockerfile's base {self.final.base} is not python:X.Y-...")
        return match.group(1)

    def context_sources(self) -> list[str]:
        """Every path a `COPY` or `ADD` reads from the build context (not `--from` another stage)."""
        return [source for stage in self.stages for sources, _ in stage.copies for source in sources]

    @classmethod
    def read(cls, path: Path = DOCKERFILE) -> Dockerfile:
        return cls.parse(path.read_text())

    @classmethod
    def parse(cls, text: str) -> Dockerfile:
        stages: list[Stage] = []
        for instruction, arguments in _instructions(text):
            if instruction == "FROM":
                words = arguments.split()
                stages.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else ""))
                continue
            if not stages:
                raise ImageBuildError(f"agent/Dockerfile: {instruction} before FROM")
            stage = stages[-1]
            if instruction in ("COPY", "ADD"):
                words = _words(arguments)
                flags = [w for w in words if w.startswith("--")]
                paths = [w for w in words if not w.startswith("--")]
                if not any(f.startswith("--from=") for f in flags):
                    stage.copies.append((paths[:-1], paths[-1]))
            elif instruction == "RUN":
                stage.runs.append(arguments)
            elif instruction == "ENV":
                stage.env.update(_env(arguments))
            elif instruction == "USER":
                stage.user = arguments.strip()
            elif instruction == "EXPOSE":
                stage.exposed += [p if "/" in p else f"{p}/tcp" for p in arguments.split()]
            elif instruction == "ENTRYPOINT":
                stage.entrypoint = _words(arguments)
        if not stages:
            raise ImageBuildError("agent/Dockerfile has no FROM")
        return cls(stages)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) with continuation lines joined and comments left out."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or not (line or pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            instruction, _, arguments = whole.partition(" ")
            found.append((instruction.upper(), arguments.strip()))
    return found


def _words(arguments: str) -> list[str]:
    """An instruction's words, from its JSON (exec) form or its shell form."""
    if arguments.startswith("["):
        return [str(w) for w in json.loads(arguments)]
    return shlex.split(arguments)


def _env(arguments: str) -> dict[str, str]:
    words = shlex.split(arguments)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}  # the legacy `ENV key value` form
    return dict(word.split("=", 1) for word in words)


# --- The build ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive of the agent image, and what it holds."""

    archive: Path
    reference: str
    architecture: str
    python: str
    layer_bytes: int
    unpacked_bytes: int
    seconds: float

    def summary(self) -> dict[str, object]:
        return {"image": self.reference, "architecture": self.architecture, "archive": str(self.archive),
                "python": self.python, "layer_bytes": self.layer_bytes, "unpacked_bytes": self.unpacked_bytes,
                "seconds": round(self.seconds, 1)}

    @classmethod
    def load(cls, path: Path) -> BuiltImage:
        v = json.loads(path.read_text())
        return cls(Path(v["archive"]), v["image"], v["architecture"], v["python"], int(v["layer_bytes"]),
                   int(v["unpacked_bytes"]), float(v["seconds"]))


def package_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def default_reference() -> str:
    """The image `make agent-image` tags: `prewarm-agent:<package version>`."""
    return f"{IMAGE_NAME}:{package_version()}"


def containerd_name(reference: str) -> str:
    """The name containerd gives the image on import (and a pull of `reference` would)."""
    return reference if "/" in reference.split(":")[0] else f"docker.io/library/{reference}"


def default_archive(architecture: str | None = None) -> Path:
    """Where `make agent-image` writes the image of `architecture` (the host's by default)."""
    return ROOT / "build" / "agent-image" / f"{IMAGE_NAME}-{architecture or host_architecture()}.tar"


def host_architecture() -> str:
    machine = platform.machine().lower()
    return next((a for a, (m, _) in ARCHITECTURES.items() if m == machine), machine)


def missing_tools(architecture: str) -> list[str]:
    """The Debian packages this build needs that are not installed (devtools/image-deps.sh installs them)."""
    missing = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if architecture != host_architecture():
        # mmdebstrap runs a foreign base's package scripts under qemu, and checks that it can with arch-test.
        if not Path(f"/proc/sys/fs/binfmt_misc/qemu-{ARCHITECTURES[architecture][0]}").exists():
            missing.append("qemu-user-static (with binfmt_misc registered)")
        if shutil.which("arch-test") is None:
            missing.append("arch-test")
    return missing


def build_image(out: Path, *, architecture: str | None = None, reference: str | None = None,
                python: str = sys.executable, log: bool = True, reuse: bool = False) -> BuiltImage:
    """Builds the agent image for `architecture` (the host's by default) into `out`/<name>-<arch>.tar,
    with what it holds beside it (`.json`). `reuse`: an archive built there before is taken as it is."""
    architecture = architecture or host_architecture()
    summary = out / f"{IMAGE_NAME}-{architecture}.json"
    if reuse and summary.exists():
        return BuiltImage.load(summary)
    (out / INDEX_ARCHIVE).unlink(missing_ok=True)  # it would hold another build of this architecture
    built = _build(out, architecture, reference or default_reference(), python, log)
    summary.write_text(json.dumps(built.summary()))
    return built


def _build(out: Path, architecture: str, reference: str, python: str, log: bool) -> BuiltImage:
    started = time.monotonic()
    if architecture not in ARCHITECTURES:
        raise ImageBuildError(f"architecture {architecture!r}: one of {', '.join(ARCHITECTURES)}")
    if os.geteuid() != 0:
        raise ImageBuildError("building the agent image needs root (mmdebstrap and umoci unpack as root)")
    if missing := missing_tools(architecture):
        raise ImageBuildError(f"missing {', '.join(missing)}: run devtools/image-deps.sh as root")
    dockerfile = Dockerfile.read()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prewarm-agent-image-") as scratch:
        work = Path(scratch)
        rootfs_tar = work / "rootfs.tar"
        _run(log, "base", ["mmdebstrap", "--quiet", "--variant=minbase", f"--architectures={architecture}",
                           f"--include={','.join(BASE_PACKAGES)}",
                           *[f"--dpkgopt=path-exclude={p}" for p in _BASE_EXCLUDES],
                           SUITE, str(rootfs_tar)])
        layout, bundle = work / "layout", work / "bundle"
        tag = reference.rpartition(":")[2]
        _run(log, "image", ["umoci", "init", "--layout", str(layout)])
        _run(log, "image", ["umoci", "new", "--image", f"{layout}:{tag}"])
        _run(log, "image", ["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)])
        rootfs = bundle / "rootfs"
        with tarfile.open(rootfs_tar) as tar:
            tar.extractall(rootfs, filter="fully_trusted")  # a root filesystem: devices and owners as made
        version = _image_python(rootfs)
        if version != dockerfile.python:
            raise ImageBuildError(f"{SUITE}'s python3 is {version}, agent/Dockerfile's base {dockerfile.final.base}")
        platforms = pip_platforms(architecture, rootfs)
        wheels = _build_wheels(dockerfile, work, platforms, version, python, log)
        _install(wheels, rootfs, platforms, version, python, log)
        _entrypoint(rootfs, dockerfile)
        _run(log, "image", ["umoci", "repack", "--image", f"{layout}:{tag}", str(bundle)])
        _run(log, "image", _config_command(layout, tag, architecture, dockerfile.final))
        _run(log, "image", ["umoci", "gc", "--layout", str(layout)])
        _name_image(layout, reference)
        archive = _write_archive(layout, out / f"{IMAGE_NAME}-{architecture}.tar")
        unpacked = sum(f.lstat().st_size for f in rootfs.rglob("*") if f.is_file() and not f.is_symlink())
    return BuiltImage(archive, reference, architecture, version, _layer_bytes(archive), unpacked,
                      time.monotonic() - started)


def write_index(out: Path) -> Path | None:
    """`out`/prewarm-agent.tar: one OCI archive whose image is an index of every architecture's image built
    in `out`, each manifest with its platform; None, and no index, while an architecture is not built."""
    if not all((out / f"{IMAGE_NAME}-{a}.json").exists() for a in ARCHITECTURES):
        return None
    built = [BuiltImage.load(out / f"{IMAGE_NAME}-{a}.json") for a in ARCHITECTURES]
    if len({image.reference for image in built}) != 1:
        raise ImageBuildError(f"{out} holds different images: {', '.join(image.reference for image in built)}")
    with tempfile.TemporaryDirectory(prefix="prewarm-agent-index-") as scratch:
        layout, manifests = Path(scratch), []
        for image in built:
            with tarfile.open(image.archive) as tar:
                tar.extractall(layout, filter="data")
            (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
            manifests.append({key: entry[key] for key in ("mediaType", "digest", "size")}
                             | {"platform": {"architecture": image.architecture, "os": "linux"}})
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}).encode()
        digest = hashlib.sha256(index).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(index)
        tag = {"org.opencontainers.image.ref.name": built[0].reference.rpartition(":")[2]}
        (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_INDEX, "digest": f"sha256:{digest}", "size": len(index), "annotations": tag}]}))
        _name_image(layout, built[0].reference)
        return _write_archive(layout, out / INDEX_ARCHIVE)


def _write_archive(layout: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(layout.iterdir()):
            tar.add(entry, arcname=entry.name)
    return archive


def _repeat(flag: str, values: list[str]) -> list[str]:
    return [word for value in values for word in (flag, value)]


def _config_command(layout: Path, tag: str, architecture: str, final: Stage) -> list[str]:
    command = ["umoci", "config", "--image", f"{layout}:{tag}", "--os", "linux", "--architecture", architecture,
               "--config.user", final.user or "0:0", "--clear=config.cmd"]
    command += _repeat("--config.entrypoint", final.entrypoint)
    command += _repeat("--config.exposedports", final.exposed)
    command += _repeat("--config.env", [f"{k}={v}" for k, v in {**BASE_ENV, **final.env}.items()])
    return command


def _run(log: bool, step: str, command: list[str], **kwargs: object) -> str:
    if log:
        print(f"[{step}] {shlex.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise ImageBuildError(f"{step}: {command[0]} exited {result.returncode}: {' | '.join(detail)}")
    return str(result.stdout)


def _image_python(rootfs: Path) -> str:
    """The base's Python version (`3.13` on trixie), from where its python3 points."""
    target = os.readlink(rootfs / "usr" / "bin" / "python3")
    match = re.fullmatch(r"python(\d+\.\d+)", Path(target).name)
    if match is None:
        raise ImageBuildError(f"the base's python3 points at {target!r}, not pythonX.Y")
    return match.group(1)


def pip_platforms(architecture: str, rootfs: Path) -> list[str]:
    """pip's `--platform` for the base: every manylinux tag its glibc allows, newest first (PEP 600)."""
    status = (rootfs / "var" / "lib" / "dpkg" / "status").read_text()
    if (match := re.search(r"^Package: libc6\n(?:.+\n)*?Version: 2\.(\d+)", status, re.MULTILINE)) is None:
        raise ImageBuildError("the base has no libc6")
    machine, oldest = ARCHITECTURES[architecture]
    minors = range(int(match.group(1)), oldest - 1, -1)
    tags = [f"manylinux_2_{m}_{machine}" for m in minors]
    return _repeat("--platform", tags + [f"{_LEGACY_MANYLINUX[m]}_{machine}" for m in minors if m in _LEGACY_MANYLINUX])


def _build_wheels(dockerfile: Dockerfile, work: Path, platforms: list[str], version: str, python: str,
                  log: bool) -> Path:
    """The Dockerfile's build stage: its sources staged as the context has them, its `pip wheel` run for
    the package itself; the dependencies' wheels for the image's platform and Python."""
    context = work / "context"  # the build stage's WORKDIR
    for sources, destination in dockerfile.build.copies:
        into_folder = destination.endswith("/") or len(sources) > 1
        for source in sources:
            target = context / destination / Path(source).name if into_folder else context / destination
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / source, target)
    wheel_run = next((r for r in dockerfile.build.runs if " wheel " in f" {r} "), None)
    if wheel_run is None:
        raise ImageBuildError("agent/Dockerfile's build stage runs no `pip wheel`")
    words = shlex.split(wheel_run)
    wheels = work / "wheels"
    words = [str(wheels) if w == "/wheels" else w for w in words]
    # The same command, for the package alone: its dependencies come for the image's platform below.
    pip = [python, "-m", "pip", *words[words.index("wheel"):], "--no-deps", "--disable-pip-version-check"]
    _run(log, "wheels", pip, cwd=context)
    requirement = next(w for w in words if w.startswith(".["))
    extras = requirement[2:-1]
    _run(log, "wheels", [python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                         "--dest", str(wheels), "--only-binary=:all:", *platforms,
                         "--python-version", version, "--implementation", "cp",
                         f"{next(wheels.glob('prewarm-*.whl'))}[{extras}]"])
    return wheels


def _install(wheels: Path, rootfs: Path, platforms: list[str], version: str, python: str, log: bool) -> None:
    """The Dockerfile's `pip install --no-index --find-links /wheels "prewarm[agent]"`, into the base's
    Python, compiled by it (a foreign architecture's under qemu-user-static)."""
    site = Path("/usr/local/lib") / f"python{version}" / "dist-packages"
    _run(log, "install", [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                          "--find-links", str(wheels), "--no-compile", "--target", f"{rootfs}{site}",
                          "--only-binary=:all:", *platforms, "--python-version", version,
                          "--implementation", "cp", "prewarm[agent]"])
    shutil.rmtree(f"{rootfs}{site}/bin", ignore_errors=True)  # scripts with the host's interpreter; see _entrypoint
    _run(log, "install", ["chroot", str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q", "-j", "0",
                          "--invalidation-mode", "unchecked-hash", str(site)])


def _entrypoint(rootfs: Path, dockerfile: Dockerfile) -> None:
    """The console script pip would write in the image, for the image's own python3."""
    for command in dockerfile.final.entrypoint[:1]:
        script = rootfs / "usr" / "local" / "bin" / command
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("#!/usr/bin/python3\nimport sys\n\nfrom prewarm_agent.__main__ import main\n\n"
                          "sys.exit(main())\n")
        script.chmod(0o755)


def _name_image(layout: Path, reference: str) -> None:
    """Names the image in the layout's index as containerd and skopeo read it."""
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    for manifest in index["manifests"]:
        annotations = manifest.setdefault("annotations", {})
        annotations["io.containerd.image.name"] = containerd_name(reference)
    index_path.write_text(json.dumps(index))


def _layer_bytes(archive: Path) -> int:
    with tarfile.open(archive) as tar:
        return sum(m.size for m in tar.getmembers() if m.name.startswith("blobs/") and m.size > 4096)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prewarm_devtools.agent_image", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default=host_architecture())
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "agent-image")
    parser.add_argument("--tag", default=None, help=f"the image reference (default {default_reference()})")
    parser.add_argument("--index", action="store_true",
                        help=f"then, if every architecture's image is in --out, write {INDEX_ARCHIVE}: their index")
    args = parser.parse_args(argv)
    try:
        built = build_image(args.out, architecture=args.arch, reference=args.tag)
        index = write_index(args.out) if args.index else None
    except ImageBuildError as e:
        print(f"agent-image: {e}", file=sys.stderr)
        return 2
    print(f"{built.reference} ({built.architecture}, Python {built.python}): {built.archive}, "
          f"{built.layer_bytes / 1e6:.1f} MB compressed, {built.unpacked_bytes / 1e6:.1f} MB unpacked, "
          f"{built.seconds:.0f} s")
    if args.index:
        print(f"index of {', '.join(ARCHITECTURES)}: {index or f'none, as {args.out} lacks one of them'}")
    print(json.dumps(built.summary()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
