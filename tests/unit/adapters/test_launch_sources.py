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
from prewarm.domain.launch_sources import Architecture, LaunchSource
from prewarm.domain.snapshots import AmiFamily
from prewarm.services.snapshot_ports import BakeError

REGION = "us-west-2"
CLUSTER = "prod"


class NodeClassApi:
    """The cluster's API as the adapter uses it: EC2NodeClasses by name, and Karpenter's NodePools."""

    def __init__(self, pools: list[dict[str, Any]] | None = None, **classes: dict[str, Any]) -> None:
        self.classes = classes
        self.pools = pools or []

    def list_objects(self, api_version: str, plural: str) -> list[dict[str, Any]]:
        assert (api_version, plural) == ("karpenter.sh/v1", "nodepools")
        return self.pools

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


def objects(ec2: Any, pools: list[dict[str, Any]] | None = None, **classes: dict[str, Any]) -> NodeClassObjects:
    return NodeClassObjects(lambda: NodeClassApi(pools, **classes), lambda: ec2,
                            lambda: boto3.client("eks", region_name=REGION), CLUSTER)


def node_pool(name: str, node_class: str, *requirements: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                            "name": node_class},
                                           "requirements": list(requirements)}}}}


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
    ami = image(ec2, "inference-1")
    ec2.create_launch_template(LaunchTemplateName="inference", LaunchTemplateData={"ImageId": ami})
    ec2.create_launch_template(LaunchTemplateName="eks-default", LaunchTemplateData={"InstanceType": "m6i.large"})
    nodes = objects(ec2)
    assert nodes.launch_source("LaunchTemplate", "inference", AmiFamily.AL2023) == LaunchSource(ami, (tagged, both))
    # No image in the template: a managed node group's, which EKS launches from the family's AMI.
    assert nodes.launch_source("LaunchTemplate", "eks-default", AmiFamily.AL2023).image_id == (
        "resolve:ssm:/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id")


def arm64_image(ec2: Any, **tags: str) -> str:
    """An arm64 AMI of moto's catalogue (its register_image makes x86_64 ones only), tagged."""
    made = str(ec2.describe_images(Filters=[{"Name": "architecture", "Values": ["arm64"]}])["Images"][0]["ImageId"])
    if tags:
        ec2.create_tags(Resources=[made], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return made


ARM64 = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
GPUS = {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]}


def test_an_alias_follows_the_architecture_and_accelerator_of_the_classs_node_pools(ec2: Any) -> None:
    tagged, _both, _other = subnets(ec2)
    cluster([tagged])
    classes = {name: {"amiSelectorTerms": [{"alias": "bottlerocket@latest"}], "subnetSelectorTerms": [{"id": tagged}]}
               for name in ("graviton", "gpu")}
    nodes = objects(ec2, [node_pool("arm", "graviton", ARM64), node_pool("gpu", "gpu", GPUS),
                          node_pool("other", "default", {**ARM64, "values": ["amd64"]})], **classes)
    assert nodes.launch_source("EC2NodeClass", "graviton", AmiFamily.BOTTLEROCKET) == LaunchSource(
        "resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id", (tagged,), Architecture.ARM64)
    assert nodes.launch_source("EC2NodeClass", "gpu", AmiFamily.BOTTLEROCKET).image_id == (
        "resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33-nvidia/x86_64/latest/image_id")
    classes["gpu"]["amiSelectorTerms"] = [{"alias": "al2023@latest"}]
    assert objects(ec2, [node_pool("gpu", "gpu", GPUS, ARM64)], **classes).launch_source(
        "EC2NodeClass", "gpu", AmiFamily.AL2023) == LaunchSource(
        "resolve:ssm:/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/nvidia/recommended/image_id",
        (tagged,), Architecture.ARM64)


def test_an_arm64_ami_by_id_or_in_a_launch_template_makes_an_arm64_builder(ec2: Any) -> None:
    tagged, both, _other = subnets(ec2)
    cluster([tagged])
    arm = arm64_image(ec2, team="ml")
    x86 = image(ec2, "x86-1", team="ml")
    ec2.create_launch_template(LaunchTemplateName="graviton", LaunchTemplateData={"ImageId": arm})
    ec2.create_launch_template(LaunchTemplateName="graviton-ng", LaunchTemplateData={"InstanceType": "m7g.large"})
    by_tags = {"amiSelectorTerms": [{"tags": {"team": "ml"}}], "subnetSelectorTerms": [{"id": both}]}
    nodes = objects(ec2, [node_pool("arm", "by-tags", ARM64)],
                    **{"by-id": {"amiSelectorTerms": [{"id": arm}], "subnetSelectorTerms": [{"id": both}]},
                       "by-tags": by_tags})
    assert nodes.launch_source("EC2NodeClass", "by-id", AmiFamily.AL2023) == LaunchSource(
        arm, (both,), Architecture.ARM64)
    # Terms that select an AMI per architecture: the one the class's NodePools launch
    assert nodes.launch_source("EC2NodeClass", "by-tags", AmiFamily.AL2023).image_id == arm
    assert objects(ec2, **{"by-tags": by_tags}).launch_source(
        "EC2NodeClass", "by-tags", AmiFamily.AL2023).image_id == x86
    assert nodes.launch_source("LaunchTemplate", "graviton", AmiFamily.AL2023).architecture is Architecture.ARM64
    # A managed node group's template without an image: the family's AMI for its instance type
    assert nodes.launch_source("LaunchTemplate", "graviton-ng", AmiFamily.BOTTLEROCKET) == LaunchSource(
        "resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id", (tagged,), Architecture.ARM64)
