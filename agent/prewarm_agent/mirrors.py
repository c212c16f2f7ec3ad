"""What the node's containerd is configured with for node-local registry mirrors, for the hello: each
registry's `hosts.toml` mirrors under its `config_path`, and its config's `use_local_image_pull`
(`prewarm.domain.mirrors`). Read from the two read-only mounts the DaemonSet gives the agent."""

from __future__ import annotations

import logging
from pathlib import Path

from prewarm.domain.mirrors import (
    MIRROR_REGISTRIES_MAX,
    MIRRORS_MAX,
    MirrorConfig,
    hosts_toml_mirrors,
    uses_local_image_pull,
)

log = logging.getLogger(__name__)


def read_mirror_config(config_path: str, containerd_config: str) -> MirrorConfig:
    """The mirrors of each `<config_path>/<registry>/hosts.toml` and whether `containerd_config` sets
    `use_local_image_pull` (None when it is not given or cannot be read). A file that cannot be read or
    parsed is skipped, logged."""
    mirrors: dict[str, list[str]] = {}
    root = Path(config_path) if config_path else None
    registries = sorted(root.glob("*/hosts.toml")) if root is not None and root.is_dir() else []
    for hosts in registries[:MIRROR_REGISTRIES_MAX]:
        try:
            found = hosts_toml_mirrors(hosts.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning("registry mirrors of %s not read: %s", hosts, e)
            continue
        if found:
            mirrors[hosts.parent.name] = found[:MIRRORS_MAX]
    local: bool | None = None
    if containerd_config:
        try:
            local = uses_local_image_pull(Path(containerd_config).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning("containerd's config %s not read, so whether it uses the mirrors is unknown: %s",
                        containerd_config, e)
    return MirrorConfig(mirrors=mirrors, local_image_pull=local)
