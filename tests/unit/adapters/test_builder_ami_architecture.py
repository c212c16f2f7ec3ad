"""The architecture of the AMI a WarmSnapshot's `builder.imageId` names (adapters.ec2's
`NodeClassObjects.ami_architecture`), on moto's EC2: DescribeImages' for an id, the path's for an AWS
`resolve:ssm:` parameter; the node class is not read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.ec2 import NodeClassObjects
from prewarm.domain.launch_sources import Architecture
from prewarm.services.snapshot_ports import BakeError


@pytest.fixture
def ec2() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


def unread() -> Any:
    raise AssertionError("the cluster's API is not read for the spec's own AMI")


def test_the_builders_ami_architecture_is_describe_images_or_the_parameters_path(ec2: Any) -> None:
    nodes = NodeClassObjects(unread, lambda: ec2)
    # moto's catalogue has arm64 AMIs; its register_image makes x86_64 ones
    arm = str(ec2.describe_images(Filters=[{"Name": "architecture", "Values": ["arm64"]}])["Images"][0]["ImageId"])
    x86 = str(ec2.register_image(Name="x86", RootDeviceName="/dev/xvda")["ImageId"])
    assert nodes.ami_architecture(arm) is Architecture.ARM64
    assert nodes.ami_architecture(x86) is Architecture.X86_64
    assert nodes.ami_architecture(
        "resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id") is Architecture.ARM64
    with pytest.raises(BakeError, match="ami-0123456789abcdef0"):
        nodes.ami_architecture("ami-0123456789abcdef0")
    with pytest.raises(BakeError, match="does not name one architecture"):
        nodes.ami_architecture("resolve:ssm:/aws/service/custom/image_id")
