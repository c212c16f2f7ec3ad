"""The agent's bake mode (prewarm_agent.baking): every image pulled through the CRI and checked, its
digest reported, or the first image that failed named with why."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.refresh import RegistryConfig, RegistryToken
from prewarm_agent.baking import bake
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import ImagePullError

HOST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"


@dataclass
class Pull:
    error: Exception | None = None

    def result(self, timeout: float | None = None) -> str:
        if self.error is not None:
            raise self.error
        return "sha256:id"


@dataclass
class FakeRuntime:
    refused: dict[str, Exception] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)
    auths: list[tuple[str, Any]] = field(default_factory=list)

    def pull_image(self, image: str, auth: tuple[str, str] | None = None, sandbox_labels: Any = None,
                   sandbox_annotations: Any = None, timeout: float | None = None) -> Pull:
        self.auths.append((image, auth))
        error = self.refused.get(image)
        if error is None:
            self.present.add(image)
        return Pull(error)

    def image_status(self, image: str) -> ImageInfo | None:
        if image not in self.present:
            return None
        name = image.rsplit(":", 1)[0]
        # The same content may hold a digest under another name too (listed first): only the image's own counts
        digests = (f"other.example/mirror@{digest_of('x')}", f"{name}@{digest_of(image)}")
        return ImageInfo("sha256:id", (image,), digests, 1000)


def digest_of(image: str) -> str:
    """A digest of each image its own, so that one image's digest reported for another shows."""
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


class FakeTokens:
    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def token(self, registry: RegistryConfig) -> RegistryToken:
        self.asked.append(registry.account)
        return RegistryToken.for_hosts("AWS", "secret", registry.hosts, issued_at=0.0, expires_at=1.0)


def document(*images: str) -> dict[str, Any]:
    return {"bake": "gpu-1", "warm_snapshot": "gpu", "images": list(images), "status_queue_url": "q",
            "region": "us-west-2"}


def test_every_image_is_pulled_with_one_token_per_registry_and_its_digest_reported() -> None:
    runtime, tokens = FakeRuntime(), FakeTokens()
    images = [f"{HOST}/ml/a:v1", f"{HOST}/ml/b:v2", "docker.io/library/busybox:1"]
    baked = bake(document(*images), runtime, tokens)  # type: ignore[arg-type]
    assert baked.ok and baked.digests == {image: digest_of(image) for image in images} and baked.image_bytes == 3000
    assert tokens.asked == ["123456789012"]
    assert [auth for _, auth in runtime.auths] == [("AWS", "secret"), ("AWS", "secret"), None]


def test_the_first_image_refused_ends_the_bake_naming_it_and_why() -> None:
    refused = f"{HOST}/ml/b:v2"
    runtime = FakeRuntime(refused={refused: ImagePullError("403 Forbidden", image=refused)})
    baked = bake(document(f"{HOST}/ml/a:v1", refused, f"{HOST}/ml/c:v3"), runtime, FakeTokens())  # type: ignore[arg-type]
    assert not baked.ok and baked.message.startswith(f"{refused}: ") and "403 Forbidden" in baked.message
    assert baked.digests == {f"{HOST}/ml/a:v1": digest_of(f"{HOST}/ml/a:v1")}
    assert [image for image, _ in runtime.auths] == [f"{HOST}/ml/a:v1", refused]


def test_an_image_the_runtime_does_not_show_after_its_pull_fails_the_bake() -> None:
    class Forgetful(FakeRuntime):
        def image_status(self, image: str) -> ImageInfo | None:
            return None

    baked = bake(document(f"{HOST}/ml/a:v1"), Forgetful(), FakeTokens())  # type: ignore[arg-type]
    assert not baked.ok and baked.message == f"{HOST}/ml/a:v1: pulled, but the runtime does not show it (ImageStatus)"
