"""EC2 and EBS for warm snapshots: builder instances, their data volumes' snapshots and launch templates.

Everything created is tagged `prewarm.dev/stack` with the stack's prefix at creation (RunInstances and
CreateSnapshot take `TagSpecifications`), which the stack's IAM policy requires of the create calls and
scopes every later call to (template.yaml, `BakeRole`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from prewarm.domain.launch_sources import (
    DEFAULT_INSTANCE_TYPES,
    Architecture,
    LaunchSource,
    LaunchSourceError,
    alias_image_id,
    ami_query,
    family_image_id,
    image_architecture,
    instance_target,
    newest_image,
    node_pools_target,
    parameter_architecture,
    subnet_query,
)
from prewarm.domain.snapshots import AmiFamily
from prewarm.services.ports import ClusterError, ClusterNotFoundError
from prewarm.services.snapshot_ports import BakeError, NodeClassMissingError

STACK_TAG = "prewarm.dev/stack"
WARM_SNAPSHOT_TAG = "prewarm.dev/warm-snapshot"
BAKE_TAG = "prewarm.dev/bake"
ROLE_TAG = "prewarm.dev/role"
DIGEST_TAG_PREFIX = "prewarm.dev/digest:"
# EC2 tag keys are at most 128 characters.
_TAG_KEY_MAX = 128
# A disable where FSR is not on ("... is not enabled", "... is already disabled", "... disabling"), or of a
# snapshot deleted already: nothing is billed there.
_FSR_ALREADY_OFF = re.compile(r"not enabled|disabled|disabling|InvalidSnapshot\.NotFound", re.IGNORECASE)


def _error(e: ClientError, what: str) -> BakeError:
    err = e.response.get("Error", {})
    return BakeError(f"{what}: {err.get('Code', 'error')}: {err.get('Message', str(e))}")


def _fsr_errors(out: Mapping[str, Any]) -> list[str]:
    """The zones' errors of an Enable/DisableFastSnapshotRestores answer (`Unsuccessful`), as `code: message`."""
    return [f"{err.get('Code', 'error')}: {err.get('Message', '')}" for u in out.get("Unsuccessful") or []
            for item in u.get("FastSnapshotRestoreStateErrors") or [] for err in [item.get("Error") or {}]]


def digest_tags(digests: Mapping[str, str]) -> list[dict[str, str]]:
    """A tag per image: key `prewarm.dev/digest:<repository>:<tag>` (without the registry, cut to EC2's
    128 characters), value its digest."""
    return [{"Key": (DIGEST_TAG_PREFIX + ref.split("/", 1)[-1])[:_TAG_KEY_MAX], "Value": digest}
            for ref, digest in sorted(digests.items())]


