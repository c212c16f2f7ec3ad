"""`prewarm doctor`'s "warm snapshots" check: each node class points at the newest snapshot baked for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prewarm.domain.bakes import BakeStep, SnapshotState
from prewarm.domain.snapshots import WarmSnapshot
from prewarm.services.snapshot_ports import BakeError, NodeClasses
from prewarm_cli.doctor.checks import CheckResult

NAME = "warm snapshots"


def check_warm_snapshots(records: Sequence[tuple[dict[str, Any], dict[str, Any], int]],
                         node_classes: NodeClasses) -> CheckResult:
    """FAIL for a node class not on its newest baked snapshot (or that cannot be read); warn for one whose
    newer digests failed to bake (it stays on the older snapshot)."""
    wrong: list[str] = []
    failed: list[str] = []
    for manifest, data, _version in records:
        declared, state = WarmSnapshot.from_manifest(manifest), SnapshotState.from_dict(data)
        spec, current = declared.spec, state.current
        if current is None:
            continue
        try:
            pointed = node_classes.current_snapshot(spec.node_class.kind, spec.node_class.name,
                                                    spec.data_volume.device_name)
        except BakeError as e:
            wrong.append(f"{declared.name}: {e}")
            continue
        if pointed != current.id:
            wrong.append(f"{declared.name}: {spec.node_class.describe()} launches from {pointed or 'no snapshot'}, "
                         f"not {current.id} (baked by {current.bake_id})")
        elif state.stale and state.bake is not None and state.bake.step is BakeStep.FAILED:
            failed.append(f"{declared.name}: newer digests not baked ({state.bake.id}: {state.bake.reason})")
    if wrong:
        return CheckResult(NAME, False, "; ".join(wrong), "`prewarm describe snapshot NAME` says why; the sweep "
                           "publishes a completed bake again within a minute, or point the node class yourself")
    if failed:
        return CheckResult(NAME, True, "; ".join(failed), "the next push bakes again; fix what the bake says",
                           warning=True)
    baked = sum(1 for _m, data, _v in records if SnapshotState.from_dict(data).current is not None)
    return CheckResult(NAME, True, f"{baked} of {len(records)} node classes on their newest baked snapshot"
                       if records else "none declared")
