"""An image push, as the registry announces it: the event a prewarm rule answers (`ImagePush`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# An AWS Region's name, as ECR and EKS write it ("us-east-1", "us-gov-west-1").
REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]+")

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
    def may_be_index(self) -> bool:
        """Whether its manifest may be an index: it is one, or the event did not say (`ECR Replication
        Action` carries no media type), so its platforms are read from the manifest."""
        return self.is_index or not self.manifest_media_type

    @property
    def registry_host(self) -> str:
        return ecr_host(self.account, self.region)


def ecr_host(account: str, region: str) -> str:
    """The private ECR registry host of `account` in `region`.

    >>> ecr_host("123456789012", "eu-west-1")
    '123456789012.dkr.ecr.eu-west-1.amazonaws.com'
    """
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{suffix}"
