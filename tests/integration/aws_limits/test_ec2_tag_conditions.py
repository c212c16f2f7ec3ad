"""EC2's tag conditions, evaluated by the AWS limits layer as IAM does: the bake function, under the policy
`template.yaml` gives its role, may act only on what carries the stack's tag, and may create only what it
tags so, and may launch a builder with an instance profile only of the role it may pass (`iam:PassRole`);
anything else is `UnauthorizedOperation`, as EC2 answers. And a launch template the stack's tag
marks is pointed at a new snapshot through the moto server, as the bake does for managed node groups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from prewarm.adapters.ec2 import STACK_TAG, Ec2Builders, NodeClassObjects
from prewarm.services.snapshot_ports import BakeError
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.localbuilders import create_builder_profile
from prewarm_devtools.sam.aws import REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack

pytestmark = pytest.mark.integration

NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})
AMI = "ami-12c6146b"  # in moto's catalogue of public AMIs


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[LocalStack, MotoServer]]:
    with MotoServer(limits=True) as aws, KubeApiServer() as api, aws_environment(aws.url):
        yield LocalStack(aws.url, stack_name="ec2tags", parameters={
            "ClusterName": "local", "KubeApiEndpoint": api.url}).deploy(), aws


def bake_ec2(stack: tuple[LocalStack, MotoServer]) -> tuple[Any, str]:
    """An EC2 client signing as bake_snapshots' role, and the stack's tag value."""
    local, aws = stack
    identity = local.functions["BakeSnapshotsFunction"].identity
    assert identity is not None
    client = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url, config=NO_RETRIES,
                          aws_access_key_id=identity.access_key_id, aws_secret_access_key=identity.secret_access_key)
    return client, local.env()["NODE_QUEUE_PREFIX"]


def refusal(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    error = caught.value.response["Error"]
    assert error["Code"] == "UnauthorizedOperation", error
    return str(error["Message"])


def test_the_bake_role_may_not_stop_terminate_or_snapshot_what_the_stack_did_not_tag(
        stack: tuple[LocalStack, MotoServer]) -> None:
    ec2, prefix = bake_ec2(stack)
    operator = stack[1].client("ec2")
    foreign = operator.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    message = refusal(ec2.terminate_instances, InstanceIds=[foreign])
    assert f"ec2:TerminateInstances on resource: arn:aws:ec2:{REGION}:" in message and foreign in message
    refusal(ec2.stop_instances, InstanceIds=[foreign])
    volume = operator.create_volume(AvailabilityZone=f"{REGION}a", Size=1)["VolumeId"]
    refusal(ec2.create_snapshot, VolumeId=volume, TagSpecifications=[
        {"ResourceType": "snapshot", "Tags": [{"Key": STACK_TAG, "Value": prefix}]}])
    snapshot = operator.create_snapshot(VolumeId=volume)["SnapshotId"]
    assert f"ec2:DeleteSnapshot on resource: arn:aws:ec2:{REGION}::snapshot/{snapshot}" in refusal(
        ec2.delete_snapshot, SnapshotId=snapshot)
    refusal(ec2.create_tags, Resources=[snapshot], Tags=[{"Key": "prewarm.dev/digest:a", "Value": "sha256:1"}])
    # Another stack's tag is no better than none.
    operator.create_tags(Resources=[foreign], Tags=[{"Key": STACK_TAG, "Value": "another-stack-node"}])
    refusal(ec2.terminate_instances, InstanceIds=[foreign])
    # Describe* takes no resource: allowed.
    assert ec2.describe_instances(InstanceIds=[foreign])["Reservations"]


def test_the_bake_role_launches_and_snapshots_only_with_the_stacks_tag_and_then_owns_them(
        stack: tuple[LocalStack, MotoServer]) -> None:
    ec2, prefix = bake_ec2(stack)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    refusal(ec2.run_instances, ImageId=AMI, MinCount=1, MaxCount=1, SubnetId=subnet)  # untagged: refused
    builders = Ec2Builders(prefix, "", client=ec2)
    instance, volume = builders.launch("gpu-1", "gpu", AMI, "m6i.large", subnet, "/dev/xvdb", 1, "")
    builders.stop(instance)
    snapshot = builders.create_snapshot(volume, "gpu-1", "gpu")
    builders.tag_snapshot(snapshot, {"r/ml/trainer:v1": "sha256:" + "1" * 64})
    assert builders.snapshot_of("gpu-1") == (snapshot, "completed")
    builders.delete_snapshot(snapshot)
    builders.terminate(instance)


def test_a_launch_template_is_pointed_at_a_snapshot_only_when_it_carries_the_stacks_tag(
        stack: tuple[LocalStack, MotoServer]) -> None:
    ec2, prefix = bake_ec2(stack)
    operator = stack[1].client("ec2")
    data = {"ImageId": AMI, "BlockDeviceMappings": [{"DeviceName": "/dev/xvdb", "Ebs": {"VolumeSize": 20}}]}
    operator.create_launch_template(LaunchTemplateName="untagged-ng", LaunchTemplateData=data)
    operator.create_launch_template(LaunchTemplateName="inference-ng", LaunchTemplateData=data, TagSpecifications=[
        {"ResourceType": "launch-template", "Tags": [{"Key": STACK_TAG, "Value": prefix}]}])
    classes = NodeClassObjects(lambda: None, lambda: ec2, lambda: None, "local")

    with pytest.raises(BakeError, match="UnauthorizedOperation"):
        classes.point_at("LaunchTemplate", "untagged-ng", "/dev/xvdb", "snap-0123456789abcdef0")
    assert classes.current_snapshot("LaunchTemplate", "untagged-ng", "/dev/xvdb") is None

    classes.point_at("LaunchTemplate", "inference-ng", "/dev/xvdb", "snap-0123456789abcdef0")
    assert classes.current_snapshot("LaunchTemplate", "inference-ng", "/dev/xvdb") == "snap-0123456789abcdef0"
    versions = operator.describe_launch_template_versions(LaunchTemplateName="inference-ng")["LaunchTemplateVersions"]
    newest = max(versions, key=lambda v: v["VersionNumber"])
    assert newest["DefaultVersion"] and newest["LaunchTemplateData"]["ImageId"] == AMI
    assert newest["LaunchTemplateData"]["BlockDeviceMappings"] == [
        {"DeviceName": "/dev/xvdb", "Ebs": {"VolumeSize": 20, "SnapshotId": "snap-0123456789abcdef0"}}]


def run_builder(ec2: Any, prefix: str, profile_arn: str) -> Any:
    """A builder's RunInstances as `Ec2Builders.launch` makes it: tagged, with the instance profile."""
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    tags = [{"Key": STACK_TAG, "Value": prefix}]
    return ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, SubnetId=subnet,
                             IamInstanceProfile={"Arn": profile_arn},
                             TagSpecifications=[{"ResourceType": kind, "Tags": tags}
                                                for kind in ("instance", "volume")])


