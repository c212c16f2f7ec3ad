"""The CRI image client against a real containerd pulling from real local registries."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from prewarm_agent.cri.client import CriImageClient, FsUsage, filesystem_usage_percent
from prewarm_agent.cri.errors import ImagePullError
from prewarm_agent.cri.gen import cri_runtime_v1_pb2 as cri_pb2
from prewarm_agent.cri.gen import cri_runtime_v1_pb2_grpc as cri_grpc
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.images import RegistryPusher, build_image, host_architecture
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.pytest_plugins.node import (
    AUTH_PASSWORD,
    AUTH_USERNAME,
    REFUSED_WITHOUT_CREDENTIALS,
    OciImageFactory,
)

pytestmark = [pytest.mark.node, pytest.mark.integration]

ECR_HOST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
PULL_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cri(
    containerd: PrivateContainerd, registry: LocalRegistry, auth_registry: LocalRegistry
) -> Iterator[CriImageClient]:
    containerd.add_registry_mirror(registry.host, registry.url)
    containerd.add_registry_mirror(auth_registry.host, auth_registry.url)
    containerd.add_registry_mirror(ECR_HOST, registry.url)
    with containerd.cri_client() as client:
        yield client


def test_containerd_answers_as_a_cri_v1_runtime(cri: CriImageClient) -> None:
    version = cri.version()

    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"


def test_pull_by_tag_stores_the_image_under_its_tag_and_digest(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an image in the registry that the node does not have
    image = oci_image_factory.push(registry, "team/api", "v1")
    assert cri.image_status(image.reference) is None

    # When it is pulled by tag
    image_ref = cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT)

    # Then the runtime holds it under its tag and repo digest, identified by its config digest
    info = cri.image_status(image.reference)
    assert info is not None
    assert image_ref == info.id == image.config_digest
    assert image.reference in info.repo_tags
    assert f"{registry.host}/team/api@{image.manifest_digest}" in info.repo_digests
    assert info.size > 0
    assert info.id in {listed.id for listed in cri.list_images()}


def test_pull_by_digest_is_found_by_digest(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "team/worker", "v2")

    image_ref = cri.pull_image(image.digest_reference).result(timeout=PULL_TIMEOUT)

    info = cri.image_status(image.digest_reference)
    assert info is not None
    assert info.id == image_ref == image.config_digest
    assert image.digest_reference in info.repo_digests


def test_image_status_tells_a_present_image_from_an_absent_one(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given one image pulled and another only pushed
    pulled = oci_image_factory.push(registry, "team/present", "v1")
    cri.pull_image(pulled.reference).result(timeout=PULL_TIMEOUT)
    not_pulled = oci_image_factory.push(registry, "team/present", "v2")

    # When an IfNotPresent check asks about both
    # Then only the pulled one is present
    assert cri.image_status(pulled.reference) is not None
    assert cri.image_status(not_pulled.reference) is None


def test_pull_with_the_right_credentials_succeeds(
    cri: CriImageClient, auth_registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(auth_registry, "private/app", "v1")

    image_ref = cri.pull_image(image.reference, auth=(AUTH_USERNAME, AUTH_PASSWORD)).result(timeout=PULL_TIMEOUT)

    assert image_ref == image.config_digest


@pytest.mark.parametrize("auth", [None, (AUTH_USERNAME, "wrong-password")], ids=["missing", "wrong"])
def test_pull_without_valid_credentials_fails_with_the_registry_401(
    cri: CriImageClient,
    auth_registry: LocalRegistry,
    oci_image_factory: OciImageFactory,
    auth: tuple[str, str] | None,
) -> None:
    # Given an image in a registry that needs credentials
    image = oci_image_factory.push(auth_registry, "private/secret", "v1")

    # When it is pulled with missing or wrong credentials
    with pytest.raises(ImagePullError) as caught:
        cri.pull_image(image.reference, auth=auth).result(timeout=PULL_TIMEOUT)

    # Then the error carries containerd's own text, which says 401 Unauthorized (2.x: no credentials)
    if auth is None:
        assert REFUSED_WITHOUT_CREDENTIALS.search(caught.value.details), caught.value.details
    else:
        assert "401 Unauthorized" in caught.value.details
    assert image.reference in caught.value.details
    assert caught.value.image == image.reference
    assert cri.image_status(image.reference) is None


def test_multi_platform_index_pulls_the_image_for_this_architecture(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an index with amd64 and arm64 images
    image = oci_image_factory.push_index(registry, "multi/app", "v1", architectures=("amd64", "arm64"))

    # When it is pulled
    image_ref = cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT)

    # Then the runtime holds the image of this machine's architecture, known by the index digest
    info = cri.image_status(image.reference)
    assert info is not None
    assert image_ref == info.id == image.config_digest
    assert f"{registry.host}/multi/app@{image.index_digest}" in info.repo_digests


def test_index_without_this_platform_fails_with_the_runtime_reason(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an index that has no image for this machine's architecture
    foreign = [arch for arch in ("amd64", "arm64", "s390x", "ppc64le") if arch != host_architecture()][:2]
    image = oci_image_factory.push_index(registry, "multi/foreign", "v1", architectures=foreign)

    # When it is pulled
    with pytest.raises(ImagePullError) as caught:
        cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT)

    # Then containerd's reason says so
    assert "no match for platform" in caught.value.details


def test_pull_of_a_missing_tag_fails_with_not_found(cri: CriImageClient, registry: LocalRegistry) -> None:
    with pytest.raises(ImagePullError) as caught:
        cri.pull_image(f"{registry.host}/team/ghost:v404").result(timeout=PULL_TIMEOUT)

    assert "not found" in caught.value.details


def test_ecr_host_name_is_served_by_the_local_registry_through_hosts_toml(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an image pushed locally and a hosts.toml mapping an ECR host name to the registry
    image = oci_image_factory.push(registry, "ml/trainer", "2024.1").with_host(ECR_HOST)

    # When it is pulled by its ECR name, with sandbox metadata as the agent sends it
    cri.pull_image(
        image.reference,
        sandbox_labels={"app.kubernetes.io/name": "prewarm"},
        sandbox_annotations={"prewarm.dev/job": "warm-trainer"},
    ).result(timeout=PULL_TIMEOUT)

    # Then the node knows it by that name
    info = cri.image_status(image.reference)
    assert info is not None
    assert f"{ECR_HOST}/ml/trainer:2024.1" in info.repo_tags


def test_chunked_upload_gives_the_same_pullable_image(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "team/chunked", "v1", size_mb=0.5, chunk_size=100_000)

    assert cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT) == image.config_digest


def test_remove_image_makes_it_absent_and_is_idempotent(
    cri: CriImageClient, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "team/removable", "v1")
    cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT)

    cri.remove_image(image.reference)
    cri.remove_image(image.reference)

    assert cri.image_status(image.reference) is None


def test_remove_image_of_one_tag_removes_every_tag_and_list_images_ignores_its_filter(
    cri: CriImageClient, containerd: PrivateContainerd, registry: LocalRegistry
) -> None:
    # Given one image under two tags, and another image
    image = build_image(size_mb=0.1)
    pusher = RegistryPusher(registry.url)
    first, second = pusher.push_image("team/two-tags", "v1", image), pusher.push_image("team/two-tags", "v2", image)
    other = pusher.push_image("team/other", "v1", build_image(size_mb=0.1))
    for pushed in (first, second, other):
        cri.pull_image(pushed.reference).result(timeout=PULL_TIMEOUT)

    # When ListImages is asked for one image only (what the agent never does)
    only = cri_pb2.ListImagesRequest(filter=cri_pb2.ImageFilter(image=cri_pb2.ImageSpec(image=other.reference)))
    with grpc.insecure_channel(f"unix://{containerd.socket_path}") as channel:
        answered = cri_grpc.ImageServiceStub(channel).ListImages(only, timeout=10).images  # type: ignore[no-untyped-call]

    # Then every image comes back: containerd ignores the filter (1.6, 1.7 and 2.1 alike)
    assert {i.id for i in answered} >= {image.config.digest, other.config_digest}
    # ... and removing one tag removes the image, so its other tag too: RemoveImage works by image id
    cri.remove_image(first.reference)
    assert cri.image_status(second.reference) is None
    assert cri.image_status(other.reference) is not None


def _wait_for_used_bytes(cri: CriImageClient, at_least: int, timeout: float) -> list[FsUsage]:
    # containerd refreshes ImageFsInfo in the background (every second in the harness config).
    deadline = time.monotonic() + timeout
    usage: list[FsUsage] = cri.image_fs_info()
    while not any(fs.used_bytes >= at_least for fs in usage) and time.monotonic() < deadline:
        time.sleep(0.2)
        usage = cri.image_fs_info()
    return usage


def test_image_fs_info_reports_the_snapshotter_filesystem(
    cri: CriImageClient,
    containerd: PrivateContainerd,
    registry: LocalRegistry,
    oci_image_factory: OciImageFactory,
) -> None:
    # Given an unpacked image holding a file
    image = oci_image_factory.push(registry, "team/fs", "v1", files={"data/blob.bin": b"x" * 200_000})
    cri.pull_image(image.reference).result(timeout=PULL_TIMEOUT)

    # When the image filesystem usage is read
    usage = _wait_for_used_bytes(cri, at_least=200_000, timeout=5)

    # Then it is the snapshotter directory under this containerd's root, with bytes and inodes used
    assert len(usage) == 1
    fs = usage[0]
    assert Path(fs.mountpoint) == containerd.root_dir / f"io.containerd.snapshotter.v1.{containerd.snapshotter}"
    assert fs.used_bytes >= 200_000
    assert fs.inodes_used > 0
    assert fs.timestamp_ns > 0
    assert 0.0 < fs.usage_percent() < 100.0
    assert fs.usage_percent() == pytest.approx(filesystem_usage_percent(str(containerd.root_dir)), abs=1.0)
