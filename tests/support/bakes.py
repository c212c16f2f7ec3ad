"""Fakes of the ports a bake calls (`services.snapshot_ports`: EC2's builders and snapshots, the node
classes) and the steps that drive one warm snapshot ("gpu") through them, on the in-memory store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.bakes import SnapshotState
from prewarm.domain.launch_sources import Architecture, LaunchSource
from prewarm.domain.messages import Baked
from prewarm.domain.push import ImagePush
from prewarm.domain.snapshots import AmiFamily
from prewarm.services import bakes
from prewarm.services.bakes import BakeContext, BakeSettings
from prewarm.services.snapshot_ports import BakeError, NodeClassMissingError
from tests.support.memory_store import MemoryJobStore

HOST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
REF = f"{HOST}/ml/trainer:v1"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")


@dataclass
class FakeEc2:
    """Builders and snapshots as EC2 keeps them: ids, states and who was asked what."""

    instances: dict[str, str] = field(default_factory=dict)  # id -> state
    snapshots: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> (warm snapshot, bake, state)
    launched_at: dict[str, float] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # instance id -> its warm snapshot tag
    calls: list[str] = field(default_factory=list)
    refuse: str = ""
    instance_types: list[str] = field(default_factory=list)
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)  # bake id -> (image id, subnet id)
    faults: dict[str, str] = field(default_factory=dict)  # a call as `calls` names it -> what EC2 says
    fsr: dict[str, set[str]] = field(default_factory=dict)  # snapshot -> the zones FSR is enabled (billed) in

    def _fault(self, call: str) -> None:
        if call in self.faults:
            raise BakeError(self.faults[call])

    def launch(self, bake_id: str, warm_snapshot: str, image_id: str, instance_type: str, subnet_id: str,
               device_name: str, size_gib: int, user_data: str) -> tuple[str, str]:
        if self.refuse:
            raise BakeError(self.refuse)
        instance = f"i-{bake_id}"  # the client token makes it idempotent
        self.sources[bake_id] = (image_id, subnet_id)
        self.instances.setdefault(instance, "running")
        self.launched_at.setdefault(instance, 0.0)
        self.owners.setdefault(instance, warm_snapshot)
        self.calls.append(f"launch {bake_id}")
        self.instance_types.append(instance_type)
        return instance, f"vol-{bake_id}"

    def stop(self, instance_id: str) -> None:
        self.instances[instance_id] = "stopped"

    def terminate(self, instance_id: str) -> None:
        self._fault(f"terminate {instance_id}")
        self.instances[instance_id] = "terminated"
        self.calls.append(f"terminate {instance_id}")

    def running_builders(self) -> list[tuple[str, str, str, float]]:
        return [(i, self.owners.get(i, ""), i[2:], self.launched_at[i]) for i, s in self.instances.items()
                if s != "terminated"]

    def builder_state(self, instance_id: str) -> str | None:
        self._fault(f"state {instance_id}")
        return self.instances.get(instance_id)

    def create_snapshot(self, volume_id: str, bake_id: str, warm_snapshot: str) -> str:
        snapshot = f"snap-{len(self.snapshots) + 1}"
        self.snapshots[snapshot] = (warm_snapshot, bake_id, "pending")
        return snapshot

    def snapshot_of(self, bake_id: str) -> tuple[str, str] | None:
        return next(((s, v[2]) for s, v in self.snapshots.items() if v[1] == bake_id), None)

    def snapshot_owner(self, snapshot_id: str) -> tuple[str, str] | None:
        found = self.snapshots.get(snapshot_id)
        return (found[0], found[1]) if found else None

    def tag_snapshot(self, snapshot_id: str, digests: Mapping[str, str]) -> None:
        self.calls.append(f"tag {snapshot_id} {dict(digests)}")

    def enable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None:
        self.calls.append(f"fsr {snapshot_id} {list(zones)}")
        self.fsr.setdefault(snapshot_id, set()).update(zones)

    def disable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None:
        self._fault(f"no fsr {snapshot_id}")
        self.calls.append(f"no fsr {snapshot_id}")
        self.fsr[snapshot_id] = self.fsr.get(snapshot_id, set()) - set(zones)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._fault(f"delete {snapshot_id}")
        self.snapshots.pop(snapshot_id, None)
        self.fsr.pop(snapshot_id, None)  # EBS disables FSR with the snapshot
        self.calls.append(f"delete {snapshot_id}")

    def billed_fsr(self) -> dict[str, set[str]]:
        """The zones FSR is still enabled in, per snapshot: what EBS bills by the hour."""
        return {s: z for s, z in self.fsr.items() if z}


@dataclass
class FakeNodeClasses:
    pointed: dict[str, str] = field(default_factory=lambda: {"gpu": ""})
    unreadable: str = ""
    architecture: Architecture = Architecture.X86_64
    amis: dict[str, Architecture] = field(default_factory=dict)  # AMI id -> its architecture (DescribeImages)

    def current_snapshot(self, kind: str, name: str, device_name: str) -> str | None:
        if name not in self.pointed:
            raise NodeClassMissingError(f"{kind} {name} does not exist")
        return self.pointed[name] or None

    def point_at(self, kind: str, name: str, device_name: str, snapshot_id: str) -> None:
        self.pointed[name] = snapshot_id

    def launch_source(self, kind: str, name: str, family: AmiFamily) -> LaunchSource:
        if self.unreadable:
            raise BakeError(self.unreadable)
        return LaunchSource(f"resolve:ssm:/aws/service/{family}",
                            ("subnet-0000000000000000a", "subnet-0000000000000000b"), self.architecture)

    def ami_architecture(self, image_id: str) -> Architecture:
        if image_id not in self.amis:
            raise BakeError(f"describe {image_id}: InvalidAMIID.NotFound")
        return self.amis[image_id]


def manifest(name: str = "gpu", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "WarmSnapshot", "metadata": {"name": name},
            "spec": {"nodeClass": {"ec2NodeClass": name}, "amiFamily": "Bottlerocket", "rules": ["ml"],
                     "builder": {"subnetIds": ["subnet-0123456789abcdef0"], "timeBudgetSeconds": 600}, **spec}}


def context(**spec: Any) -> tuple[BakeContext, FakeEc2, FakeNodeClasses]:
    store, ec2, classes = MemoryJobStore(), FakeEc2(), FakeNodeClasses()
    store.put_warm_snapshot("gpu", manifest(**spec), "h")
    return BakeContext(store, ec2, classes, BakeSettings("https://sqs/status", "us-west-2", "agent:1")), ec2, classes


def declare(ctx: BakeContext, now: float = 0.0, **spec: Any) -> None:
    """The spec applied again, changed: the table's stream then advances it."""
    ctx.store.put_warm_snapshot("gpu", manifest(**spec), str(sorted(spec.items())))
    bakes.advance(ctx, "gpu", now)


def push(ctx: BakeContext, digest: str, now: float, tag: str = "v1") -> None:
    bakes.record_push(ctx.store, ImagePush("123456789012", "us-west-2", "ml/trainer", digest, tag), ["ml"], now)
    bakes.advance(ctx, "gpu", now)


def state(ctx: BakeContext) -> SnapshotState:
    found = ctx.store.get_warm_snapshot("gpu")
    assert found is not None
    return SnapshotState.from_dict(found[1])


def builder_reports(ctx: BakeContext, digest: str, now: float, *, ok: bool = True, message: str = "") -> None:
    bake = state(ctx).bake
    assert bake is not None
    report = Baked(warm_snapshot="gpu", bake=bake.id, ok=ok, digests={REF: digest} if ok else {}, image_bytes=1000,
                   message=message)
    bakes.record_baked(ctx.store, report, now)
    bakes.advance(ctx, "gpu", now)
