"""An image push, as the registry announces it: the event a prewarm rule answers (`ImagePush`)."""

from __future__ import annotations

from dataclasses import dataclass

INDEX_MEDIA_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)


@dataclass(frozen=True)
class ImagePush:
    """A successful ECR push, as the EventBridge `ECR Image Action` event describes it."""

    account: str
    region: str
    repository: str
    digest: str
    tag: str | None
    manifest_media_type: str = ""

    @property
    def is_index(self) -> bool:
        """Whether the digest pushed is of an image index (a multi-platform image)."""
        return self.manifest_media_type in INDEX_MEDIA_TYPES

    @property
    def registry_host(self) -> str:
        suffix = "amazonaws.com.cn" if self.region.startswith("cn-") else "amazonaws.com"
        return f"{self.account}.dkr.ecr.{self.region}.{suffix}"
