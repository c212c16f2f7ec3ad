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


def test_an_image_s_layers_are_its_manifest_s(ecr: Any) -> None:
    digest = put(ecr, manifest(7, "one"), OCI_MANIFEST, "v1")
    assert EcrImages(ecr).layer_count(ACCOUNT, "ml/model", digest) == 7


def test_an_index_s_layers_are_the_most_any_of_its_platforms_has_attestations_aside(ecr: Any) -> None:
    amd64, arm64 = put(ecr, manifest(4, "amd"), OCI_MANIFEST), put(ecr, manifest(9, "arm"), OCI_MANIFEST)
    attestation = put(ecr, manifest(30, "att"), OCI_MANIFEST)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd64, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": arm64, "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": OCI_MANIFEST, "digest": attestation, "size": 1,
         "platform": {"os": "unknown", "architecture": "unknown"}}]}
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
