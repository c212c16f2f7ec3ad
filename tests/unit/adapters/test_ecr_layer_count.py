"""`EcrImages.layer_count`: an image's layers as ECR's BatchGetImage gives its manifest (moto in-process), and an
index's manifest read once for its platforms and its layers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.ecr import EcrImages

REGION, ACCOUNT = "us-west-2", "123456789012"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture
def ecr(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("ecr", region_name=REGION)
        client.create_repository(repositoryName="ml/model")
        yield client


def put(ecr: Any, document: dict[str, Any], media_type: str, tag: str | None = None) -> str:
    """Pushes a manifest as a registry stores it: its digest the SHA-256 of its bytes, as ECR's is."""
    text = json.dumps(document)
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    ecr.put_image(repositoryName="ml/model", imageManifest=text, imageManifestMediaType=media_type,
                  imageDigest=digest, **({"imageTag": tag} if tag else {}))
    return digest


def manifest(layers: int, nonce: str) -> dict[str, Any]:
    blob = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": 1}
    return {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 1,
                       "digest": "sha256:" + hashlib.sha256(nonce.encode()).hexdigest()},
            "layers": [{**blob, "digest": "sha256:" + hashlib.sha256(f"{nonce}{i}".encode()).hexdigest()}
                       for i in range(layers)]}


def platforms_index(amd64: str, arm64: str, attestation: str) -> dict[str, Any]:
    """An index of an amd64 and an arm64 image, and a buildx attestation (platform unknown/unknown)."""
    return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd64, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": arm64, "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": OCI_MANIFEST, "digest": attestation, "size": 1,
         "platform": {"os": "unknown", "architecture": "unknown"}}]}


def test_an_image_s_layers_are_its_manifest_s(ecr: Any) -> None:
    digest = put(ecr, manifest(7, "one"), OCI_MANIFEST, "v1")
    assert EcrImages(ecr).layer_count(ACCOUNT, "ml/model", digest) == 7


def test_an_index_s_layers_are_the_most_any_of_its_platforms_has_attestations_aside(ecr: Any) -> None:
    amd64, arm64 = put(ecr, manifest(4, "amd"), OCI_MANIFEST), put(ecr, manifest(9, "arm"), OCI_MANIFEST)
    attestation = put(ecr, manifest(30, "att"), OCI_MANIFEST)
    index = platforms_index(amd64, arm64, attestation)
    digest = put(ecr, index, OCI_INDEX, "v2")
    assert EcrImages(ecr).layer_count(ACCOUNT, "ml/model", digest) == 9


def test_an_image_ecr_does_not_have_has_no_count_and_fails_nothing(ecr: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert EcrImages(ecr).layer_count(ACCOUNT, "ml/model", "sha256:" + "0" * 64) is None
    assert EcrImages(ecr).layer_count(ACCOUNT, "ml/absent", "sha256:" + "0" * 64) is None
    assert "layer count unknown: read manifest of ml/absent" in caplog.text


def test_a_pushed_index_s_platforms_and_layer_count_read_its_manifest_once(ecr: Any) -> None:
    amd64 = put(ecr, manifest(5, "amd"), OCI_MANIFEST)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd64, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}}]}
    digest = put(ecr, index, OCI_INDEX, "v3")
    asked: list[list[str]] = []

    class Counting:
        def batch_get_image(self, **kwargs: Any) -> Any:
            asked.append([i["imageDigest"] for i in kwargs["imageIds"]])
            return ecr.batch_get_image(**kwargs)

    images = EcrImages(Counting())
    assert images.platforms(ACCOUNT, "ml/model", digest) == [{"os": "linux", "architecture": "amd64"}]
    assert images.layer_count(ACCOUNT, "ml/model", digest) == 5
    assert asked == [[digest], [amd64]]


def test_a_tag_s_layers_are_read_again_after_the_tag_moved(ecr: Any) -> None:
    """One EcrImages lives as long as a warm Lambda: a tag's manifest is never kept from one ask to the next."""
    images = EcrImages(ecr)
    put(ecr, manifest(3, "before"), OCI_MANIFEST, "latest")
    assert images.layer_count(ACCOUNT, "ml/model", "latest") == 3
    put(ecr, manifest(6, "after"), OCI_MANIFEST, "latest")
    assert images.layer_count(ACCOUNT, "ml/model", "latest") == 6


