"""What ECR knows about an image: the platforms of a pushed index (`BatchGetImage`)."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

_INDEX_TYPES = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
]


class EcrError(Exception):
    """ECR refused or failed a read."""


class EcrImages:
    """`ImageMetadata` on ECR. Give it a boto3 ECR client, or it builds one on first use."""

    def __init__(self, client: Any = None) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("ecr")
        return self._client

    def platforms(self, registry_id: str, repository: str, digest: str) -> list[dict[str, str]] | None:
        """The index's platforms, or None when the manifest is not an index (platform unknown)."""
        try:
            out = self.client.batch_get_image(
                registryId=registry_id, repositoryName=repository, imageIds=[{"imageDigest": digest}],
                acceptedMediaTypes=_INDEX_TYPES,
            )
        except ClientError as e:
            raise EcrError(f"read manifest of {repository}@{digest}: {e.response.get('Error', {}).get('Code')}") from e
        images = out.get("images") or []
        if not images:
            return None
        try:
            manifest = json.loads(images[0].get("imageManifest") or "{}")
        except json.JSONDecodeError as e:
            raise EcrError(f"manifest of {repository}@{digest} is not JSON") from e
        if "manifests" not in manifest:
            return None
        platforms = []
        for entry in manifest["manifests"]:
            p = entry.get("platform") or {}
            # Attestation manifests (buildx provenance) are listed as unknown/unknown: not a platform.
            if not p.get("os") or p.get("os") == "unknown" or p.get("architecture") == "unknown":
                continue
            item = {"os": p["os"], "architecture": p["architecture"]}
            if p.get("variant"):
                item["variant"] = p["variant"]
            platforms.append(item)
        return platforms or None
