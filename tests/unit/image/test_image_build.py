"""What the image build decides without building: the wheels' platforms, the Dockerfile's Python, the index."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from prewarm_devtools.agent_image import (
    INDEX_ARCHIVE,
    OCI_INDEX,
    BuiltImage,
    Dockerfile,
    ImageBuildError,
    pip_platforms,
    write_index,
)

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def base_with_glibc(rootfs: Path, version: str) -> Path:
    status = rootfs / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: libc-bin\nVersion: 9.9-1\n\nPackage: libc6\nStatus: install ok installed\n"
                      f"Architecture: amd64\nMulti-Arch: same\nVersion: {version}\nDescription: GNU C Library\n")
    return rootfs


def test_pip_is_offered_every_manylinux_tag_the_bases_glibc_allows(tmp_path: Path) -> None:
    # Given trixie's glibc 2.41
    rootfs = base_with_glibc(tmp_path, "2.41-12+deb13u5")
    # Then every manylinux_2_x tag from 2.41 down to the architecture's oldest, and their legacy aliases
    amd64 = pip_platforms("amd64", rootfs)[1::2]
    assert amd64[:2] == ["manylinux_2_41_x86_64", "manylinux_2_40_x86_64"]
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux_2_5_x86_64"} <= set(amd64)
    assert amd64[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert len(amd64) == 37 + 3 and set(pip_platforms("amd64", rootfs)[::2]) == {"--platform"}
    arm64 = pip_platforms("arm64", rootfs)[1::2]
    assert arm64[0] == "manylinux_2_41_aarch64" and arm64[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert len(arm64) == 25 + 1
    assert "manylinux_2_42_x86_64" not in amd64


def test_the_dockerfiles_python_is_its_bases() -> None:
    assert Dockerfile.parse("FROM python:3.12-slim AS build\nFROM python:3.13-slim-trixie\n").python == "3.13"
    assert Dockerfile.read().final.base == f"python:{Dockerfile.read().python}-slim"
    with pytest.raises(ImageBuildError, match="debian:trixie-slim is not python"):
        _ = Dockerfile.parse("FROM debian:trixie-slim\n").python


def archive_of(out: Path, architecture: str, reference: str = "prewarm-agent:0.1.0") -> str:
    """What `make agent-image` leaves for `architecture` (a layout with one manifest, and its summary):
    the manifest's digest."""
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "architecture": architecture}).encode()
    digest = hashlib.sha256(manifest).hexdigest()
    layout = out / f"layout-{architecture}"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(manifest)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    entry = {"mediaType": MANIFEST, "digest": f"sha256:{digest}", "size": len(manifest),
             "annotations": {"org.opencontainers.image.ref.name": "0.1.0"}}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    archive = out / f"prewarm-agent-{architecture}.tar"
    with tarfile.open(archive, "w") as tar:
        for path in layout.iterdir():
            tar.add(path, arcname=path.name)
    built = BuiltImage(archive, reference, architecture, "3.13", 1, 1, 1.0)
    (out / f"prewarm-agent-{architecture}.json").write_text(json.dumps(built.summary()))
    return f"sha256:{digest}"


def read(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    assert member is not None
    return json.loads(member.read())


def test_the_index_names_one_image_holding_each_architectures_manifest_with_its_platform(tmp_path: Path) -> None:
    # Given both architectures built
    digests = {architecture: archive_of(tmp_path, architecture) for architecture in ("amd64", "arm64")}
    # When the index is written
    archive = write_index(tmp_path)
    # Then its one image, named as containerd and skopeo read it, is an index of both manifests
    assert archive == tmp_path / INDEX_ARCHIVE
    with tarfile.open(archive) as tar:
        (entry,) = read(tar, "index.json")["manifests"]
        assert entry["mediaType"] == OCI_INDEX
        assert entry["annotations"] == {"org.opencontainers.image.ref.name": "0.1.0",
                                        "io.containerd.image.name": "docker.io/library/prewarm-agent:0.1.0"}
        index = read(tar, f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}")
        assert index["mediaType"] == OCI_INDEX
        assert [(m["digest"], m["platform"]) for m in index["manifests"]] == [
            (digests["amd64"], {"architecture": "amd64", "os": "linux"}),
            (digests["arm64"], {"architecture": "arm64", "os": "linux"})]
        # ... and every blob of both
        assert {f"blobs/sha256/{d.removeprefix('sha256:')}" for d in digests.values()} <= set(tar.getnames())


def test_no_index_is_written_while_an_architecture_is_not_built(tmp_path: Path) -> None:
    archive_of(tmp_path, "amd64")
    assert write_index(tmp_path) is None
    assert not (tmp_path / INDEX_ARCHIVE).exists()


def test_images_of_different_versions_are_not_indexed_together(tmp_path: Path) -> None:
    archive_of(tmp_path, "amd64", "prewarm-agent:0.1.0")
    archive_of(tmp_path, "arm64", "prewarm-agent:0.0.9")
    with pytest.raises(ImageBuildError, match="holds different images"):
        write_index(tmp_path)
