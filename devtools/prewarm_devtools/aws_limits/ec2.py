"""EC2 calls moto lacks that warm snapshots make: Fast Snapshot Restore, answered as EC2 does.

Each (snapshot, Availability Zone) is enabled or disabled; an unknown snapshot or zone is an item of
`Unsuccessful` (the call itself succeeds, as on EC2), and so is a snapshot past the Region's quota.
"""

from __future__ import annotations

from typing import Any

# "Amazon EBS endpoints and quotas": snapshots enabled for fast snapshot restore, 5 per Region (adjustable).
FSR_SNAPSHOTS_PER_REGION = 5
_ACTIONS = ("EnableFastSnapshotRestores", "DisableFastSnapshotRestores")


def _error(snapshot: str, zone: str, code: str, message: str) -> dict[str, Any]:
    return {"SnapshotId": snapshot, "FastSnapshotRestoreStateErrors": [
        {"AvailabilityZone": zone, "Error": {"Code": code, "Message": message}}]}


def _listed(handler: Any, name: str) -> list[str]:
    """A list parameter, as moto parses the query by the operation's shape (`AvailabilityZones`) or by
    its wire name (`AvailabilityZone.N`)."""
    value = handler._get_param(f"{name}s") or handler._get_param(name) or []
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def fast_snapshot_restores(handler: Any, enabled: dict[str, set[str]]) -> dict[str, Any] | None:
    """EC2's answer to Enable/DisableFastSnapshotRestores (`enabled`: snapshot -> its zones, kept by the
    layer); None for any other request."""
    if getattr(handler, "service_name", "") != "ec2" or handler._get_action() not in _ACTIONS:
        return None
    enable = handler._get_action() == _ACTIONS[0]
    backend = handler.ec2_backend
    known = {z.name for z in backend.describe_availability_zones()}
    successful: list[dict[str, Any]] = []
    unsuccessful: list[dict[str, Any]] = []
    for snapshot in _listed(handler, "SourceSnapshotId"):
        for zone in _listed(handler, "AvailabilityZone"):
            if snapshot not in backend.snapshots:
                unsuccessful.append(_error(snapshot, zone, "InvalidSnapshot.NotFound",
                                           f"The snapshot '{snapshot}' does not exist."))
            elif zone not in known:
                unsuccessful.append(_error(snapshot, zone, "InvalidParameterValue",
                                           f"Invalid availability zone: [{zone}]"))
            elif enable and snapshot not in enabled and len(enabled) >= FSR_SNAPSHOTS_PER_REGION:
                unsuccessful.append(_error(snapshot, zone, "FastSnapshotRestoreLimitExceeded",
                                           f"at most {FSR_SNAPSHOTS_PER_REGION} snapshots per Region"))
            else:
                zones = enabled.setdefault(snapshot, set())
                (zones.add if enable else zones.discard)(zone)
                if not zones:
                    enabled.pop(snapshot)
                successful.append({"SnapshotId": snapshot, "AvailabilityZone": zone,
                                   "State": "enabling" if enable else "disabling",
                                   "OwnerId": backend.account_id})
    return {"Successful": successful, "Unsuccessful": unsuccessful}
