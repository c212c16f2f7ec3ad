"""EC2 calls moto lacks that warm snapshots make: Fast Snapshot Restore, answered as EC2 does.

Each (snapshot, Availability Zone) is enabled or disabled; an unknown snapshot or zone is an item of
`Unsuccessful` (the call itself succeeds, as on EC2), and so is a snapshot past the Region's quota.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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


# -- IAM's view of the EC2 calls a bake makes ("Actions, resources, and condition keys for Amazon EC2") ----

# Each tag-scoped action and the resource types it is authorized on (by the id prefix of its resources).
_RESOURCE_TYPES = {"i": "instance", "vol": "volume", "snap": "snapshot", "lt": "launch-template", "ami": "image",
                   "subnet": "subnet", "sg": "security-group", "eni": "network-interface"}
_ON_RESOURCES = {"StopInstances": "InstanceId", "TerminateInstances": "InstanceId", "DeleteSnapshot": "SnapshotId",
                 "EnableFastSnapshotRestores": "SourceSnapshotId", "DisableFastSnapshotRestores": "SourceSnapshotId",
                 "CreateTags": "Resource"}


def ec2_arn(region: str, account: str, resource_id: str) -> str:
    """A resource's ARN from its id: images and snapshots carry no account (EC2's ARN formats)."""
    kind = _RESOURCE_TYPES.get(resource_id.split("-", 1)[0], "")
    owner = "" if kind in ("image", "snapshot") else account
    return f"arn:aws:ec2:{region}:{owner}:{kind}/{resource_id}"


def ec2_requests(handler: Any, operation: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The (action, resource ARN, condition keys) IAM authorizes for the EC2 operations of warm snapshots'
    bakes: a resource's own tags as `aws:ResourceTag/`, the tags a create brings as `aws:RequestTag/` and
    `aws:TagKeys`, tagging on create as `ec2:CreateTags` with `ec2:CreateAction`; `Describe*` on `*`.
    Other EC2 operations are not evaluated (an empty list)."""
    from moto.ec2.utils import convert_tag_spec

    action, region, account = f"ec2:{operation}", handler.region, handler.current_account
    backend = handler.ec2_backend

    def on(resource_id: str, **request_tags: str) -> tuple[str, str, dict[str, Any]]:
        context: dict[str, Any] = {f"aws:ResourceTag/{k}": v for k, v in backend.tags.get(resource_id, {}).items()}
        return action, ec2_arn(region, account, resource_id), {**context, **_request_context(request_tags)}

    if operation.startswith("Describe"):
        return [(action, "*", {})]
    if operation in _ON_RESOURCES:
        tags = {t["Key"]: t["Value"] for t in handler._get_param("Tags", [])} if operation == "CreateTags" else {}
        return [on(r, **tags) for r in _listed(handler, _ON_RESOURCES[operation])]
    if operation in ("CreateLaunchTemplateVersion", "ModifyLaunchTemplate"):
        name, given = handler._get_param("LaunchTemplateName"), handler._get_param("LaunchTemplateId")
        template = given or (backend.get_launch_template_by_name(name).id if name else "")
        return [on(template)]
    Pair = tuple[str, str, dict[str, Any]]
    spec = convert_tag_spec(handler._get_param("TagSpecifications") or handler._get_param("TagSpecification") or [])
    if operation == "RunInstances":
        made: list[Pair] = [(action, f"arn:aws:ec2:{region}:{account}:{kind}/*",
                             _request_context(spec.get(kind, {}))) for kind in ("instance", "volume")]
        used: list[Pair] = [(action, ec2_arn(region, account, str(handler._get_param(p))), {})
                for p in ("ImageId", "SubnetId") if str(handler._get_param(p) or "").count("-") == 1]
        return made + used + _tag_on_create(operation, region, account, spec) + _passed_roles(handler)
    if operation == "CreateSnapshot":
        snapshot = (action, f"arn:aws:ec2:{region}::snapshot/*", _request_context(spec.get("snapshot", {})))
        return [on(str(handler._get_param("VolumeId"))), snapshot, *_tag_on_create(operation, region, account, spec)]
    return []


