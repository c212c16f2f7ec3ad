"""Reading a pull's layers from its registry: endpoints from hosts.toml, auth challenges, platforms."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from prewarm.domain.images import parse_image
from prewarm.domain.placement import Platform
from prewarm.domain.registries import RegistryAuth
from prewarm_agent.manifests import (
    DOCKER_HUB_ENDPOINT,
    OCI_INDEX,
    OCI_MANIFEST,
    Endpoint,
    Fetch,
    ManifestError,
    ManifestResolver,
    registry_endpoints,
)

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
AMD64 = "sha256:" + "1" * 64
ARM64 = "sha256:" + "2" * 64


def test_without_hosts_toml_a_registry_is_asked_over_https(tmp_path: Path) -> None:
    assert registry_endpoints("quay.io", str(tmp_path)) == [Endpoint("https://quay.io")]
    assert registry_endpoints("docker.io", None) == [Endpoint(DOCKER_HUB_ENDPOINT)]


def test_a_loopback_registry_falls_back_to_plain_http() -> None:
    assert registry_endpoints("127.0.0.1:5000") == [Endpoint("https://127.0.0.1:5000"), Endpoint("http://127.0.0.1:5000")]
    assert registry_endpoints("localhost:5000")[-1] == Endpoint("http://localhost:5000")


def test_hosts_toml_mirrors_come_first_then_the_server(tmp_path: Path) -> None:
    (tmp_path / "quay.io").mkdir()
    (tmp_path / "quay.io" / "hosts.toml").write_text(
        'server = "https://quay.io"\n\n'
        '[host."https://mirror.internal:5000"]\n  capabilities = ["pull", "resolve"]\n  skip_verify = true\n\n'
        '[host."https://pull-only.internal"]\n  capabilities = ["pull"]\n',
        encoding="utf-8",
    )

    assert registry_endpoints("quay.io", str(tmp_path)) == [
        Endpoint("https://mirror.internal:5000", skip_verify=True),
        Endpoint("https://quay.io"),
    ]


def test_an_unreadable_hosts_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "quay.io").mkdir()
    (tmp_path / "quay.io" / "hosts.toml").write_text("server = \n", encoding="utf-8")

    with pytest.raises(ManifestError, match=r"cannot read .*quay\.io/hosts\.toml"):
        registry_endpoints("quay.io", str(tmp_path))


@pytest.mark.parametrize(
    ("platform", "entry", "matches"),
    [
        (Platform("linux", "amd64"), {"os": "linux", "architecture": "amd64"}, True),
        (Platform("linux", "amd64"), {"os": "linux", "architecture": "arm64"}, False),
        (Platform("linux", "amd64"), {"os": "windows", "architecture": "amd64"}, False),
        (Platform("linux", "arm64", "v8"), {"os": "linux", "architecture": "arm64"}, True),
        (Platform("linux", "arm64", "v8"), {"os": "linux", "architecture": "arm64", "variant": "v8"}, True),
        (Platform("linux", "arm", "v7"), {"os": "linux", "architecture": "arm", "variant": "v6"}, False),
        (Platform("linux", "amd64"), {"os": "unknown", "architecture": "unknown"}, False),
    ],
)
def test_platform_matching(platform: Platform, entry: dict[str, str], matches: bool) -> None:
    assert platform.matches(entry) is matches


class Registry:
    """Answers manifest GETs like a registry with Bearer token auth (or Basic with `basic=True`)."""

    def __init__(self, documents: Mapping[str, dict[str, object]], *, basic: bool = False) -> None:
        self.documents = documents
        self.basic = basic
        self.requests: list[tuple[str, dict[str, str]]] = []

    def fetch(self, endpoint: Endpoint) -> Fetch:
        def get(url: str, headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
            self.requests.append((url, dict(headers)))
            if url.startswith("https://auth.example.com/token"):
                if headers.get("Authorization") != "Basic " + base64.b64encode(b"ci:pw").decode():
                    return 401, {}, b""
                return 200, {}, json.dumps({"token": "bearer-token"}).encode()
            accepted = "Basic " + base64.b64encode(b"ci:pw").decode() if self.basic else "Bearer bearer-token"
            if headers.get("Authorization") != accepted:
                challenge = ('Basic realm="r"' if self.basic else
                             'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
                             'scope="repository:team/app:pull"')
                return 401, {"www-authenticate": challenge}, b""
            reference = url.rsplit("/", 1)[1]
            if reference not in self.documents:
                return 404, {}, b""
            return 200, {}, json.dumps(self.documents[reference]).encode()

        return get


def manifest(*layers: tuple[str, int]) -> dict[str, object]:
    return {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "layers": [{"digest": d, "size": s, "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"}
                       for d, s in layers]}


INDEX = {
    "schemaVersion": 2, "mediaType": OCI_INDEX,
    "manifests": [
        {"digest": AMD64, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": ARM64, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
    ],
}
AUTH = RegistryAuth("ci", "pw", "registry.example.com")


def test_an_index_is_resolved_to_this_platforms_layers_with_a_bearer_token() -> None:
    registry = Registry({"v1": INDEX, AMD64: manifest((A, 10)), ARM64: manifest((A, 10), (B, 20))})
    resolver = ManifestResolver(platform=Platform("linux", "arm64", "v8"), fetch=registry.fetch)

    layers = resolver.layers(parse_image("registry.example.com/team/app:v1"), AUTH)

    assert layers == {A: 10, B: 20}
    token_request = next(url for url, _ in registry.requests if url.startswith("https://auth.example.com/"))
    assert token_request == ("https://auth.example.com/token?service=registry.example.com"
                             "&scope=repository%3Ateam%2Fapp%3Apull")


def test_basic_auth_registries_get_the_credentials_and_digests_are_fetched_by_digest() -> None:
    registry = Registry({A: manifest((B, 5))}, basic=True)
    resolver = ManifestResolver(platform=Platform("linux", "amd64"), fetch=registry.fetch)

    assert resolver.layers(parse_image(f"registry.example.com/team/app:v1@{A}"), AUTH) == {B: 5}
    assert registry.requests[-1][0] == f"https://registry.example.com/v2/team/app/manifests/{A}"


def test_an_index_without_this_platform_is_an_error() -> None:
    registry = Registry({"v1": INDEX})
    resolver = ManifestResolver(platform=Platform("linux", "s390x"), fetch=registry.fetch)

    with pytest.raises(ManifestError, match="index has no manifest for linux/s390x"):
        resolver.layers(parse_image("registry.example.com/team/app:v1"), AUTH)


def test_refused_credentials_are_an_error_that_never_shows_them() -> None:
    registry = Registry({"v1": manifest((A, 1))}, basic=True)
    resolver = ManifestResolver(fetch=registry.fetch)

    with pytest.raises(ManifestError) as caught:
        resolver.layers(parse_image("registry.example.com/team/app:v1"), RegistryAuth("ci", "wrong", "r"))

    assert "401" in str(caught.value) or "refused" in str(caught.value)
    assert "wrong" not in str(caught.value)


def test_no_credentials_for_a_basic_registry_is_an_error() -> None:
    registry = Registry({"v1": manifest((A, 1))}, basic=True)

    with pytest.raises(ManifestError, match="needs credentials and none apply"):
        ManifestResolver(fetch=registry.fetch).layers(parse_image("registry.example.com/team/app:v1"), None)