def test_an_image_in_another_region_is_read_there(ecr: Any) -> None:
    # Given a repository only in eu-west-1 (a replica's Region), and the stack's client in us-west-2
    elsewhere = boto3.client("ecr", region_name="eu-west-1")
    elsewhere.create_repository(repositoryName="ml/model")
    digest = put(elsewhere, manifest(6, "eu"), OCI_MANIFEST, "v1")
    images = EcrImages(ecr)

    # Then its layers are read with BatchGetImage in eu-west-1; the stack's Region has no such image
    assert images.layer_count(ACCOUNT, "ml/model", digest, region="eu-west-1") == 6
    assert images.layer_count(ACCOUNT, "ml/model", digest) is None
    assert images.layer_count(ACCOUNT, "ml/model", digest, region=REGION) is None


def sized(sizes: list[int], nonce: str) -> dict[str, Any]:
    document = manifest(len(sizes), nonce)
    for layer, size in zip(document["layers"], sizes, strict=True):
        layer["size"] = size
    document["config"]["size"] = 100
    return document


def test_an_image_s_size_is_its_compressed_layers_and_config_by_its_digest(ecr: Any) -> None:
    digest = put(ecr, sized([1_000, 20_000], "one"), OCI_MANIFEST, "v1")
    image = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/ml/model:v1"

    size = EcrImages(ecr).image_size(image)

    assert (size.reference, size.digest, size.bytes) == (image, digest, 21_100)


def test_an_index_s_size_is_its_largest_platform_s_attestations_aside(ecr: Any) -> None:
    amd64, arm64 = put(ecr, sized([500], "amd"), OCI_MANIFEST), put(ecr, sized([700, 800], "arm"), OCI_MANIFEST)
    attestation = put(ecr, sized([10**9], "att"), OCI_MANIFEST)
    index = platforms_index(amd64, arm64, attestation)
    digest = put(ecr, index, OCI_INDEX, "v2")

    size = EcrImages(ecr).image_size(f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/ml/model@{digest}")

    assert (size.digest, size.bytes) == (digest, 1_600)


def test_a_size_ecr_cannot_give_or_another_registry_s_is_unknown(ecr: Any, caplog: pytest.LogCaptureFixture) -> None:
    host = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
    for image in (f"{host}/ml/model:absent", f"{host}/ml/absent:v1", "docker.io/library/nginx:1.27"):
        size = EcrImages(ecr).image_size(image)
        assert (size.reference, size.digest, size.bytes) == (image, "", None)
    assert f"size of {host}/ml/absent:v1 unknown" in caplog.text


def test_another_regions_image_is_sized_there_not_by_this_regions_namesake(ecr: Any) -> None:
    put(ecr, sized([1_000], "here"), OCI_MANIFEST, "v1")
    elsewhere = boto3.client("ecr", region_name="eu-west-1")
    elsewhere.create_repository(repositoryName="ml/model")
    digest = put(elsewhere, sized([5_000], "eu"), OCI_MANIFEST, "v1")

    size = EcrImages(ecr).image_size(f"{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/ml/model:v1")

    assert (size.digest, size.bytes) == (digest, 5_100)


def test_an_image_s_bytes_are_its_config_and_layers_and_an_index_s_its_largest_image_s(ecr: Any) -> None:
    digest = put(ecr, manifest(7, "one"), OCI_MANIFEST, "v1")
    assert EcrImages(ecr).image_bytes(ACCOUNT, "ml/model", digest) == 8  # a config and 7 layers of 1 byte
    amd64, arm64 = put(ecr, manifest(4, "amd"), OCI_MANIFEST), put(ecr, manifest(9, "arm"), OCI_MANIFEST)
    index = put(ecr, platforms_index(amd64, arm64, put(ecr, manifest(30, "att"), OCI_MANIFEST)), OCI_INDEX, "v2")
    assert EcrImages(ecr).image_bytes(ACCOUNT, "ml/model", index) == 10
    assert EcrImages(ecr).image_bytes(ACCOUNT, "ml/absent", "sha256:" + "0" * 64) is None
