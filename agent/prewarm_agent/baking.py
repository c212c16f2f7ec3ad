"""`prewarm-agent bake DOCUMENT` (`python -m prewarm_agent.baking`): the agent on a warm snapshot's builder.

It pulls each image of the bake through the CRI into the builder's containerd (whose root is the data
volume to be snapshotted), checks each with `ImageStatus`, and reports one `Baked` to the status queue:
the digests it holds, or the first image it could not pull and why. ECR is asked for a token as the
builder's instance role (BuilderRole), once per registry. Then it exits: the control plane stops the
instance and snapshots the volume. How the agent runs on each AMI family: `prewarm.domain.builders`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from prewarm.adapters.ecr_auth import EcrTokenSource, RegistryTokenError
from prewarm.domain.builders import BOTTLEROCKET_CRI_SOCKET, decode_bake_document
from prewarm.domain.images import parse_image
from prewarm.domain.messages import Baked
from prewarm.domain.refresh import RegistryConfig
from prewarm.domain.registries import ecr_registry_for
from prewarm_agent.cri.client import CriImageClient, ImageInfo
from prewarm_agent.cri.errors import CriError

log = logging.getLogger("prewarm_agent.baking")

# One image of many GB on a cold volume: the bake's own time budget bounds the whole.
PULL_TIMEOUT_SECONDS = 3600.0
_DEFAULT_SOCKET = "/run/containerd/containerd.sock"
BOTTLEROCKET_USER_DATA = "/.bottlerocket/host-containers/current/user-data"


class BakeRuntime(Protocol):
    def pull_image(self, image: str, auth: tuple[str, str] | None = None, sandbox_labels: Any = None,
                   sandbox_annotations: Any = None, timeout: float | None = None) -> Any: ...
    def image_status(self, image: str) -> ImageInfo | None: ...


def _auth(tokens: EcrTokenSource, image: str, cache: dict[str, tuple[str, str] | None]) -> tuple[str, str] | None:
    registry = ecr_registry_for(image)
    if registry is None or registry.public:
        return None
    if registry.host not in cache:
        token = tokens.token(RegistryConfig(account=registry.account, region=registry.region))
        found = next((a for a in token.auths if a.server == registry.host), token.auths[0])
        cache[registry.host] = (found.username, found.password)
    return cache[registry.host]


def bake(document: dict[str, Any], runtime: BakeRuntime, tokens: EcrTokenSource,
         timeout: float = PULL_TIMEOUT_SECONDS) -> Baked:
    """Pulls every image of `document` and says what the volume now holds (or why it does not)."""
    digests: dict[str, str] = {}
    total = 0
    auths: dict[str, tuple[str, str] | None] = {}
    head = {"warm_snapshot": document["warm_snapshot"], "bake": document["bake"]}
    for image in document["images"]:
        try:
            runtime.pull_image(image, auth=_auth(tokens, image, auths), timeout=timeout).result()
            info = runtime.image_status(image)
        except (CriError, RegistryTokenError) as e:
            return Baked(**head, ok=False, digests=digests, image_bytes=total, message=f"{image}: {e}")
        name = parse_image(image).name
        digest = next((d.partition("@")[2] for d in (info.repo_digests if info else ()) if d.startswith(name + "@")),
                      None)
        if info is None or digest is None:
            return Baked(**head, ok=False, digests=digests, image_bytes=total,
                         message=f"{image}: pulled, but the runtime does not show it (ImageStatus)")
        digests[image] = digest
        total += info.size
        log.info("baked %s at %s (%d bytes)", image, digest, info.size)
    return Baked(**head, ok=True, digests=digests, image_bytes=total)


def main(argv: Sequence[str] | None = None) -> int:
    """Reads the bake (the argument, or the host container's user data file), bakes, reports; 0 when baked."""
    import boto3

    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), stream=sys.stderr)
    if args:
        document = decode_bake_document(args[0])
    else:  # Bottlerocket hands a host container its user data in this file
        with open(BOTTLEROCKET_USER_DATA, encoding="utf-8") as f:
            document = decode_bake_document(f.read())
    default = BOTTLEROCKET_CRI_SOCKET if os.path.exists(BOTTLEROCKET_CRI_SOCKET) else _DEFAULT_SOCKET
    runtime = CriImageClient(os.environ.get("CRI_SOCKET", default))
    try:
        baked = bake(document, runtime, EcrTokenSource())
    finally:
        runtime.close()
    sqs = boto3.client("sqs", region_name=document["region"])
    sqs.send_message(QueueUrl=document["status_queue_url"], MessageBody=json.dumps(baked.model_dump(mode="json")))
    log.info("bake %s reported: %s", baked.bake, "baked" if baked.ok else baked.message)
    return 0 if baked.ok else 1


if __name__ == "__main__":
    sys.exit(main())
