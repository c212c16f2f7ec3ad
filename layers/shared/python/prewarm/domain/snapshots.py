"""Prewarm's `WarmSnapshot`: the data volume snapshot a node class launches from, kept warm by bakes.

A kind of its own, not a `PrewarmRule` field: a rule says which pushes become jobs on the nodes that
exist; a warm snapshot says which images the nodes that do not exist yet boot with, for one node class,
and outlives any one rule (it may name several, and images no rule matches). Its state (the bake, the
snapshots kept) is the node class's, so it is keyed by the node class, not by a rule
(docs/architecture.md, "Warm snapshots").
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from prewarm.domain.images import parse_image
from prewarm.domain.jobs import StackObject
from prewarm.domain.kubernetes import KubernetesModel, dns1123_subdomain_problem, raise_problems

# Fast Snapshot Restore is billed per snapshot and Availability Zone for every hour it is enabled:
# $0.75 per DSU-hour in us-east-1 (https://aws.amazon.com/ebs/pricing/, "Fast snapshot restore").
FSR_DOLLARS_PER_AZ_HOUR = 0.75
# EBS snapshot storage, standard tier, us-east-1: $0.05 per GB-month (https://aws.amazon.com/ebs/pricing/).
SNAPSHOT_DOLLARS_PER_GB_MONTH = 0.05
# EBS allows at most 10 FSR-enabled snapshots per Region by default; one snapshot can be in every AZ, but
# a Region has at most 6 AZs today (us-east-1): more names than that cannot be real.
MAX_FSR_ZONES = 6
MAX_KEEP = 20
DEFAULT_KEEP = 2
DEFAULT_TIME_BUDGET_SECONDS = 3600
MIN_TIME_BUDGET_SECONDS = 300
MAX_TIME_BUDGET_SECONDS = 6 * 3600
MAX_DATA_VOLUME_GIB = 16384
MAX_SNAPSHOT_IMAGES = 100
SUBNET_ID_PATTERN = r"subnet-[0-9a-f]{8,17}"
AZ_PATTERN = r"[a-z]{2}(?:-[a-z]+)+-[0-9]+[a-z]"

_LAUNCH_TEMPLATE_ID = re.compile(r"lt-[0-9a-f]{8,17}")
_LAUNCH_TEMPLATE_NAME = re.compile(r"[a-zA-Z0-9().\-/_]{3,128}")
_SUBNET_ID = re.compile(SUBNET_ID_PATTERN)
_AZ = re.compile(AZ_PATTERN)
_IMAGE_ID = re.compile(r"ami-[0-9a-f]{8,17}|resolve:ssm:\S+")
# AL2023 names its root volume /dev/xvda; a secondary EBS volume is any other /dev/xvd[b-z] or /dev/sd[b-z]
# (EC2's recommended names for EBS volumes on Nitro, "Device names on Linux instances").
_AL2023_DATA_DEVICE = re.compile(r"/dev/(?:xvd|sd)[b-z]")


class AmiFamily(StrEnum):
    """The AMI families whose containerd data volume Prewarm knows how to bake."""

    BOTTLEROCKET = "Bottlerocket"
    AL2023 = "AL2023"


# Bottlerocket's data volume is always its second block device (its AMIs map /dev/xvdb; the OS is /dev/xvda).
BOTTLEROCKET_DATA_DEVICE = "/dev/xvdb"
AL2023_CONTAINERD_MOUNT = "/var/lib/containerd"


class NodeClassRef(KubernetesModel):
    """`spec.nodeClass`: a Karpenter `EC2NodeClass` by name, or an EC2 launch template (managed node groups,
    Cluster Autoscaler) by id or name: exactly one."""

    ec2_node_class: str | None = Field(default=None, alias="ec2NodeClass")
    launch_template: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> NodeClassRef:
        if (self.ec2_node_class is None) == (self.launch_template is None):
            raise_problems([("", "set exactly one of ec2NodeClass (Karpenter) and launchTemplate (an id lt-... "
                                 "or a name)")])
        if self.ec2_node_class is not None and (problem := dns1123_subdomain_problem(self.ec2_node_class)):
            raise_problems([(".ec2NodeClass", problem)])
        template = self.launch_template
        if template is not None and not (_LAUNCH_TEMPLATE_ID.fullmatch(template)
                                         or _LAUNCH_TEMPLATE_NAME.fullmatch(template)):
            raise_problems([(".launchTemplate", f'"{template}" is neither a launch template id (lt-...) nor a '
                                                "name of 3 to 128 letters, digits and ().-/_")])
        return self

    @property
    def kind(self) -> Literal["EC2NodeClass", "LaunchTemplate"]:
        return "EC2NodeClass" if self.ec2_node_class is not None else "LaunchTemplate"

    @property
    def name(self) -> str:
        return self.ec2_node_class or self.launch_template or ""

    def describe(self) -> str:
        return f"{self.kind}/{self.name}"


class DataVolume(KubernetesModel):
    """`spec.dataVolume`: the block device whose contents (containerd's root) are snapshotted."""

    device_name: str = BOTTLEROCKET_DATA_DEVICE
    mount_path: str | None = None
    size_gib: int = Field(default=50, ge=1, le=MAX_DATA_VOLUME_GIB, alias="sizeGiB")


class BuilderSpec(KubernetesModel):
    """`spec.builder`: how long the builder instance runs, and where when not where the node class's nodes
    launch (`subnetIds`, `imageId` override the node class's: domain/launch_sources.py)."""

    subnet_ids: list[str] = Field(default_factory=list)
    instance_type: str | None = None  # None: m6i.large, or m7g.large on arm64 (launch_sources.builder_instance_type)
    image_id: str | None = None
    time_budget_seconds: int = Field(default=DEFAULT_TIME_BUDGET_SECONDS, ge=MIN_TIME_BUDGET_SECONDS,
                                     le=MAX_TIME_BUDGET_SECONDS)

    @field_validator("subnet_ids")
    @classmethod
    def _subnets(cls, values: list[str]) -> list[str]:
        raise_problems([(f"[{i}]", f'"{v}" is not a subnet id (subnet-...)')
                        for i, v in enumerate(values) if not _SUBNET_ID.fullmatch(v)])
        return values

    @field_validator("image_id")
    @classmethod
    def _image_id(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_ID.fullmatch(value):
            raise_problems([("", f'"{value}" is neither an AMI id (ami-...) nor resolve:ssm:PARAMETER')])
        return value


class FastSnapshotRestore(KubernetesModel):
    """`spec.fastSnapshotRestore`: the Availability Zones whose volumes restore at full speed at once."""

    availability_zones: list[str] = Field(min_length=1, max_length=MAX_FSR_ZONES)

    @field_validator("availability_zones")
    @classmethod
    def _zones(cls, values: list[str]) -> list[str]:
        problems = [(f"[{i}]", f'"{v}" is not an Availability Zone name such as "us-west-2a"')
                    for i, v in enumerate(values) if not _AZ.fullmatch(v)]
        if len(set(values)) != len(values):
            problems.append(("", "names an Availability Zone twice"))
        raise_problems(problems)
        return values

    @property
    def dollars_per_hour(self) -> float:
        """What FSR costs while enabled on one snapshot: each AZ is billed for every hour."""
        return round(FSR_DOLLARS_PER_AZ_HOUR * len(self.availability_zones), 2)


class WarmSnapshotSpec(KubernetesModel):
    """`spec` of a WarmSnapshot."""

    node_class: NodeClassRef
    ami_family: AmiFamily
    data_volume: DataVolume = Field(default_factory=DataVolume)
    # Each named PrewarmRule's pushes, at their newest digest; and images named here.
    rules: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list, max_length=MAX_SNAPSHOT_IMAGES)
    fast_snapshot_restore: FastSnapshotRestore | None = None
    keep: int = Field(default=DEFAULT_KEEP, ge=1, le=MAX_KEEP)
    builder: BuilderSpec = Field(default_factory=BuilderSpec)

    @field_validator("ami_family", mode="before")
    @classmethod
    def _family(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in set(AmiFamily):
                raise_problems([("", f'"{value}" is not an AMI family Prewarm bakes: use "Bottlerocket" or "AL2023"')])
            return AmiFamily(value)
        return value

    @field_validator("images")
    @classmethod
    def _images(cls, values: list[str]) -> list[str]:
        problems = []
        for i, value in enumerate(values):
            try:
                parse_image(value)
            except ValueError as e:
                problems.append((f"[{i}]", str(e)))
        raise_problems(problems)
        return values

    @field_validator("rules")
    @classmethod
    def _rules(cls, values: list[str]) -> list[str]:
        raise_problems([(f"[{i}]", p) for i, v in enumerate(values) if (p := dns1123_subdomain_problem(v))])
        return values

    @model_validator(mode="after")
    def _volume_fits_family(self) -> WarmSnapshotSpec:
        raise_problems(data_volume_problems(self.ami_family, self.data_volume))
        if not self.rules and not self.images:
            raise_problems([("", "name at least one of rules (their pushes) and images")])
        return self


def data_volume_problems(family: AmiFamily, volume: DataVolume) -> list[tuple[str, str]]:
    """Why `volume` is not the containerd data volume of `family`'s AMIs (empty when it is)."""
    device = volume.device_name
    if family is AmiFamily.BOTTLEROCKET:
        problems = []
        if device != BOTTLEROCKET_DATA_DEVICE:
            problems.append((".dataVolume.deviceName", f'"{device}" is not Bottlerocket\'s data volume: its AMIs '
                                                       f"keep containerd on {BOTTLEROCKET_DATA_DEVICE}"))
        if volume.mount_path is not None:
            problems.append((".dataVolume.mountPath", "Bottlerocket mounts its data volume itself: leave it out"))
        return problems
    problems = []
    if not _AL2023_DATA_DEVICE.fullmatch(device):
        problems.append((".dataVolume.deviceName", f'"{device}" is not a secondary volume of AL2023 (its root is '
                                                   "/dev/xvda; use /dev/xvdb to /dev/xvdz)"))
    if volume.mount_path != AL2023_CONTAINERD_MOUNT:
        problems.append((".dataVolume.mountPath", f"must be {AL2023_CONTAINERD_MOUNT} on AL2023: the volume "
                                                  "stands for containerd's root"))
    return problems


class WarmSnapshot(StackObject):
    """A node class kept booting from a snapshot of a data volume that holds its images."""

    kind: Literal["WarmSnapshot"]
    spec: WarmSnapshotSpec

    def wants(self, image: str, rules: list[str]) -> bool:
        """Whether a push of `image` (registry/repository:tag or @digest) matched by `rules` changes this image
        set."""
        return any(r in self.spec.rules for r in rules) or image in self.spec.images

    def fsr_dollars_per_hour(self) -> float:
        return self.spec.fast_snapshot_restore.dollars_per_hour if self.spec.fast_snapshot_restore else 0.0
