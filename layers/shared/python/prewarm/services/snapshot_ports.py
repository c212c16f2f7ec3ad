"""The ports baking warm snapshots needs (`prewarm.services.bakes`): the builders and snapshots (EC2/EBS)
and the node classes that point at them, and the errors they raise. Kept apart from `ports`, which every
function imports, as only the bake path and `doctor` use them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prewarm.domain.launch_sources import Architecture, LaunchSource
    from prewarm.domain.snapshots import AmiFamily

# --- Warm snapshots: their records, the builders and snapshots (EC2/EBS), the node classes ----------

class BakeError(RuntimeError):
    """An EC2 or EBS call of a bake failed; the message names the call and what AWS said."""


class NodeClassMissingError(BakeError):
    """The node class a warm snapshot names does not exist (or has no such data volume)."""


class Builders(Protocol):
    """The builder instances and the snapshots of their data volumes, all tagged as the stack's."""

    def launch(self, bake_id: str, warm_snapshot: str, image_id: str, instance_type: str, subnet_id: str,
               device_name: str, size_gib: int, user_data: str) -> tuple[str, str]:
        """Runs a builder (idempotent per bake id); returns its instance id and data volume id."""
        ...
    def stop(self, instance_id: str) -> None: ...
    def terminate(self, instance_id: str) -> None: ...
    def running_builders(self) -> list[tuple[str, str, str, float]]:
        """(instance id, warm snapshot, bake id, launch time) of every builder of the stack not yet terminated."""
        ...
    def builder_state(self, instance_id: str) -> str | None: ...  # EC2's (`running`, ...); None: not known yet
    def create_snapshot(self, volume_id: str, bake_id: str, warm_snapshot: str) -> str: ...
    def snapshot_of(self, bake_id: str) -> tuple[str, str] | None:
        """(snapshot id, state) of the snapshot a bake made, if any: a bake resumed finds it again."""
        ...
    def snapshot_owner(self, snapshot_id: str) -> tuple[str, str] | None:
        """(warm snapshot name, bake id) from the snapshot's tags; None if it is not the stack's."""
        ...
    def tag_snapshot(self, snapshot_id: str, digests: Mapping[str, str]) -> None: ...
    def enable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None: ...
    def disable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None: ...
    def delete_snapshot(self, snapshot_id: str) -> None: ...


class NodeClasses(Protocol):
    """Karpenter EC2NodeClasses (through the cluster's API) and launch templates (through EC2)."""

    def current_snapshot(self, kind: str, name: str, device_name: str) -> str | None:
        """The snapshot the node class's data volume starts from; NodeClassMissingError if no such class."""
        ...
    def point_at(self, kind: str, name: str, device_name: str, snapshot_id: str) -> None: ...
    def launch_source(self, kind: str, name: str, family: AmiFamily) -> LaunchSource:
        """Where the class's nodes launch: its AMI and subnets (BakeError if they cannot be read)."""
        ...
    def ami_architecture(self, image_id: str) -> Architecture:
        """The architecture of the AMI a spec names (`ami-...`, or `resolve:ssm:...`); BakeError if unknown."""
        ...