def instance_profile(aws: MotoServer, name: str, role: str) -> str:
    """An instance profile holding another role than the builder's; its ARN."""
    iam = aws.client("iam")
    iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")
    arn = str(iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Arn"])
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=role)
    return arn


def test_a_builder_is_launched_with_an_instance_profile_only_by_a_policy_that_may_pass_its_role(
        stack: tuple[LocalStack, MotoServer]) -> None:
    local, aws = stack
    ec2, prefix = bake_ec2(stack)
    builder = create_builder_profile(aws.client("iam"), local)  # as local mode makes it
    other = instance_profile(aws, "another-profile", "AnotherRole")

    # The template's grant: iam:PassRole on BuilderRole, to EC2
    launched = run_builder(ec2, prefix, builder)["Instances"][0]
    ec2.terminate_instances(InstanceIds=[launched["InstanceId"]])

    # Another role is refused, as EC2 answers: UnauthorizedOperation naming iam:PassRole and the role
    message = refusal(run_builder, ec2=ec2, prefix=prefix, profile_arn=other)
    assert "iam:PassRole on resource: arn:aws:iam::" in message and "role/AnotherRole" in message, message

    # The bake role's policy without its PassRole statement is refused the builder's role too
    identity = local.functions["BakeSnapshotsFunction"].identity
    assert identity is not None
    policies = [{**doc, "Statement": [s for s in doc["Statement"] if s.get("Action") != "iam:PassRole"]}
                for doc in local.role_policies[identity.arn]]
    assert policies != local.role_policies[identity.arn]
    bare = LocalIdentity.of_role(identity.arn.replace("BakeSnapshots", "BakeWithoutPassRole"))
    bare.register(policies)
    try:
        client = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url, config=NO_RETRIES,
                              aws_access_key_id=bare.access_key_id, aws_secret_access_key=bare.secret_access_key)
        message = refusal(run_builder, ec2=client, prefix=prefix, profile_arn=builder)
        assert f"iam:PassRole on resource: {local.physical['BuilderRole'].attrs['Arn']}" in message, message
    finally:
        bare.unregister()
