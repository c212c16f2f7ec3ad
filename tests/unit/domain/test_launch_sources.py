"""Issue #36: the builder runs what the node class's nodes run: their architecture (an AMI's, or the
`kubernetes.io/arch` requirements of the NodePools launching from the class) on an instance type of that
architecture, and for an alias the family's variant for their accelerator, as Karpenter resolves it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from prewarm.domain.launch_sources import (
    Architecture,
    LaunchSource,
    LaunchSourceError,
    LaunchTarget,
    Variant,
    alias_image_id,
    builder_instance_type,
    builder_source,
    family_image_id,
    instance_target,
    newest_image,
    node_pools_target,
    parameter_architecture,
    pool_target,
)
from prewarm.domain.snapshots import AmiFamily, BuilderSpec

ARM = LaunchTarget(Architecture.ARM64)
ARM_NVIDIA = LaunchTarget(Architecture.ARM64, Variant.NVIDIA)
NVIDIA = LaunchTarget(Architecture.X86_64, Variant.NVIDIA)
NEURON = LaunchTarget(Architecture.X86_64, Variant.NEURON)


def req(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def pool(name: str, node_class: str, *requirements: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"template": {"spec": {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
        "requirements": list(requirements)}}}}


@pytest.mark.parametrize(("family", "target", "expected"), [
    (AmiFamily.BOTTLEROCKET, LaunchTarget(), "/aws/service/bottlerocket/aws-k8s-1.33/x86_64/latest/image_id"),
    (AmiFamily.BOTTLEROCKET, ARM, "/aws/service/bottlerocket/aws-k8s-1.33/arm64/latest/image_id"),
    (AmiFamily.BOTTLEROCKET, NVIDIA, "/aws/service/bottlerocket/aws-k8s-1.33-nvidia/x86_64/latest/image_id"),
    (AmiFamily.BOTTLEROCKET, ARM_NVIDIA, "/aws/service/bottlerocket/aws-k8s-1.33-nvidia/arm64/latest/image_id"),
    (AmiFamily.AL2023, ARM,
     "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/standard/recommended/image_id"),
    (AmiFamily.AL2023, NVIDIA,
     "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/recommended/image_id"),
    (AmiFamily.AL2023, ARM_NVIDIA,
     "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/nvidia/recommended/image_id"),
    (AmiFamily.AL2023, NEURON,
     "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/neuron/recommended/image_id"),
])
def test_an_alias_is_the_ssm_parameter_of_the_targets_architecture_and_variant(
        family: AmiFamily, target: LaunchTarget, expected: str) -> None:
    alias = "bottlerocket@latest" if family is AmiFamily.BOTTLEROCKET else "al2023@latest"
    assert alias_image_id(alias, family, "1.33", target) == f"resolve:ssm:{expected}"


def test_a_pinned_alias_names_the_architecture_and_variant_in_its_release() -> None:
    assert family_image_id(AmiFamily.AL2023, "1.33", "v20240807", ARM_NVIDIA) == (
        "resolve:ssm:/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/nvidia/"
        "amazon-eks-node-al2023-arm64-nvidia-1.33-v20240807/image_id")
    assert family_image_id(AmiFamily.BOTTLEROCKET, "1.33", "v1.26.0", NVIDIA) == (
        "resolve:ssm:/aws/service/bottlerocket/aws-k8s-1.33-nvidia/x86_64/1.26.0/image_id")


def test_a_variant_the_family_does_not_publish_is_refused_naming_it() -> None:
    with pytest.raises(LaunchSourceError, match="AL2023 publishes no neuron AMI for arm64"):
        family_image_id(AmiFamily.AL2023, "1.33", target=LaunchTarget(Architecture.ARM64, Variant.NEURON))
    with pytest.raises(LaunchSourceError, match="Bottlerocket publishes no neuron AMI for x86_64"):
        family_image_id(AmiFamily.BOTTLEROCKET, "1.33", target=NEURON)


def test_a_node_pools_requirements_say_its_architecture_and_accelerator() -> None:
    assert pool_target([]) == (frozenset(), Variant.STANDARD)
    assert pool_target([req("kubernetes.io/arch", "In", "arm64")]) == ({Architecture.ARM64}, Variant.STANDARD)
    assert pool_target([req("kubernetes.io/arch", "NotIn", "arm64")])[0] == {Architecture.X86_64}
    assert pool_target([req("kubernetes.io/arch", "In", "amd64", "arm64")])[0] == set(Architecture)
    assert pool_target([req("karpenter.k8s.aws/instance-gpu-count", "Gt", "0")])[1] is Variant.NVIDIA
    assert pool_target([req("karpenter.k8s.aws/instance-gpu-manufacturer", "In", "nvidia")])[1] is Variant.NVIDIA
    assert pool_target([req("karpenter.k8s.aws/instance-gpu-count", "Exists")])[1] is Variant.NVIDIA
    assert pool_target([req("karpenter.k8s.aws/instance-gpu-count", "DoesNotExist")])[1] is Variant.STANDARD
    assert pool_target([req("karpenter.k8s.aws/instance-gpu-count", "In", "0")])[1] is Variant.STANDARD
    assert pool_target([req("karpenter.k8s.aws/instance-accelerator-name", "In", "inferentia")])[1] is Variant.NEURON
    assert pool_target([req("karpenter.k8s.aws/instance-family", "In", "g5", "p4d")])[1] is Variant.NVIDIA
    assert pool_target([req("karpenter.k8s.aws/instance-category", "In", "g", "p")])[1] is Variant.NVIDIA
    assert pool_target([req("karpenter.k8s.aws/instance-family", "In", "inf2", "trn1")])[1] is Variant.NEURON
    # AMD's GPUs, or GPU and CPU families together: no NVIDIA AMI needed for every node
    assert pool_target([req("karpenter.k8s.aws/instance-family", "In", "g4ad")])[1] is Variant.STANDARD
    assert pool_target([req("karpenter.k8s.aws/instance-family", "In", "g5", "m6i")])[1] is Variant.STANDARD


def test_the_node_pools_of_a_class_give_its_target_and_one_of_both_architectures_is_refused() -> None:
    pools = [pool("arm", "graviton", req("kubernetes.io/arch", "In", "arm64")),
             pool("arm-gpu", "graviton", req("kubernetes.io/arch", "In", "arm64"),
                  req("karpenter.k8s.aws/instance-gpu-count", "Gt", "0")),
             pool("gpu", "gpu", req("karpenter.k8s.aws/instance-gpu-count", "Gt", "0")),
             pool("x86", "mixed", req("kubernetes.io/arch", "In", "amd64")),
             pool("graviton", "mixed", req("kubernetes.io/arch", "In", "arm64"))]
    # A GPU pool and a CPU pool on one class: the standard variant (the data volume is the same on both)
    assert node_pools_target("graviton", pools) == ARM
    assert node_pools_target("gpu", pools) == NVIDIA
    assert node_pools_target("none", pools) == LaunchTarget()  # no NodePool says: x86_64, standard
    with pytest.raises(LaunchSourceError, match=r"EC2NodeClass mixed: its NodePools \(graviton, x86\) launch both"):
        node_pools_target("mixed", pools)


def test_the_builders_instance_type_runs_the_amis_architecture() -> None:
    assert builder_instance_type(None, Architecture.X86_64) == "m6i.large"
    assert builder_instance_type(None, Architecture.ARM64) == "m7g.large"
    assert builder_instance_type("c7gn.xlarge", Architecture.ARM64) == "c7gn.xlarge"
    assert builder_instance_type("g5.xlarge", Architecture.X86_64) == "g5.xlarge"
    with pytest.raises(LaunchSourceError, match=re.escape(
            'instanceType "m6i.large" runs x86_64, but the node class\'s AMI is arm64: name a Graviton arm64 type '
            "or leave it out")):
        builder_instance_type("m6i.large", Architecture.ARM64)
    with pytest.raises(LaunchSourceError, match=re.escape('"r8g.large" runs arm64')):
        builder_instance_type("r8g.large", Architecture.X86_64)


@pytest.mark.parametrize(("instance_type", "target"), [
    ("m7g.large", ARM), ("a1.medium", ARM), ("is4gen.xlarge", ARM), ("g5g.xlarge", ARM_NVIDIA),
    ("g5.xlarge", NVIDIA), ("p5.48xlarge", NVIDIA), ("inf2.xlarge", NEURON), ("g4ad.xlarge", LaunchTarget()),
    ("m6i.large", LaunchTarget()), ("c7a.large", LaunchTarget()),
])
def test_an_instance_type_says_what_it_runs(instance_type: str, target: LaunchTarget) -> None:
    assert instance_target(instance_type) == target


def test_the_newest_ami_of_the_architecture_asked_is_taken() -> None:
    images = [{"ImageId": "ami-1", "Architecture": "x86_64", "CreationDate": "2026-01-02"},
              {"ImageId": "ami-2", "Architecture": "arm64", "CreationDate": "2026-01-01"},
              {"ImageId": "ami-3", "Architecture": "i386", "CreationDate": "2026-02-01"}]
    assert newest_image(images, "EC2NodeClass c") == ("ami-1", Architecture.X86_64)
    assert newest_image(images, "EC2NodeClass c", Architecture.ARM64) == ("ami-2", Architecture.ARM64)
    with pytest.raises(LaunchSourceError, match="EC2NodeClass c: its amiSelectorTerms select no available arm64 AMI"):
        newest_image(images[:1], "EC2NodeClass c", Architecture.ARM64)


def test_a_builder_on_the_specs_own_ami_runs_that_amis_architecture_not_the_node_classs() -> None:
    both = BuilderSpec.model_validate({"imageId": "ami-0123456789abcdef0", "subnetIds": ["subnet-0123456789abcdef0"]})
    # The spec names both: the node class is not read, the AMI's architecture is the builder's
    assert builder_source(both, None, Architecture.ARM64) == LaunchSource(
        "ami-0123456789abcdef0", ("subnet-0123456789abcdef0",), Architecture.ARM64)
    # The spec names the AMI only: the class gives the subnets, not the architecture
    class_source = LaunchSource("ami-0fedcba9876543210", ("subnet-0000000000000000a",), Architecture.X86_64)
    only_ami = BuilderSpec.model_validate({"imageId": "ami-0123456789abcdef0"})
    assert builder_source(only_ami, class_source, Architecture.ARM64).architecture is Architecture.ARM64
    assert builder_source(BuilderSpec(), class_source) == class_source
    with pytest.raises(LaunchSourceError, match="its architecture is not known"):
        builder_source(both, None)


def test_an_aws_ami_parameter_names_its_architecture_in_its_path() -> None:
    assert parameter_architecture(family_image_id(AmiFamily.BOTTLEROCKET, "1.33", target=ARM)) is Architecture.ARM64
    assert parameter_architecture(family_image_id(AmiFamily.AL2023, "1.33")) is Architecture.X86_64
    assert parameter_architecture(
        "resolve:ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64") is Architecture.ARM64
    with pytest.raises(LaunchSourceError, match="name the AMI id"):
        parameter_architecture("resolve:ssm:/aws/service/custom/image_id")