def _passed_roles(handler: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """A RunInstances with an instance profile passes the profile's role to EC2: the caller needs
    `iam:PassRole` on the role ("Using an IAM role to grant permissions to applications running on Amazon EC2
    instances", IAM User Guide), with `iam:PassedToService` `ec2.amazonaws.com`. A profile IAM does not have
    is left to moto, which refuses it."""
    from moto.iam.exceptions import NotFoundException
    from moto.iam.models import iam_backends

    arn, name = handler._get_param("IamInstanceProfile.Arn"), handler._get_param("IamInstanceProfile.Name")
    if not (arn or name):
        return []
    iam = iam_backends[handler.current_account][handler.partition]
    try:
        profile = iam.get_instance_profile_by_arn(arn) if arn else iam.get_instance_profile(name)
    except NotFoundException:
        return []
    return [("iam:PassRole", role.arn, {"iam:PassedToService": "ec2.amazonaws.com"}) for role in profile.roles]


def _request_context(tags: dict[str, str]) -> dict[str, Any]:
    if not tags:
        return {}
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": tuple(tags)}


def _tag_on_create(operation: str, region: str, account: str,
                   spec: dict[str, dict[str, str]]) -> list[tuple[str, str, dict[str, Any]]]:
    """Tags given at creation are authorized as `ec2:CreateTags` too, with `ec2:CreateAction` the create
    ("Grant permission to tag Amazon EC2 resources during creation", EC2 User Guide)."""
    owner = {"snapshot": ""}
    return [("ec2:CreateTags", f"arn:aws:ec2:{region}:{owner.get(kind, account)}:{kind}/*",
             {**_request_context(tags), "ec2:CreateAction": operation}) for kind, tags in spec.items()]


def launch_template_version(handler: Any) -> dict[str, Any] | None:
    """EC2's CreateLaunchTemplateVersion with `SourceVersion`, which moto ignores: the new version inherits
    the source's launch parameters, each one given overriding its own (EC2 API Reference); None for any
    other request."""
    if getattr(handler, "service_name", "") != "ec2" or handler._get_action() != "CreateLaunchTemplateVersion":
        return None
    source = handler._get_param("SourceVersion")
    if not source:
        return None
    backend, name = handler.ec2_backend, handler._get_param("LaunchTemplateName")
    template = (backend.get_launch_template_by_name(name) if name
                else backend.get_launch_template(handler._get_param("LaunchTemplateId")))
    data = {**template.get_version(source).data, **(handler._get_param("LaunchTemplateData") or {})}
    version = template.create_version(data, handler._get_param("VersionDescription"))
    return {"LaunchTemplateVersion": {
        "CreateTime": version.create_time, "CreatedBy": f"arn:aws:iam::{handler.current_account}:root",
        "DefaultVersion": template.is_default(version), "LaunchTemplateData": version.data,
        "LaunchTemplateId": template.id, "LaunchTemplateName": template.name,
        "VersionDescription": version.description, "VersionNumber": version.number}}


def pending_snapshots(current: Callable[[], Any]) -> tuple[Any, str, Any]:
    """moto makes a snapshot `completed` at once; EBS keeps it `pending` while it copies the volume. With the
    layer's snapshots held (local mode's builders, which copy each snapshot's volume and then mark it
    completed, or `error`), a new snapshot starts `pending`, so nothing reads it as done before its copy is
    made."""
    from moto.ec2.models.elastic_block_store import EBSBackend

    original = EBSBackend.create_snapshot

    @functools.wraps(original)
    def create_snapshot(backend: Any, *args: Any, **kwargs: Any) -> Any:
        snapshot = original(backend, *args, **kwargs)
        if (layer := current()) is not None and layer.ec2.snapshots_pending:
            snapshot.status = "pending"
        return snapshot

    return EBSBackend, "create_snapshot", create_snapshot


class EC2State:
    """The layer's EC2 settings: whether new snapshots start `pending` (`AwsLimits.hold_snapshots`)."""

    def __init__(self) -> None:
        self.snapshots_pending = False


def finish_snapshot(snapshot_id: str, *, failed: bool = False, account: str, region: str) -> None:
    """A pending snapshot's copy made (`completed`) or failed (`error`), as EBS ends a snapshot."""
    from moto.ec2.models import ec2_backends

    snapshot = ec2_backends[account][region].snapshots.get(snapshot_id)
    if snapshot is not None:
        snapshot.status = "error" if failed else "completed"
