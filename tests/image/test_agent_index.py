"""Both architectures' images in one OCI index (`make image-tests-arm64` writes it after the arm64 image,
from the amd64 image `make agent-image` built): skopeo reads it as an index, and containerd imports and
runs the platform asked for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from prewarm_devtools.agent_image import (
    ARCHITECTURES,
    INDEX_ARCHIVE,
    OCI_INDEX,
    BuiltImage,
    Dockerfile,
    containerd_name,
    default_archive,
    package_version,
)
from prewarm_devtools.node.containerd import PrivateContainerd
from tests.image.conftest import PREBUILT

pytestmark = [pytest.mark.integration, pytest.mark.node]


@pytest.fixture(scope="module")
def images() -> dict[str, BuiltImage]:
    """Each architecture's image, by architecture, when the index of them all was written."""
    out = Path(os.environ.get(PREBUILT) or default_archive().parent)
    built = [a for a in ARCHITECTURES if (out / f"prewarm-agent-{a}.json").exists()]
    if not (out / INDEX_ARCHIVE).exists():
        pytest.skip(f"no index of both architectures in {out} (built there: {', '.join(built) or 'none'}): "
                    "make image-tests-arm64 writes it after make agent-image")
    if os.geteuid() != 0:
        pytest.skip("importing the index into containerd needs root")
    return {a: BuiltImage.load(out / f"prewarm-agent-{a}.json") for a in ARCHITECTURES}


def manifest_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        (entry,) = json.loads(index.read())["manifests"]
    return str(entry["digest"])


def layer_digests(archive: Path) -> set[str]:
    """The layers of the one image in `archive` (one architecture's)."""
    with tarfile.open(archive) as tar:
        blob = tar.extractfile(f"blobs/sha256/{manifest_digest(archive).split(':', 1)[1]}")
        assert blob is not None
        return {layer["digest"] for layer in json.loads(blob.read())["layers"]}


def test_skopeo_reads_one_index_of_every_architectures_image(images: dict[str, BuiltImage], tmp_path: Path) -> None:
    if shutil.which("skopeo") is None:
        pytest.fail("missing skopeo: make image-deps installs it (devtools/image-deps.sh)")
    archive = images["amd64"].archive.parent / INDEX_ARCHIVE
    inspect = subprocess.run(["skopeo", "inspect", "--raw", f"oci-archive:{archive}"], capture_output=True,
                             text=True, timeout=120, check=False)
    assert inspect.returncode == 0, inspect.stderr
    index = json.loads(inspect.stdout)
    assert index["mediaType"] == OCI_INDEX
    # Each manifest is the one its architecture's archive holds (the image tests ran), with its platform
    assert [(m["digest"], m["platform"]) for m in index["manifests"]] == [
        (manifest_digest(image.archive), {"architecture": architecture, "os": "linux"})
        for architecture, image in images.items()]
    tagged = subprocess.run(["skopeo", "inspect", "--raw", f"oci-archive:{archive}:{package_version()}"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(tagged.stdout) == index, tagged.stderr
    # ... and copies it whole, every blob checked against its digest, as `skopeo copy --all` pushes it
    copied = subprocess.run(["skopeo", "copy", "--quiet", "--all", f"oci-archive:{archive}", f"oci:{tmp_path}:copy"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert copied.returncode == 0, copied.stderr


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_containerd_imports_and_runs_only_the_platform_asked_for(images: dict[str, BuiltImage], architecture: str,
                                                                   tmp_path: Path) -> None:
    archive = images[architecture].archive.parent / INDEX_ARCHIVE
    name = containerd_name(images[architecture].reference)
    manifests = {a: manifest_digest(image.archive) for a, image in images.items()}
    with PrivateContainerd(Path(f"/tmp/pwx-{tmp_path.name[-8:]}")) as containerd:
        def ctr(*args: str) -> subprocess.CompletedProcess[str]:
            address = str(containerd.socket_path)
            return subprocess.run([containerd.ctr, "--address", address, "--namespace", "k8s.io", *args],
                                  capture_output=True, text=True, timeout=300, check=False)

        # When a node of this architecture imports the index (a foreign one runs under qemu-user-static)
        platform = f"--platform=linux/{architecture}"
        imported = ctr("images", "import", platform, str(archive))
        assert imported.returncode == 0, imported.stderr
        # Then the image, under its name, is the index, holding this architecture's layers alone: the import
        # writes every blob of the archive, and containerd's garbage collector then drops the other
        # architectures' configs and layers (their small manifests stay, referenced by the index)
        listed = ctr("images", "ls", f"name=={name}")
        assert OCI_INDEX in listed.stdout, listed.stdout + listed.stderr
        layers = {a: layer_digests(image.archive) for a, image in images.items()}
        theirs = set().union(*(d for a, d in layers.items() if a != architecture)) - layers[architecture]
        deadline = time.monotonic() + 30
        while (content := set(ctr("content", "ls", "--quiet").stdout.split())) & theirs:
            assert time.monotonic() < deadline, f"other architectures' layers kept: {sorted(content & theirs)}"
            time.sleep(0.5)
        assert manifests[architecture] in content and layers[architecture] <= content
        # ... and its container runs this architecture's Python, the Dockerfile's
        probe = ctr("run", "--rm", platform, "--read-only", name, "probe", "python3", "-c",
                    "import sys, platform; print(sys.version_info[:2], platform.machine())")
        assert probe.returncode == 0, probe.stderr
        python = tuple(int(p) for p in Dockerfile.read().python.split("."))
        assert probe.stdout.strip() == f"{python} {ARCHITECTURES[architecture][0]}"
