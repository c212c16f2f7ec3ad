"""Node-local registry mirrors (Spegel, Dragonfly) as a node's containerd is configured for them, and
whether containerd uses them.

containerd reads a registry's mirrors from `<config_path>/<registry>/hosts.toml` (`_default` for every
registry): each `[host."<url>"]` table is a mirror, tried in order before `server`. From 2.1, containerd
pulls CRI images through its transfer service unless its CRI images plugin sets `use_local_image_pull = true`
(`ContainerRuntime.pulls_through_transfer_service`), and pulls through the transfer service have been seen
to ignore those mirrors (spegel-org/spegel#1272, containerd 2.1.5 on EKS's AL2023): the mirror then serves
nothing, and every node pulls from the registry.
The agent reads both files and says what it found in its hello; `prewarm doctor` judges it here.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from prewarm.domain.runtimes import ContainerRuntime

# The CRI images plugin's table in containerd 2.x's config (version 3), and the CRI plugin's in a version 2
# config, which containerd 2.x migrates to it.
_IMAGES_PLUGINS = ("io.containerd.cri.v1.images", "io.containerd.grpc.v1.cri")
# What a hello carries at most: registries, and mirrors of each (the agent reads no more).
MIRROR_REGISTRIES_MAX = 64
MIRRORS_MAX = 16


class MirrorConfig(BaseModel):
    """What the node's containerd is configured with for node-local registry mirrors (`prewarm.domain.mirrors`):
    the mirror hosts of each registry's `hosts.toml` (by its directory name, `_default` for every registry),
    and whether its config sets `use_local_image_pull` (None: the config could not be read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mirrors: dict[Annotated[str, Field(max_length=255)],
                  Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=MIRRORS_MAX)]] = Field(
        default_factory=dict, max_length=MIRROR_REGISTRIES_MAX)
    local_image_pull: bool | None = None


def hosts_toml_mirrors(text: str) -> list[str]:
    """The mirror hosts of a `hosts.toml`, in the order containerd tries them (`ValueError`: not TOML)."""
    try:
        hosts = tomllib.loads(text).get("host") or {}
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not TOML: {e}") from e
    return [str(host) for host in hosts] if isinstance(hosts, Mapping) else []


def uses_local_image_pull(config_text: str) -> bool:
    """Whether a containerd config sets `use_local_image_pull = true` for CRI pulls (`ValueError`: not TOML)."""
    try:
        plugins: Any = tomllib.loads(config_text).get("plugins") or {}
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not TOML: {e}") from e
    return any(isinstance(plugins.get(name), Mapping) and plugins[name].get("use_local_image_pull") is True
               for name in _IMAGES_PLUGINS)


@dataclass(frozen=True)
class NodeMirrors:
    """What one node's agent found: `mirrors` by registry (its `hosts.toml` directory name), whether its
    containerd's config sets `use_local_image_pull` (None: the config could not be read), and the
    containerd its kubelet reports (None: unknown)."""

    node: str
    mirrors: Mapping[str, Sequence[str]]
    local_image_pull: bool | None
    runtime: ContainerRuntime | None = None

    @property
    def ignored(self) -> bool:
        """Whether containerd pulls through its transfer service, which ignores the mirrors."""
        if not self.mirrors or self.local_image_pull is not False:
            return False
        return self.runtime is None or self.runtime.pulls_through_transfer_service


# How to make containerd 2.1+'s CRI pull through the mirrors.
LOCAL_PULL_FIX = ("set use_local_image_pull = true under [plugins.'io.containerd.cri.v1.images'] in containerd's "
                  "config and restart it (spegel-org/spegel#1272; docs/agent.md, \"Mirrors\")")


@dataclass(frozen=True)
class MirrorFinding:
    """`warn` (with `fix`) where containerd ignores the mirror, else `ok`."""

    warning: bool
    text: str
    fix: str = ""


def judge_mirrors(nodes: Sequence[NodeMirrors], reported: int) -> MirrorFinding:
    """`prewarm doctor`'s line on node-local mirrors over the nodes whose agents reported their registry
    config (`reported` of them; agents older than the report are not in `nodes`)."""
    with_mirror = [n for n in nodes if n.mirrors]
    if not with_mirror:
        return MirrorFinding(False, f"no node-local registry mirror in containerd's hosts.toml on {reported} "
                                    "nodes: every node pulls from the registry")
    first = min(with_mirror, key=lambda n: n.node)
    registry, hosts = sorted(first.mirrors.items())[0]
    seen = f"node-local mirror on {len(with_mirror)} of {reported} nodes ({', '.join(hosts)} for {registry} on " \
           f"{first.node})"
    ignored = sorted(n.node for n in with_mirror if n.ignored)
    if ignored:
        names = ", ".join(ignored[:3]) + (f" and {len(ignored) - 3} more" if len(ignored) > 3 else "")
        return MirrorFinding(True, f"{seen}, but containerd 2.1+ on {len(ignored)} ({names}) pulls through its "
                                   "transfer service, which ignores it", LOCAL_PULL_FIX)
    unread = sum(1 for n in with_mirror if n.local_image_pull is None)
    return MirrorFinding(False, seen + (f"; containerd's config unread on {unread}" if unread else ""))