class Ec2Builders:
    """`snapshot_ports.Builders` on EC2. Give it a boto3 EC2 client, or it builds one on first use."""

    def __init__(self, stack_prefix: str, instance_profile_arn: str, client: Any = None) -> None:
        self.stack_prefix = stack_prefix
        self.instance_profile_arn = instance_profile_arn
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("ec2")
        return self._client

    def _call(self, what: str, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return getattr(self.client, op)(**kwargs)  # type: ignore[no-any-return]
        except ClientError as e:
            raise _error(e, what) from e

    def _tags(self, warm_snapshot: str, bake_id: str, role: str) -> list[dict[str, str]]:
        return [{"Key": STACK_TAG, "Value": self.stack_prefix}, {"Key": WARM_SNAPSHOT_TAG, "Value": warm_snapshot},
                {"Key": BAKE_TAG, "Value": bake_id}, {"Key": ROLE_TAG, "Value": role}]

    def launch(self, bake_id: str, warm_snapshot: str, image_id: str, instance_type: str, subnet_id: str,
               device_name: str, size_gib: int, user_data: str) -> tuple[str, str]:
        tags = self._tags(warm_snapshot, bake_id, "builder")
        out = self._call(f"launch the builder of {bake_id}", "run_instances",
                         ImageId=image_id, InstanceType=instance_type, SubnetId=subnet_id, MinCount=1, MaxCount=1,
                         ClientToken=bake_id, UserData=user_data,
                         IamInstanceProfile={"Arn": self.instance_profile_arn},
                         InstanceInitiatedShutdownBehavior="stop",
                         MetadataOptions={"HttpTokens": "required"},
                         BlockDeviceMappings=[{"DeviceName": device_name, "Ebs": {
                             "VolumeSize": size_gib, "VolumeType": "gp3", "DeleteOnTermination": True}}],
                         TagSpecifications=[{"ResourceType": "instance", "Tags": tags},
                                            {"ResourceType": "volume", "Tags": tags}])
        instance = out["Instances"][0]
        return instance["InstanceId"], self._volume_of(instance, device_name)

    def _volume_of(self, instance: Mapping[str, Any], device_name: str) -> str:
        for mapping in instance.get("BlockDeviceMappings", []):
            if mapping.get("DeviceName") == device_name:
                return str(mapping["Ebs"]["VolumeId"])
        # RunInstances may answer before the volumes are attached: read the instance again.
        found = self._call("describe the builder", "describe_instances", InstanceIds=[instance["InstanceId"]])
        for mapping in found["Reservations"][0]["Instances"][0].get("BlockDeviceMappings", []):
            if mapping.get("DeviceName") == device_name:
                return str(mapping["Ebs"]["VolumeId"])
        raise BakeError(f"builder {instance['InstanceId']} has no volume at {device_name}")

    def stop(self, instance_id: str) -> None:
        self._call(f"stop builder {instance_id}", "stop_instances", InstanceIds=[instance_id])

    def terminate(self, instance_id: str) -> None:
        self._call(f"terminate builder {instance_id}", "terminate_instances", InstanceIds=[instance_id])

    def running_builders(self) -> list[tuple[str, str, str, float]]:
        pages = self.client.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{STACK_TAG}", "Values": [self.stack_prefix]},
            {"Name": f"tag:{ROLE_TAG}", "Values": ["builder"]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        found = []
        try:
            for page in pages:
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                        found.append((instance["InstanceId"], tags.get(WARM_SNAPSHOT_TAG, ""),
                                      tags.get(BAKE_TAG, ""), instance["LaunchTime"].timestamp()))
        except ClientError as e:
            raise _error(e, "list the builders") from e
        return found

    def builder_state(self, instance_id: str) -> str | None:
        try:
            found = self.client.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
                return None  # not yet visible (EC2's eventual consistency), or long gone
            raise _error(e, f"describe builder {instance_id}") from e
        return str(found[0]["Instances"][0]["State"]["Name"]) if found else None

    def create_snapshot(self, volume_id: str, bake_id: str, warm_snapshot: str) -> str:
        out = self._call(f"snapshot volume {volume_id}", "create_snapshot", VolumeId=volume_id,
                         Description=f"Prewarm warm snapshot {warm_snapshot}, bake {bake_id}",
                         TagSpecifications=[{"ResourceType": "snapshot",
                                             "Tags": self._tags(warm_snapshot, bake_id, "snapshot")}])
        return str(out["SnapshotId"])

    def _snapshots(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = self._call("describe snapshots", "describe_snapshots", OwnerIds=["self"], Filters=[
            {"Name": f"tag:{STACK_TAG}", "Values": [self.stack_prefix]}, *filters])
        return list(out.get("Snapshots", []))

    def snapshot_of(self, bake_id: str) -> tuple[str, str] | None:
        found = self._snapshots([{"Name": f"tag:{BAKE_TAG}", "Values": [bake_id]}])
        return (found[0]["SnapshotId"], found[0]["State"]) if found else None

    def snapshot_owner(self, snapshot_id: str) -> tuple[str, str] | None:
        found = self._snapshots([{"Name": "snapshot-id", "Values": [snapshot_id]}])
        if not found:
            return None
        tags = {t["Key"]: t["Value"] for t in found[0].get("Tags", [])}
        return tags.get(WARM_SNAPSHOT_TAG, ""), tags.get(BAKE_TAG, "")

    def tag_snapshot(self, snapshot_id: str, digests: Mapping[str, str]) -> None:
        self._call(f"tag snapshot {snapshot_id}", "create_tags", Resources=[snapshot_id], Tags=digest_tags(digests))

    def enable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None:
        out = self._call(f"enable fast snapshot restore of {snapshot_id}", "enable_fast_snapshot_restores",
                         AvailabilityZones=list(zones), SourceSnapshotIds=[snapshot_id])
        if out.get("Unsuccessful"):
            raise BakeError(f"fast snapshot restore of {snapshot_id} refused: {'; '.join(_fsr_errors(out))}")

    def disable_fast_restore(self, snapshot_id: str, zones: Sequence[str]) -> None:
        """EC2 answers a refusal per snapshot and zone in `Unsuccessful`, not as an error: one for a zone where
        FSR is not on (already disabled) is done; any other is raised, so the clean-up owes it still."""
        out = self._call(f"disable fast snapshot restore of {snapshot_id}", "disable_fast_snapshot_restores",
                         AvailabilityZones=list(zones), SourceSnapshotIds=[snapshot_id])
        refused = [m for m in _fsr_errors(out) if not _FSR_ALREADY_OFF.search(m)]
        if refused:
            raise BakeError(f"fast snapshot restore of {snapshot_id} not disabled: {'; '.join(refused)}")

    def delete_snapshot(self, snapshot_id: str) -> None:
        try:
            self.client.delete_snapshot(SnapshotId=snapshot_id)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "InvalidSnapshot.NotFound":
                raise _error(e, f"delete snapshot {snapshot_id}") from e


NODE_POOLS_API_VERSION = "karpenter.sh/v1"


class NodeClassObjects:
    """`snapshot_ports.NodeClasses`: Karpenter's EC2NodeClass through the cluster's API (`api`: get_object,
    replace_object), a launch template through EC2 (a new version made the default); the cluster itself
    (its Kubernetes version, its subnets) through EKS DescribeCluster of `cluster_name` (launch sources only)."""

    API_VERSION = "karpenter.k8s.aws/v1"

    def __init__(self, api: Callable[[], Any], ec2_client: Callable[[], Any],
                 eks_client: Callable[[], Any] | None = None, cluster_name: str = "") -> None:
        self._api = api
        self._ec2 = ec2_client
        self._eks = eks_client
        self.cluster_name = cluster_name

    @property
    def api(self) -> Any:
        return self._api()

    @property
    def ec2(self) -> Any:
        return self._ec2()

    def _cluster(self) -> dict[str, Any]:
        if self._eks is None or not self.cluster_name:
            raise BakeError("the stack's cluster is not known here (ClusterName): the node class's AMI alias "
                            "and a launch template's subnets need it")
        try:
            return dict(self._eks().describe_cluster(name=self.cluster_name)["cluster"])
        except ClientError as e:
            raise _error(e, f"describe cluster {self.cluster_name}") from e

    def launch_source(self, kind: str, name: str, family: AmiFamily) -> LaunchSource:
        try:
            if kind != "EC2NodeClass":
                return self._template_source(name, family)
            spec = self._node_class(name).get("spec") or {}
            where = f"EC2NodeClass {name}"
            image_id, architecture = self._node_class_image(name, spec, family, where)
            return LaunchSource(image_id, self._node_class_subnets(spec, where), architecture)
        except LaunchSourceError as e:
            raise BakeError(str(e)) from e

    def ami_architecture(self, image_id: str) -> Architecture:
        where = f'spec.builder.imageId "{image_id}"'
        try:
            if image_id.startswith("resolve:ssm:"):
                return parameter_architecture(image_id)
            images = self._call_ec2(f"{where}: describe it", "describe_images", ImageIds=[image_id])["Images"]
            if not images:
                raise LaunchSourceError(f"{where}: DescribeImages finds no such AMI")
            return image_architecture(images[0], where)
        except LaunchSourceError as e:
            raise BakeError(str(e)) from e

    def _template_source(self, name: str, family: AmiFamily) -> LaunchSource:
        data = self._template(name).get("LaunchTemplateData", {})
        cluster = self._cluster()
        subnets = tuple((cluster.get("resourcesVpcConfig") or {}).get("subnetIds") or ())
        where = f"launch template {name}"
        if image_id := data.get("ImageId"):
            images = self._call_ec2(f"{where}: describe its AMI", "describe_images", ImageIds=[image_id])["Images"]
            return LaunchSource(image_id, subnets, image_architecture(images[0], where) if images else
                                Architecture.X86_64)
        # No image: a managed node group's, which EKS launches from the family's AMI for its instance type.
        target = instance_target(str(data.get("InstanceType") or DEFAULT_INSTANCE_TYPES[Architecture.X86_64]))
        return LaunchSource(family_image_id(family, str(cluster.get("version", "")), target=target), subnets,
                            target.architecture)

    def _node_class_image(self, name: str, spec: Mapping[str, Any], family: AmiFamily,
                          where: str) -> tuple[str, Architecture]:
        terms = spec.get("amiSelectorTerms") or []
        alias = next((str(t["alias"]) for t in terms if t.get("alias")), None)
        if alias is not None:
            target = node_pools_target(name, self._node_pools())
            return alias_image_id(alias, family, str(self._cluster().get("version", "")), target), target.architecture
        found: dict[str, dict[str, Any]] = {}
        for term in terms:
            out = self._call_ec2(f"{where}: describe its AMIs", "describe_images", **ami_query(term))
            found.update({i["ImageId"]: i for i in out.get("Images", [])})
        arches = {i.get("Architecture") for i in found.values()}
        # An AMI per architecture selected: the one the NodePools launch.
        architecture = node_pools_target(name, self._node_pools()).architecture if len(arches) > 1 else None
        return newest_image(list(found.values()), where, architecture)

    def _node_pools(self) -> list[dict[str, Any]]:
        """Karpenter's NodePools (none when Karpenter's v1 API is not served)."""
        try:
            return list(self.api.list_objects(NODE_POOLS_API_VERSION, "nodepools"))
        except ClusterNotFoundError:
            return []
        except ClusterError as e:
            raise BakeError(f"NodePools could not be read: {e}") from e

    def _node_class_subnets(self, spec: Mapping[str, Any], where: str) -> tuple[str, ...]:
        found: dict[str, int] = {}
        for term in spec.get("subnetSelectorTerms") or []:
            out = self._call_ec2(f"{where}: describe its subnets", "describe_subnets", **subnet_query(term))
            found.update({s["SubnetId"]: int(s.get("AvailableIpAddressCount", 0)) for s in out.get("Subnets", [])})
        if not found:
            raise LaunchSourceError(f"{where}: its subnetSelectorTerms select no subnet")
        # The most free addresses first, as Karpenter prefers among the subnets it selects.
        return tuple(sorted(found, key=lambda subnet: (-found[subnet], subnet)))

    def _call_ec2(self, what: str, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return getattr(self.ec2, op)(**kwargs)  # type: ignore[no-any-return]
        except ClientError as e:
            raise _error(e, what) from e

    def _node_class(self, name: str) -> dict[str, Any]:
        try:
            found = self.api.get_object(self.API_VERSION, "ec2nodeclasses", name)
        except ClusterError as e:
            raise BakeError(f"EC2NodeClass {name} could not be read: {e}") from e
        if found is None:
            raise NodeClassMissingError(f"EC2NodeClass {name} does not exist")
        return dict(found)

    def _template(self, name: str) -> dict[str, Any]:
        key = {"LaunchTemplateId": name} if name.startswith("lt-") else {"LaunchTemplateName": name}
        try:
            out = self.ec2.describe_launch_template_versions(Versions=["$Default"], **key)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if "NotFound" in code or "Malformed" in code:
                raise NodeClassMissingError(f"launch template {name} does not exist") from e
            raise _error(e, f"read launch template {name}") from e
        return dict(out["LaunchTemplateVersions"][0])

    def current_snapshot(self, kind: str, name: str, device_name: str) -> str | None:
        if kind == "EC2NodeClass":
            mappings = self._node_class(name).get("spec", {}).get("blockDeviceMappings") or []
            for m in mappings:
                if m.get("deviceName") == device_name:
                    return (m.get("ebs") or {}).get("snapshotID")
            return None
        data = self._template(name).get("LaunchTemplateData", {})
        for m in data.get("BlockDeviceMappings", []):
            if m.get("DeviceName") == device_name:
                return (m.get("Ebs") or {}).get("SnapshotId")
        return None

    def point_at(self, kind: str, name: str, device_name: str, snapshot_id: str) -> None:
        if kind == "EC2NodeClass":
            self._point_node_class(name, device_name, snapshot_id)
            return
        current = self._template(name)
        data = current.get("LaunchTemplateData", {})
        mappings = [m for m in data.get("BlockDeviceMappings", []) if m.get("DeviceName") != device_name]
        old: dict[str, Any] = next(
            (m for m in data.get("BlockDeviceMappings", []) if m.get("DeviceName") == device_name), {})
        ebs = {k: v for k, v in (old.get("Ebs") or {}).items() if k != "SnapshotId"}
        mappings.append({"DeviceName": device_name, "Ebs": {**ebs, "SnapshotId": snapshot_id}})
        template_id = current["LaunchTemplateId"]
        try:
            made = self.ec2.create_launch_template_version(
                LaunchTemplateId=template_id, SourceVersion=str(current["VersionNumber"]),
                VersionDescription=f"Prewarm: data volume from {snapshot_id}",
                LaunchTemplateData={"BlockDeviceMappings": mappings})
            self.ec2.modify_launch_template(LaunchTemplateId=template_id,
                                            DefaultVersion=str(made["LaunchTemplateVersion"]["VersionNumber"]))
        except ClientError as e:
            raise _error(e, f"point launch template {name} at {snapshot_id}") from e

    def _point_node_class(self, name: str, device_name: str, snapshot_id: str) -> None:
        body = self._node_class(name)
        spec = dict(body.get("spec") or {})
        mappings = [dict(m) for m in spec.get("blockDeviceMappings") or []]
        for m in mappings:
            if m.get("deviceName") == device_name:
                m["ebs"] = {**(m.get("ebs") or {}), "snapshotID": snapshot_id}
                break
        else:
            mappings.append({"deviceName": device_name, "ebs": {"snapshotID": snapshot_id}})
        spec["blockDeviceMappings"] = mappings
        try:
            self.api.replace_object(self.API_VERSION, "ec2nodeclasses", name, {**body, "spec": spec})
        except ClusterError as e:
            raise BakeError(f"EC2NodeClass {name} not updated: {e}") from e
