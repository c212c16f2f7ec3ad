"""How `prewarm get snapshots` and `prewarm describe snapshot` print warm snapshots: per node class, the
snapshot it boots from, its digests, its age against the newest push, the nodes booted from it (those
Karpenter labels with the class whose first hello came after its publish), its status word, and the last
bake's steps and cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prewarm.domain.bakes import SnapshotState, cost, with_fsr_declared
from prewarm.domain.nodes import RegisteredNode
from prewarm.domain.snapshots import FSR_DOLLARS_PER_AZ_HOUR, SNAPSHOT_DOLLARS_PER_GB_MONTH, WarmSnapshot
from prewarm_cli.output import NONE, human_age, human_bytes, rfc3339, table

# Karpenter labels each node it launches with its EC2NodeClass (karpenter.k8s.aws/ec2nodeclass).
NODE_CLASS_LABEL = "karpenter.k8s.aws/ec2nodeclass"

Record = tuple[dict[str, Any], dict[str, Any], int]


def status_word(state: SnapshotState) -> str:
    """Where the node class stands against the image set (docs/cli.md, "get snapshots"), the first that holds:
    Deleting (the WarmSnapshot is deleted; FSR is being disabled on its snapshots), Pending (nothing to bake:
    no image declared, no push matched), Current (the snapshot holds the image set), Failed (it does not,
    and the last bake failed: nothing retries before the next push or change of the spec, whether or not an
    earlier snapshot is current), Baking (no snapshot yet: the first bake runs), Stale (the snapshot lacks
    an image or holds a dropped one; the bake in LAST BAKE catches up)."""
    if state.deleted_at is not None:
        return "Deleting"
    if state.current is None and not state.images:
        return "Pending"
    if not state.stale:
        return "Current"
    if state.last_bake_failed:
        return "Failed"
    return "Baking" if state.current is None else "Stale"


def booted_from(declared: WarmSnapshot, state: SnapshotState, nodes: Sequence[RegisteredNode]) -> list[str]:
    """Nodes of the class whose first hello (their boot record) came after its current snapshot was
    published: booted from it, as far as the control plane can tell (an EC2NodeClass's nodes carry its
    label; a launch template's nothing). A later hello (an agent restarted) is no boot; a node with no
    boot record is not counted."""
    current, node_class = state.current, declared.spec.node_class
    if current is None or node_class.ec2_node_class is None:
        return []
    return sorted(n.name for n in nodes if n.labels.get(NODE_CLASS_LABEL) == node_class.ec2_node_class
                  and n.boot is not None and n.boot.at >= current.created_at)


def snapshots_table(records: Sequence[Record], *, now: float) -> str:
    rows = []
    for manifest, data, _version in records:
        declared, state = WarmSnapshot.from_manifest(manifest), SnapshotState.from_dict(data)
        current = state.current
        rows.append([declared.name, declared.spec.node_class.describe(), current.id if current else NONE,
                     len(current.digests) if current else 0,
                     human_age(now - current.created_at) if current else NONE,
                     human_age(now - state.newest_push_at) if state.newest_push_at else NONE,
                     status_word(state), f"{state.bake.id} {state.bake.step}" if state.bake else NONE])
    return table(["NAME", "NODE CLASS", "SNAPSHOT", "IMAGES", "AGE", "NEWEST PUSH", "STATUS", "LAST BAKE"], rows)


def describe_snapshot(record: Record, nodes: Sequence[RegisteredNode], *, now: float) -> str:
    manifest, data, _version = record
    declared = WarmSnapshot.from_manifest(manifest)
    spec = declared.spec
    zones = spec.fast_snapshot_restore.availability_zones if spec.fast_snapshot_restore else []
    # As the bakes' next event records it: FSR on the current snapshot the spec no longer names is owed off.
    state = with_fsr_declared(SnapshotState.from_dict(data), zones)
    current, bake = state.current, state.bake
    lines = [f"Name:          {declared.name}", f"Node class:    {spec.node_class.describe()}",
             f"AMI family:    {spec.ami_family} (data volume {spec.data_volume.device_name})",
             f"Status:        {status_word(state)}", f"Message:       {state.message()}",
             f"Snapshot:      {current.id if current else NONE}"]
    if current is not None:
        age = f"{rfc3339(current.created_at)} ({human_age(now - current.created_at)} ago)"
        newest = f", newest push {human_age(now - state.newest_push_at)} ago" if state.newest_push_at else ""
        lines += [f"Published:     {age}{newest}", "Digests:"]
        lines += [f"  {ref}  {digest}" for ref, digest in sorted(current.digests.items())]
    pending = {ref: d for ref, d in state.images.items() if d and (not current or current.digests.get(ref) != d)}
    if pending:
        lines.append("Pushed, not baked:")
        lines += [f"  {ref}  {digest}" for ref, digest in sorted(pending.items())]
    booted = booted_from(declared, state, nodes)
    lines.append(f"Nodes booted from it: {', '.join(booted) if booted else NONE}")
    lines.append(f"Kept:          {', '.join(s.id for s in state.snapshots) or NONE} (keep {spec.keep})")
    lines += _fsr_lines(state, zones)
    if bake is not None:
        lines.append(f"Last bake:     {bake.id}, {bake.step}" + (f": {bake.reason}" if bake.reason else ""))
        lines += [f"  {step.step:<13}{rfc3339(step.at)}" + (f"  {step.note}" if step.note else "")
                  for step in bake.steps]
    spent = cost(state, now)
    storage, fsr = spent.dollars(SNAPSHOT_DOLLARS_PER_GB_MONTH, FSR_DOLLARS_PER_AZ_HOUR)
    stored = human_bytes(sum(s.stored_bytes for s in state.snapshots))
    lines.append(f"Cost:          builder {spent.builder_minutes} min; {spent.gb_stored} GB stored ({stored}, "
                 f"${storage:.2f} a month); FSR {spent.fsr_hours} AZ-hours (${fsr:.2f})")
    return "\n".join(lines)


def _fsr_lines(state: SnapshotState, zones: Sequence[str]) -> list[str]:
    """Fast Snapshot Restore as enabled (billed until disabled), what is being disabled, and zones declared
    but not enabled on the current snapshot (from the next one)."""
    enabled = [(s.id, s.fsr_zones) for s in state.snapshots if s.fsr_zones]
    lines = []
    if enabled:
        az = sum(len(z) for _s, z in enabled)
        lines.append("Fast Snapshot Restore: " + "; ".join(f"{', '.join(z)} on {s}" for s, z in enabled)
                     + f", ${az * FSR_DOLLARS_PER_AZ_HOUR:.2f} an hour (${FSR_DOLLARS_PER_AZ_HOUR} per AZ-hour)")
    if state.clean_up.fsr_off:
        lines.append("  being disabled: " + "; ".join(f"{', '.join(z)} on {s}"
                                                      for s, z in state.clean_up.fsr_off.items()))
    held = set(state.current.fsr_zones or ()) if state.current else set()
    if state.deleted_at is None and (later := [z for z in zones if z not in held]):
        lines.append(f"  declared, enabled from the next snapshot: {', '.join(later)}")
    return lines


def snapshot_document(record: Record) -> dict[str, Any]:
    """The WarmSnapshot manifest with its status, for -o yaml|json|name."""
    manifest, data, _version = record
    return {**manifest, "status": SnapshotState.from_dict(data).resource_status()}
