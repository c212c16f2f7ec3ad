"""What ECR knows about an image: the platforms of a pushed index, its layer count and its size (`BatchGetImage`,
in the image's Region), and where the registry replicates a repository (`DescribeRegistry`)."""

from __future__ import annotations

import json
import logging
from typing import Any

from botocore.exceptions import ClientError

from prewarm.domain.registry_budget import ecr_image_id
from prewarm.domain.replication import Replication, ReplicationConfigError
from prewarm.domain.warm_budgets import ImageCost

log = logging.getLogger(__name__)

_MANIFEST_TYPES = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
]
# BatchGetImage: "imageIds ... Maximum number of 100 items."
_MAX_IMAGE_IDS = 100


def _image_id(reference: str) -> dict[str, str]:
    return {"imageDigest": reference} if reference.startswith("sha256:") else {"imageTag": reference}


class EcrError(Exception):
    """ECR refused or failed a read."""


class EcrImages:
    """`ImageMetadata` on ECR. Give it a boto3 ECR client, or it builds one on first use."""

    def __init__(self, client: Any = None) -> None:
        self._client = client
        # Clients of the other Regions asked (a replica's, a repository in another Region than the stack).
        self._elsewhere: dict[str, Any] = {}
        # The last manifest read of a digest, by (registry, repository, digest, region): a push asks for an
        # index's platforms and its layer count, one read (a digest's manifest never changes; a tag's may,
        # so a tag's is read each time: this object lives as long as a warm Lambda).
        self._last: tuple[tuple[str, str, str, str], list[dict[str, Any]]] | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("ecr")
        return self._client

    def _client_in(self, region: str) -> Any:
        """The client of `region` ("" or the stack's own: `client`)."""
        if not region or region == self.client.meta.region_name:
            return self.client
        if region not in self._elsewhere:
            import boto3

            self._elsewhere[region] = boto3.client("ecr", region_name=region)
        return self._elsewhere[region]

    def _manifests(self, registry_id: str, repository: str, digests: list[str],
                   region: str = "") -> list[dict[str, Any]]:
        client = self._client_in(region)
        try:
            out = client.batch_get_image(
                registryId=registry_id, repositoryName=repository,
                imageIds=[_image_id(d) for d in digests[:_MAX_IMAGE_IDS]], acceptedMediaTypes=_MANIFEST_TYPES,
            )
        except ClientError as e:
            raise EcrError(f"read manifest of {repository}@{digests[0]}: "
                           f"{e.response.get('Error', {}).get('Code')}") from e
        try:
            return [json.loads(image.get("imageManifest") or "{}") for image in out.get("images") or []]
        except json.JSONDecodeError as e:
            raise EcrError(f"manifest of {repository}@{digests[0]} is not JSON") from e

    def _manifest(self, registry_id: str, repository: str, digest: str, region: str) -> dict[str, Any] | None:
        """The manifest `digest` (a digest, or a tag) names (None: ECR has none), a digest's read once for
        consecutive asks."""
        key = (registry_id, repository, digest, region)
        if self._last is not None and self._last[0] == key:
            return self._last[1][0] if self._last[1] else None
        manifests = self._manifests(registry_id, repository, [digest], region)
        if digest.startswith("sha256:"):
            self._last = (key, manifests)
        return manifests[0] if manifests else None

    def layer_count(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None:
        """The layers of the image `digest` (a digest, or a tag) names (of an index, the most any of its images
        has), read in `region` ("": the client's); None when ECR cannot say (logged: the count only sizes
        the pull's share of the registry budget, never worth failing a push or a plan for)."""
        counts = [len(m.get("layers") or [])
                  for m in self._images(registry_id, repository, digest, region, "layer count")]
        return max(counts) if counts else None

    def image_bytes(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None:
        """The compressed bytes of the image `digest` names (config and layers as its manifest lists them; of
        an index, the largest image's), read as `layer_count` reads; None when ECR cannot say (logged)."""
        sizes = [sum(int(part.get("size") or 0) for part in [m.get("config") or {}, *m["layers"]])
                 for m in self._images(registry_id, repository, digest, region, "size")]
        return max(sizes) if sizes else None

    def _images(self, registry_id: str, repository: str, digest: str, region: str,
                what: str) -> list[dict[str, Any]]:
        """The image manifests `digest` names: itself, or an index's images of a known platform ([]: unknown)."""
        try:
            manifest = self._manifest(registry_id, repository, digest, region)
            manifests = [] if manifest is None else [manifest]
            if manifest is not None and "manifests" in manifest:
                children = [m["digest"] for m in manifest["manifests"]
                            if (m.get("platform") or {}).get("os") not in (None, "unknown") and m.get("digest")]
                manifests = self._manifests(registry_id, repository, children, region) if children else []
        except EcrError as e:
            log.warning("%s unknown: %s", what, e)
            return []
        return [m for m in manifests if "layers" in m]

    def image_size(self, image: str) -> ImageCost:
        """`ImageSizes` on ECR: the image's digest and compressed bytes (its layers and config as the manifest
        lists them; of an index, the largest platform's: which platform a node pulls is known at its plan).
        Another registry's image, or one ECR cannot read (logged), is unknown."""
        found = ecr_image_id(image)
        if found is None:
            return ImageCost(image)
        try:
            out = self._client_in(found.region).batch_get_image(
                registryId=found.registry_id, repositoryName=found.repository,
                imageIds=[_image_id(found.reference)], acceptedMediaTypes=_MANIFEST_TYPES)
            (read,) = out.get("images") or [None]
            if read is None:
                return ImageCost(image)
            manifest = json.loads(read.get("imageManifest") or "{}")
            digest = str((read.get("imageId") or {}).get("imageDigest") or "")
            manifests = [manifest]
            if "manifests" in manifest:
                children = [m["digest"] for m in manifest["manifests"]
                            if (m.get("platform") or {}).get("os") not in (None, "unknown") and m.get("digest")]
                manifests = (self._manifests(found.registry_id, found.repository, children, found.region)
                             if children else [])
        except (ClientError, EcrError, json.JSONDecodeError, ValueError) as e:
            log.warning("size of %s unknown: %s", image, e)
            return ImageCost(image)
        sizes = [sum(int(part.get("size") or 0) for part in [m.get("config") or {}, *m["layers"]])
                 for m in manifests if "layers" in m]
        return ImageCost(image, digest, max(sizes) if sizes else None)

    def platforms(self, registry_id: str, repository: str, digest: str, *,
                  region: str = "") -> list[dict[str, str]] | None:
        """The index's platforms, or None when the manifest is not an index (platform unknown)."""
        manifest = self._manifest(registry_id, repository, digest, region)
        if manifest is None or "manifests" not in manifest:
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


class EcrReplication:
    """`ReplicaRegions` on ECR: the registry's replication configuration, read with `DescribeRegistry` once
    (make one per push: a configuration changed later is read by the next push)."""

    def __init__(self, client: Any = None) -> None:
        self._client = client
        self._replication: Replication | None = None

    def replica_regions(self, repository: str) -> frozenset[str]:
        """The Regions `repository` is replicated to; none when ECR cannot say (logged: the clusters there
        pull the pushed image across Regions, as without replication)."""
        if self._replication is None:
            if self._client is None:
                import boto3

                self._client = boto3.client("ecr")
            try:
                self._replication = Replication.of_registry(self._client.describe_registry())
            except (ClientError, ReplicationConfigError) as e:
                log.warning("replication configuration unknown: %s", e)
                return frozenset()
        return self._replication.regions(repository)
