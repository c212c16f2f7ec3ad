"""The nodes whose agents said hello, as the job store keeps them, and how their startup taint came off."""

from __future__ import annotations

from dataclasses import dataclass

from prewarm.domain.mirrors import MirrorConfig


@dataclass(frozen=True)
class NodeWarm:
    """How a node's startup taint came off (the agent's `Warmed`): `warm` or `timeout`, and when."""

    joined_at: float
    hello_at: float
    warm_at: float
    outcome: str
    missing: tuple[str, ...] = ()
    missing_total: int = 0

    @property
    def hello_to_warm(self) -> float:
        return max(0.0, self.warm_at - self.hello_at)

    @property
    def join_to_warm(self) -> float:
        return max(0.0, self.warm_at - self.joined_at)


@dataclass(frozen=True)
class NodeBoot:
    """What the node's first hello said of its required images (`prewarm.domain.boot`): those the control
    plane wanted on it then (pull references), and those its containerd already held (by digest)."""

    required: tuple[str, ...]
    present: tuple[str, ...]
    at: float  # when the hello was recorded

    @property
    def all_present(self) -> bool:
        """Every required image was there at boot (and at least one was required)."""
        return bool(self.required) and set(self.required) <= set(self.present)


@dataclass(frozen=True)
class NodeFootprint:
    """What the images Prewarm pulled on the node weigh, as its agent last said (`Footprint`): how many and
    their bytes (still there, pinned or not), and the bytes its removals freed, all told."""

    images: int
    bytes: int
    freed_bytes: int
    at: float  # when the agent measured it

    def as_dict(self) -> dict[str, int | float]:
        return {"images": self.images, "bytes": self.bytes, "freed_bytes": self.freed_bytes, "at": self.at}

    @classmethod
    def from_dict(cls, value: object) -> NodeFootprint | None:
        """The footprint `as_dict` gave, as stored; None for anything else (none stored)."""
        if not isinstance(value, dict):
            return None
        return cls(images=int(value.get("images", 0)), bytes=int(value.get("bytes", 0)),
                   freed_bytes=int(value.get("freed_bytes", 0)), at=float(value.get("at", 0)))


@dataclass
class RegisteredNode:
    """A node whose agent said hello: its labels and platform, its queue, and its warm-up."""

    name: str
    labels: dict[str, str]
    architecture: str
    os: str
    queue_url: str
    last_hello: float
    # The hello's: until when the node holds the startup taint, at the latest (None: it does not).
    warm_until: float | None = None
    # How its startup taint came off, once it has (kept across later hellos until the node warms again).
    warm: NodeWarm | None = None
    # The agent's package version, as its last hello said (empty: an agent too old to say).
    agent_version: str = ""
    # The registered cluster the node is in ("" for the stack's own): node names repeat across clusters.
    cluster: str = ""
    # Registered from the agent's own facts (its labels, assumed Ready) because its cluster could not be
    # read at its hello: its jobs are checked again against the cluster once it answers.
    unverified: bool = False
    # Its required images at its first hello, and which were present at boot (None: not recorded yet).
    boot: NodeBoot | None = None
    # Its containerd's node-local mirrors, as its last hello said (None: an agent too old to say).
    mirror_config: MirrorConfig | None = None
    # Prewarm's images on it and the bytes their removals freed (None: its agent has not said).
    footprint: NodeFootprint | None = None
