"""What a builder instance is told at launch: its user data, per AMI family, carrying the bake.

The agent runs on the builder in bake mode (`prewarm-agent bake`), not driven through SSM as
aws-samples/bottlerocket-images-cache drives `ctr images pull` in the admin container: no function
waits on a RunCommand, the pull goes through the CRI as on every node (same credentials, verification
by `ImageStatus`, digests reported), and its report goes to the status queue like any other
(docs/architecture.md, "Warm snapshots").
- Bottlerocket: a superpowered host container of the agent image; it reaches the host's containerd
  socket under `/.bottlerocket/rootfs`, and its user data (base64) is the bake.
- AL2023: a cloud-init shell part that formats and mounts the data volume at /var/lib/containerd before
  containerd starts, then runs the agent image with `ctr run` against the host's containerd.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from prewarm.domain.snapshots import AL2023_CONTAINERD_MOUNT, AmiFamily

BAKE_KEY = "prewarm-bake"
BOTTLEROCKET_CRI_SOCKET = "/.bottlerocket/rootfs/run/containerd/containerd.sock"


def bake_document(bake_id: str, warm_snapshot: str, images: list[str], status_queue_url: str,
                  region: str) -> dict[str, Any]:
    return {"bake": bake_id, "warm_snapshot": warm_snapshot, "images": images,
            "status_queue_url": status_queue_url, "region": region}


def _encoded(document: Mapping[str, Any]) -> str:
    return base64.b64encode(json.dumps(document, sort_keys=True).encode()).decode()


def builder_user_data(family: AmiFamily, agent_image: str, document: Mapping[str, Any], device_name: str) -> str:
    """The builder's user data (EC2 takes it base64-encoded: the adapter encodes it)."""
    if family is AmiFamily.BOTTLEROCKET:
        return (
            f'[settings.host-containers.{BAKE_KEY}]\n'
            f'source = "{agent_image}"\n'
            "enabled = true\nsuperpowered = true\n"
            f'user-data = "{_encoded(document)}"\n'
        )
    return (
        "#!/bin/bash\nset -euo pipefail\n"
        f"mkfs.xfs -f {device_name} && mkdir -p {AL2023_CONTAINERD_MOUNT} && "
        f"mount {device_name} {AL2023_CONTAINERD_MOUNT}\n"
        "systemctl restart containerd\n"
        f"ctr -n prewarm images pull {agent_image}\n"
        f"ctr -n prewarm run --rm --net-host --mount type=bind,src=/run/containerd,dst=/run/containerd,"
        f"options=rbind {agent_image} {BAKE_KEY} prewarm-agent bake {_encoded(document)}\n"
    )


class BuilderUserDataError(ValueError):
    """User data that carries no bake (not a builder's, or damaged)."""


def decode_bake_document(encoded: str) -> dict[str, Any]:
    """The bake document from its base64 JSON (the agent's argument, or a host container's user data)."""
    try:
        document = json.loads(base64.b64decode(encoded.strip(), validate=True))
    except (ValueError, TypeError) as e:
        raise BuilderUserDataError(f"the builder's bake document is not base64 JSON: {e}") from None
    missing = [k for k in ("bake", "warm_snapshot", "images", "status_queue_url", "region")
               if not isinstance(document, dict) or k not in document]
    if missing:
        raise BuilderUserDataError(f"the builder's bake document lacks {', '.join(missing)}")
    return dict(document)


def read_bake_document(user_data: str) -> dict[str, Any]:
    """The bake a builder's user data carries, whichever family's shape it has."""
    for line in user_data.splitlines():
        if line.startswith("user-data = "):
            return decode_bake_document(line.partition("=")[2].strip().strip('"'))
        if f" {BAKE_KEY} prewarm-agent bake " in line:
            return decode_bake_document(line.rsplit(" ", 1)[1])
    raise BuilderUserDataError("the user data carries no bake document (no host container or bake command)")
