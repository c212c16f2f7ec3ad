"""The registry that plays ECR in local mode, and what a push to it looks like to the stack.

The registry (`node/registry.py`) answers for the ECR host name of the local account and region, which
every node's containerd maps to it; a push stores the image there and in moto (so `BatchGetImage` answers
as ECR would) and returns ECR's PUSH event, which the caller delivers as EventBridge would.
"""

from __future__ import annotations

import base64
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.account import ACCOUNT, REGION


def ecr_host(account: str = ACCOUNT, region: str = REGION) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com"


# GetAuthorizationToken: "The authorization token is valid for 12 hours."
ECR_TOKEN_LIFETIME_SECONDS = 12 * 3600.0


@dataclass
class PushedToEcr:
    repository: str
    tag: str | None
    digest: str
    reference: str
    size_bytes: int
    pushed_at: float
    jobs: list[str] = field(default_factory=list)
    image: Any = field(default=None, repr=False)  # the OciImage pushed, which a replica copies


def push_to_local_ecr(
    registry_url: str, ecr: Any, repository: str, tag: str | None, *, size_mb: float, layers: int = 1
) -> tuple[PushedToEcr, dict[str, Any]]:
    """Pushes a fresh image to the registry that plays ECR and returns it with ECR's PUSH event.

    moto records the manifest too (so `BatchGetImage` answers as ECR would) but emits no event on a
    push: the caller delivers the returned event, as EventBridge would.
    """
    from prewarm_devtools.node.images import build_image, build_layer

    # `layers` layers of size_mb / layers each (as an image of several layers is pulled and unpacked).
    image = build_image(size_mb=size_mb) if layers == 1 else build_image(
        layers=[build_layer({f"layer-{n}": b"%d" % n}, size_mb / layers) for n in range(layers)])
    digest = store_image(registry_url, ecr, repository, tag, image)
    event = {
        "version": "0", "id": f"local-{digest[7:19]}", "detail-type": "ECR Image Action",
        "source": "aws.ecr", "account": ACCOUNT, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION, "resources": [],
        "detail": {"result": "SUCCESS", "repository-name": repository, "image-digest": digest,
                   "action-type": "PUSH", "manifest-media-type": image.manifest.media_type,
                   "artifact-media-type": image.config.media_type, **({"image-tag": tag} if tag else {})},
    }
    result = PushedToEcr(repository, tag, digest, f"{ecr_host()}/{repository}@{digest}",
                         image.total_size, time.time(), image=image)
    return result, event


def store_image(registry_url: str, ecr: Any, repository: str, tag: str | None, image: Any) -> str:
    """Pushes OCI image `image` to the registry at `registry_url` (with a token of `ecr`, a client of moto's
    ECR, which the registry admits) and records its manifest in that ECR; returns the digest."""
    from prewarm_devtools.node.images import RegistryPusher

    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    pusher = RegistryPusher(registry_url, auth=(user, password))
    pushed = pusher.push_image(repository, tag or "untagged-" + image.config.digest[7:19], image)
    with suppress(ecr.exceptions.RepositoryAlreadyExistsException):
        ecr.create_repository(repositoryName=repository)
    # The digest the registry computed: moto's own hashes the layer digests, not the manifest's bytes as ECR does.
    ecr.put_image(repositoryName=repository, imageManifest=image.manifest.data.decode(), imageDigest=pushed.digest,
                  imageManifestMediaType=image.manifest.media_type, **({"imageTag": tag} if tag else {}))
    return str(pushed.digest)
