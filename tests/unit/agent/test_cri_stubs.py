"""The committed CRI and containerd stubs are exactly what the proto subset generates, and the
subset keeps the published wire numbers."""

from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from prewarm_agent.cri import regenerate
from prewarm_agent.cri.gen import containerd_content_v1_pb2 as content_pb2
from prewarm_agent.cri.gen import cri_runtime_v1_pb2 as cri_pb2
from prewarm_agent.cri.gen import cri_runtime_v1_pb2_grpc as cri_grpc


def _generated_with() -> str:
    # Every *_pb2_grpc.py records the grpcio-tools version that wrote it.
    text = (regenerate.GEN_DIR / "cri_runtime_v1_pb2_grpc.py").read_text(encoding="utf-8")
    version: str = text.split("GRPC_GENERATED_VERSION = '", 1)[1].split("'", 1)[0]
    return version


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix in {".py", ".pyi"}}


def test_committed_stubs_match_a_fresh_regeneration(tmp_path: Path) -> None:
    installed = metadata.version("grpcio-tools")
    if installed != _generated_with():
        pytest.skip(
            f"stubs were generated with grpcio-tools {_generated_with()}, {installed} is installed: "
            "pin grpcio-tools to the generating version, or regenerate and commit"
        )
    # Given the committed stubs
    committed = _files(regenerate.GEN_DIR)

    # When the proto subset is compiled again
    regenerate.generate(tmp_path)

    # Then every generated file is byte for byte the committed one
    fresh = _files(tmp_path)
    assert sorted(fresh) == sorted(committed)
    drifted = [name for name in fresh if fresh[name] != committed[name]]
    assert drifted == [], f"run `python -m prewarm_agent.cri.regenerate` and commit: {drifted} differ"


def test_generated_modules_import_each_other_through_the_package() -> None:
    # Given the gRPC module generated next to its message module
    source = (regenerate.GEN_DIR / "cri_runtime_v1_pb2_grpc.py").read_text(encoding="utf-8")

    # Then it imports the messages from the package, not as a top-level module
    assert "from prewarm_agent.cri.gen import cri_runtime_v1_pb2 as" in source
    assert "\nimport cri_runtime_v1_pb2" not in source
    assert vars(cri_grpc)["cri__runtime__v1__pb2"] is cri_pb2


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (cri_pb2.ImageSpec, "image", 1),
        (cri_pb2.ImageSpec, "annotations", 2),
        (cri_pb2.ImageSpec, "runtime_handler", 19),
        (cri_pb2.ImageSpec, "image_ref", 20),
        (cri_pb2.AuthConfig, "password", 2),
        (cri_pb2.AuthConfig, "registry_token", 6),
        (cri_pb2.PodSandboxConfig, "labels", 6),
        (cri_pb2.PodSandboxConfig, "annotations", 7),
        (cri_pb2.PullImageRequest, "sandbox_config", 3),
        (cri_pb2.Image, "repo_digests", 3),
        (cri_pb2.Image, "pinned", 8),
        (cri_pb2.FilesystemUsage, "inodes_used", 4),
        (cri_pb2.ImageFsInfoResponse, "container_filesystems", 2),
        (cri_pb2.VersionResponse, "runtime_api_version", 4),
        (content_pb2.Status, "started_at", 1),
        (content_pb2.Status, "ref", 3),
        (content_pb2.Status, "offset", 4),
        (content_pb2.Status, "total", 5),
        (content_pb2.Status, "expected", 6),
        (content_pb2.ListStatusesRequest, "filters", 1),
    ],
)
def test_subset_fields_keep_the_published_numbers(message: Any, field: str, number: int) -> None:
    # Given a field the runtime reads by number on the wire
    descriptor = message.DESCRIPTOR.fields_by_name[field]

    # Then its number is the one published in cri-api / containerd
    assert descriptor.number == number


def test_services_use_the_published_method_paths() -> None:
    # Given the package and service names in the subset
    images = cri_pb2.DESCRIPTOR.services_by_name["ImageService"]
    content = content_pb2.DESCRIPTOR.services_by_name["Content"]

    # Then the full names match what containerd serves
    assert images.full_name == "runtime.v1.ImageService"
    assert {m.name for m in images.methods} == {
        "PullImage",
        "ImageStatus",
        "ListImages",
        "ImageFsInfo",
        "RemoveImage",
    }
    assert cri_pb2.DESCRIPTOR.services_by_name["RuntimeService"].full_name == "runtime.v1.RuntimeService"
    assert content.full_name == "containerd.services.content.v1.Content"
