"""Where a builder launches from, read from the node class as Karpenter and EKS read it (adapters.ec2's
`NodeClassObjects.launch_source`), on moto's EC2 and EKS: an EC2NodeClass's selector terms and AMI
alias, a launch template's image and the cluster's subnets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.adapters.ec2 import NodeClassObjects
from prewarm.domain.launch_sources import LaunchSource
from prewarm.domain.snapshots import AmiFamily
from prewarm.services.snapshot_ports import BakeError

REGION = "us-west-2"
CLUSTER = "prod"


class NodeClassApi:
    """The cluster's API as the adapter uses it: EC2NodeClasses by name."""

    def __init__(self, **classes: dict[str, Any]) -> None:
        self.classes = classes

    def get_object(self, api_version: str, plural: str, name: str) -> dict[str, Any] | None:
        spec = self.classes.get(name)
        return None if spec is None else {"apiVersion": api_version, "kind": "EC2NodeClass",
                                          "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def ec2() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def subnets(ec2: Any) -> tuple[str, str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    made = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24")["Subnet"]["SubnetId"] for i in range(3)]
    ec2.create_tags(Resources=made[:2], Tags=[{"Key": "karpenter.sh/discovery", "Value": CLUSTER}])
    ec2.create_tags(Resources=[made[1]], Tags=[{"Key": "tier", "Value": "private"}])
    return made[0], made[1], made[2]


def cluster(subnet_ids: list[str]) -> None:
    boto3.client("eks", region_name=REGION).create_cluster(
        name=CLUSTER, version="1.33", roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": subnet_ids})


def objects(ec2: Any, **classes: dict[str, Any]) -> NodeClassObjects:
    return NodeClassObjects(lambda: NodeClassApi(**classes), lambda: ec2,
                            lambda: boto3.client("eks", region_name=REGION), CLUSTER)


def image(ec2: Any, name: str, **tags: str) -> str:
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    made = str(ec2.create_image(InstanceId=instance, Name=name)["ImageId"])
    if tags:
        ec2.create_tags(Resources=[made], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return made


def test_an_ec2nodeclass_alias_is_the_familys_ami_for_the_clusters_version_in_its_selected_subnets(ec2: Any) -> None:
    tagged, both, _other = subnets(ec2)
    cluster([tagged])
    found = objects(ec2, gpu={"amiSelectorTerms": [{"alias": "bottlerocket@latest"}],
                              "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": CLUSTER}}]}
                    ).launch_source("EC2NodeClass", "gpu", AmiFamily.BOTTLEROCKET)
    assert found == LaunchSource("resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33/x86_64/latest/image_id",
                                 tuple(sorted((tagged, both))))  # as many free addresses: by id
    pinned = objects(ec2, gpu={"amiSelectorTerms": [{"alias": "al2023@v20240807"}],
                               "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": CLUSTER, "tier": "*"}}]}
                     ).launch_source("EC2NodeClass", "gpu", AmiFamily.AL2023)
    assert pinned == LaunchSource(
        "resolve:ssm:/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/"
        "amazon-eks-node-al2023-x86_64-standard-1.33-v20240807/image_id", (both,))


def test_ec2nodeclass_ami_terms_by_tags_or_id_take_the_newest_and_subnet_terms_by_id(ec2: Any) -> None:
    _tagged, _both, other = subnets(ec2)
    older = image(ec2, "gpu-1", team="ml")
    newer = image(ec2, "gpu-2", team="ml")
    image(ec2, "web-1", team="web")
    classes = {"by-tags": {"amiSelectorTerms": [{"tags": {"team": "ml"}, "owner": "self"}],
                           "subnetSelectorTerms": [{"id": other}]},
               "by-id": {"amiSelectorTerms": [{"id": older}], "subnetSelectorTerms": [{"id": other}]}}
    nodes = objects(ec2, **classes)
    by_tags = nodes.launch_source("EC2NodeClass", "by-tags", AmiFamily.BOTTLEROCKET)
    assert by_tags.subnet_ids == (other,)
    # moto stamps images made in the same second alike: either is the newest then, never the web one.
    assert by_tags.image_id in (older, newer)
    assert nodes.launch_source("EC2NodeClass", "by-id", AmiFamily.BOTTLEROCKET).image_id == older


def test_ec2nodeclass_terms_that_select_nothing_or_another_family_fail_naming_the_class(ec2: Any) -> None:
    tagged, _both, _other = subnets(ec2)
    cluster([tagged])
    nodes = objects(ec2, none={"amiSelectorTerms": [{"tags": {"team": "nobody"}}],
                               "subnetSelectorTerms": [{"id": tagged}]},
                    nets={"amiSelectorTerms": [{"alias": "al2023@latest"}],
                          "subnetSelectorTerms": [{"tags": {"team": "nobody"}}]})
    with pytest.raises(BakeError, match="EC2NodeClass none: its amiSelectorTerms select no available AMI"):
        nodes.launch_source("EC2NodeClass", "none", AmiFamily.BOTTLEROCKET)
    with pytest.raises(BakeError, match='alias "al2023@latest" is not of the warm snapshot\'s amiFamily Bottlerocket'):
        nodes.launch_source("EC2NodeClass", "nets", AmiFamily.BOTTLEROCKET)
    with pytest.raises(BakeError, match="EC2NodeClass nets: its subnetSelectorTerms select no subnet"):
        nodes.launch_source("EC2NodeClass", "nets", AmiFamily.AL2023)


def test_a_launch_template_gives_its_image_and_the_cluster_its_subnets(ec2: Any) -> None:
    tagged, both, _other = subnets(ec2)
    cluster([tagged, both])
    ec2.create_launch_template(LaunchTemplateName="inference", LaunchTemplateData={"ImageId": "ami-0123456789abcdef0"})
    ec2.create_launch_template(LaunchTemplateName="eks-default", LaunchTemplateData={"InstanceType": "m6i.large"})
    nodes = objects(ec2)
    assert nodes.launch_source("LaunchTemplate", "inference", AmiFamily.AL2023) == LaunchSource(
        "ami-0123456789abcdef0", (tagged, both))
    # No image in the template: a managed node group's, which EKS launches from the family's AMI.
    assert nodes.launch_source("LaunchTemplate", "eks-default", AmiFamily.AL2023).image_id == (
        "resolve:ssm:/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id")
