"""Where a warm snapshot's builder launches from: the node class's AMI and subnets, read as Karpenter and
EC2 read them, so the snapshot is baked on the AMI and in the network its nodes use.

- A Karpenter `EC2NodeClass`: its `amiSelectorTerms` and `subnetSelectorTerms`. Terms are ORed, the
  fields of one term ANDed; `tags` values of `*` match any value; an `alias` (`al2023@latest`,
  `bottlerocket@v1.26.0`) is the family's EKS-optimized AMI for the cluster's Kubernetes version, read
  from the family's public SSM parameter as Karpenter does (here through RunInstances' `resolve:ssm:`);
  among several AMIs Karpenter takes the newest (karpenter.sh, "NodeClasses": amiSelectorTerms,
  subnetSelectorTerms).
- A launch template (managed node groups, Cluster Autoscaler): its `ImageId` (or, when it names none, as
  EKS does for a managed node group, the family's AMI for the cluster's version) and the cluster's
  subnets (EKS DescribeCluster's `resourcesVpcConfig.subnetIds`).

The builder runs the architecture the class's nodes run (a snapshot holds one architecture's image layers):
an AMI's own `Architecture`, or for an alias the `kubernetes.io/arch` requirements of the NodePools that
launch from the class, on a Graviton instance type for arm64; an alias takes the family's accelerated
(NVIDIA, Neuron) variant when those NodePools ask for such instances, as Karpenter does.

The spec's `builder.imageId` and `builder.subnetIds` override either; the builder then runs the named AMI's
architecture (DescribeImages', or the one an AWS `resolve:ssm:` parameter's path names). Pure: the adapter
makes the calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prewarm.domain.snapshots import AmiFamily, BuilderSpec


class LaunchSourceError(ValueError):
    """A node class that does not say where its nodes launch in a way a builder can follow."""


class Architecture(StrEnum):
    """An AMI's architecture, as EC2 and the SSM parameters name it."""

    X86_64 = "x86_64"
    ARM64 = "arm64"


class Variant(StrEnum):
    """An EKS-optimized AMI's variant: standard, or with an accelerator's drivers."""

    STANDARD = "standard"
    NVIDIA = "nvidia"
    NEURON = "neuron"


@dataclass(frozen=True)
class LaunchSource:
    """The builder's AMI (an id, or `resolve:ssm:PARAMETER`), the subnets it may launch in, and the
    architecture of that AMI."""

    image_id: str
    subnet_ids: tuple[str, ...]
    architecture: Architecture = Architecture.X86_64


@dataclass(frozen=True)
class LaunchTarget:
    """What the class's nodes run, as its NodePools' requirements say."""

    architecture: Architecture = Architecture.X86_64
    variant: Variant = Variant.STANDARD


# The alias families Prewarm bakes, by Karpenter's alias name ("amiSelectorTerms", alias: family@version).
_ALIAS_FAMILIES = {"al2023": AmiFamily.AL2023, "bottlerocket": AmiFamily.BOTTLEROCKET}
# The variants each family publishes per architecture, as Karpenter resolves an alias (karpenter-provider-aws,
# pkg/providers/amifamily: al2023.go asks standard, nvidia and neuron on x86_64, standard and nvidia on arm64;
# bottlerocket.go the standard and `-nvidia` parameters on both).
_VARIANTS = {
    AmiFamily.AL2023: {Architecture.X86_64: {Variant.STANDARD, Variant.NVIDIA, Variant.NEURON},
                       Architecture.ARM64: {Variant.STANDARD, Variant.NVIDIA}},
    AmiFamily.BOTTLEROCKET: {Architecture.X86_64: {Variant.STANDARD, Variant.NVIDIA},
                             Architecture.ARM64: {Variant.STANDARD, Variant.NVIDIA}},
}
# The builder's instance type when the spec names none, per architecture (a Graviton one for arm64).
DEFAULT_INSTANCE_TYPES = {Architecture.X86_64: "m6i.large", Architecture.ARM64: "m7g.large"}


def family_image_id(family: AmiFamily, kubernetes_version: str, version: str = "latest",
                    target: LaunchTarget = LaunchTarget()) -> str:
    """The family's EKS-optimized AMI for a Kubernetes version, architecture and variant, as the SSM parameter
    Karpenter reads for an alias (`version`: `latest` or a pinned release such as `v20240807` / `v1.26.0`):
    `/aws/service/bottlerocket/aws-k8s-<k8s>[-nvidia]/<arch>/<release>/image_id` (EKS User Guide, "Retrieve
    recommended Bottlerocket AMI IDs") and `/aws/service/eks/optimized-ami/<k8s>/amazon-linux-2023/<arch>/
    <variant>/recommended/image_id` ("Retrieve recommended Amazon Linux AMI IDs"; karpenter-provider-aws,
    pkg/providers/amifamily/al2023.go and bottlerocket.go)."""
    arch, variant = target.architecture, target.variant
    if variant not in _VARIANTS[family][arch]:
        raise LaunchSourceError(f"{family} publishes no {variant} AMI for {arch}: its variants there are "
                                f"{', '.join(sorted(_VARIANTS[family][arch]))}")
    if family is AmiFamily.BOTTLEROCKET:
        release = "latest" if version == "latest" else version.removeprefix("v")
        flavor = "" if variant is Variant.STANDARD else f"-{variant}"
        return f"resolve:ssm:/aws/service/bottlerocket/aws-k8s-{kubernetes_version}{flavor}/{arch}/{release}/image_id"
    name = ("recommended" if version == "latest"
            else f"amazon-eks-node-al2023-{arch}-{variant}-{kubernetes_version}-{version}")
    return (f"resolve:ssm:/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/{arch}/"
            f"{variant}/{name}/image_id")


def alias_image_id(alias: str, family: AmiFamily, kubernetes_version: str,
                   target: LaunchTarget = LaunchTarget()) -> str:
    """An `amiSelectorTerms[].alias` as the image id a builder of `family` launches from, for `target`."""
    name, _, version = alias.partition("@")
    aliased = _ALIAS_FAMILIES.get(name.lower())
    if not version or aliased is None:
        raise LaunchSourceError(f'amiSelectorTerms alias "{alias}" is not one Prewarm bakes: use '
                                '"al2023@latest", "bottlerocket@latest" or a pinned version (family@vX)')
    if aliased is not family:
        raise LaunchSourceError(f'amiSelectorTerms alias "{alias}" is not of the warm snapshot\'s amiFamily '
                                f"{family}: the snapshot would be baked for another OS")
    return family_image_id(family, kubernetes_version, version, target)


# Karpenter's well-known requirement keys (karpenter.sh, "NodePools": requirements).
ARCH_KEY = "kubernetes.io/arch"
_KUBE_ARCHITECTURES = {"amd64": Architecture.X86_64, "arm64": Architecture.ARM64}
_NVIDIA_KEYS = ("karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-name",
                "karpenter.k8s.aws/instance-gpu-manufacturer")
_NEURON_KEYS = ("karpenter.k8s.aws/instance-accelerator-count", "karpenter.k8s.aws/instance-accelerator-name",
                "karpenter.k8s.aws/instance-accelerator-manufacturer")
_FAMILY_KEYS = ("karpenter.k8s.aws/instance-family", "karpenter.k8s.aws/instance-category")
# Instance families and categories by accelerator: NVIDIA's g and p (not g4ad: AMD), AWS's inf and trn.
_NVIDIA_FAMILY = re.compile(r"(g|p)(\d+[a-z]*)?")
_NEURON_FAMILY = re.compile(r"(inf|trn)(\d+[a-z]*)?")


def _requirement_asks(requirement: Mapping[str, Any]) -> bool:
    """Whether a requirement asks for what its key names (an accelerator): `Exists`, `In` of a value other
    than none, or `Gt`."""
    operator, values = requirement.get("operator"), [str(v) for v in requirement.get("values") or ()]
    return operator in ("Exists", "Gt") or (operator == "In" and any(v not in ("0", "") for v in values))


def pool_target(requirements: Iterable[Mapping[str, Any]]) -> tuple[frozenset[Architecture], Variant]:
    """What one NodePool's `spec.template.spec.requirements` let it launch: the architectures (empty: it does
    not say) and the AMI variant its instances need."""
    arches: frozenset[Architecture] = frozenset()
    variant = Variant.STANDARD
    for req in requirements:
        key, operator = req.get("key"), req.get("operator")
        values = [str(v) for v in req.get("values") or ()]
        if key == ARCH_KEY and operator in ("In", "NotIn"):
            named = {_KUBE_ARCHITECTURES[v] for v in values if v in _KUBE_ARCHITECTURES}
            arches = frozenset(named if operator == "In" else set(Architecture) - named)
        elif key in _NVIDIA_KEYS and _requirement_asks(req):
            variant = Variant.NVIDIA
        elif key in _NEURON_KEYS and _requirement_asks(req):
            variant = Variant.NEURON
        elif key in _FAMILY_KEYS and operator == "In" and values:
            if all(_NVIDIA_FAMILY.fullmatch(v) and v != "g4ad" for v in values):
                variant = Variant.NVIDIA
            elif all(_NEURON_FAMILY.fullmatch(v) for v in values):
                variant = Variant.NEURON
    return arches, variant


def node_pools_target(node_class: str, pools: Iterable[Mapping[str, Any]]) -> LaunchTarget:
    """What the builder of EC2NodeClass `node_class` runs, from the NodePools that launch from it
    (`spec.template.spec.nodeClassRef.name`): their architecture (x86_64 when none says; refused when they
    launch both, as a snapshot holds one architecture's layers) and their AMI variant (the standard one
    when they differ: the data volume's containerd is the same on every variant)."""
    arches: set[Architecture] = set()
    variants: set[Variant] = set()
    names: list[str] = []
    for pool in pools:
        template = ((pool.get("spec") or {}).get("template") or {}).get("spec") or {}
        if (template.get("nodeClassRef") or {}).get("name") != node_class:
            continue
        names.append(str((pool.get("metadata") or {}).get("name", "")))
        pool_arches, variant = pool_target(template.get("requirements") or ())
        arches |= pool_arches
        variants.add(variant)
    if len(arches) > 1:
        raise LaunchSourceError(f"EC2NodeClass {node_class}: its NodePools ({', '.join(sorted(names))}) launch "
                                "both amd64 and arm64 nodes, and a snapshot holds one architecture's image "
                                "layers: give each architecture its own EC2NodeClass and WarmSnapshot")
    return LaunchTarget(next(iter(arches), Architecture.X86_64),
                        variants.pop() if len(variants) == 1 else Variant.STANDARD)


def tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """EC2 Describe* filters for a selector term's tags: `*` is any value (a `tag-key` filter)."""
    return [{"Name": "tag-key", "Values": [key]} if value == "*" else {"Name": f"tag:{key}", "Values": [value]}
            for key, value in sorted(tags.items())]


def ami_query(term: Mapping[str, Any]) -> dict[str, Any]:
    """DescribeImages' arguments for one non-alias `amiSelectorTerms` entry (id, or name/tags/owner)."""
    if term.get("id"):
        return {"ImageIds": [str(term["id"])]}
    filters = tag_filters(term.get("tags") or {})
    if term.get("name"):
        filters.append({"Name": "name", "Values": [str(term["name"])]})
    if not filters:
        raise LaunchSourceError(f"amiSelectorTerms entry {dict(term)} names no id, alias, name or tags")
    # Karpenter's default owners for a term that names none: the account itself and Amazon.
    owners = [str(term["owner"])] if term.get("owner") else ["self", "amazon"]
    return {"Owners": owners, "Filters": filters}


def subnet_query(term: Mapping[str, Any]) -> dict[str, Any]:
    """DescribeSubnets' arguments for one `subnetSelectorTerms` entry (id, or tags)."""
    if term.get("id"):
        return {"SubnetIds": [str(term["id"])]}
    if not term.get("tags"):
        raise LaunchSourceError(f"subnetSelectorTerms entry {dict(term)} names no id or tags")
    return {"Filters": tag_filters(term["tags"])}


def newest_image(images: Sequence[Mapping[str, Any]], where: str,
                 architecture: Architecture | None = None) -> tuple[str, Architecture]:
    """The newest available AMI among those the terms selected (Karpenter's choice among several), of
    `architecture` when given (terms may select an AMI per architecture), and its architecture."""
    available = [i for i in images if i.get("State", "available") == "available"
                 and i.get("Architecture", Architecture.X86_64) in set(Architecture)]
    if architecture is not None:
        available = [i for i in available if i.get("Architecture", Architecture.X86_64) == architecture]
    if not available:
        of = f" {architecture}" if architecture is not None else ""
        raise LaunchSourceError(f"{where}: its amiSelectorTerms select no available{of} AMI")
    newest = max(available, key=lambda i: str(i.get("CreationDate", "")))
    return str(newest["ImageId"]), Architecture(newest.get("Architecture", Architecture.X86_64))


# AWS's public AMI parameters name the architecture in their path: `.../arm64/...`, `...-kernel-6.1-arm64`.
_PATH_ARCHITECTURE = re.compile(r"(?:^|[/_-])(arm64|x86_64)(?:$|[/_-])")


def parameter_architecture(image_id: str) -> Architecture:
    """The architecture of `resolve:ssm:PARAMETER` as its path names it (every AWS AMI parameter's does)."""
    found = {Architecture(m) for m in _PATH_ARCHITECTURE.findall(image_id.removeprefix("resolve:ssm:"))}
    if len(found) != 1:
        raise LaunchSourceError(f'spec.builder.imageId "{image_id}": its parameter path does not name one '
                                "architecture (arm64 or x86_64): name the AMI id (ami-...) instead")
    return found.pop()


def image_architecture(image: Mapping[str, Any], where: str) -> Architecture:
    """The architecture of an AMI as DescribeImages gives it; one Prewarm cannot build on is refused."""
    value = str(image.get("Architecture", Architecture.X86_64))
    if value not in set(Architecture):
        raise LaunchSourceError(f'{where}: its AMI {image.get("ImageId")} is {value}, not x86_64 or arm64')
    return Architecture(value)


# Graviton instance types: a `g` after the generation (m7g, c6gn, x2gd, im4gn, is4gen, g5g), and a1.
_GRAVITON = re.compile(r"a1|[a-z]+\d+[a-z]*g[a-z]*")


def instance_target(instance_type: str) -> LaunchTarget:
    """What an instance type runs: its architecture, and the AMI variant its accelerator needs."""
    family = instance_type.partition(".")[0]
    arch = Architecture.ARM64 if _GRAVITON.fullmatch(family) else Architecture.X86_64
    return LaunchTarget(arch, pool_target([{"key": _FAMILY_KEYS[0], "operator": "In", "values": [family]}])[1])


def builder_instance_type(given: str | None, architecture: Architecture, ami: str = "the node class's AMI") -> str:
    """The builder's instance type: the spec's, which must run the AMI's architecture, else the default for
    that architecture (`DEFAULT_INSTANCE_TYPES`). `ami`: whose AMI, for the error."""
    if given is None:
        return DEFAULT_INSTANCE_TYPES[architecture]
    runs = instance_target(given).architecture
    if runs is not architecture:
        raise LaunchSourceError(f'spec.builder.instanceType "{given}" runs {runs}, but {ami} is '
                                f"{architecture}: name a{'' if runs is Architecture.ARM64 else ' Graviton'} "
                                f"{architecture} type or leave it out")
    return given


def builder_source(builder: BuilderSpec, node_class: LaunchSource | None,
                   named: Architecture | None = None) -> LaunchSource:
    """What the builder launches from: the spec's `imageId` / `subnetIds` where given, else the node
    class's (None: the spec names both, the node class is not read). `named`: the architecture of the AMI
    the spec names, which the builder then runs."""
    image_id = builder.image_id or (node_class.image_id if node_class else "")
    subnets = tuple(builder.subnet_ids) or (node_class.subnet_ids if node_class else ())
    if not subnets:
        raise LaunchSourceError("no subnet to launch the builder in: the node class selects none and "
                                "spec.builder.subnetIds is empty")
    if builder.image_id:
        if named is None:
            raise LaunchSourceError(f'spec.builder.imageId "{builder.image_id}": its architecture is not known')
        return LaunchSource(image_id, subnets, named)
    if node_class is None:
        raise LaunchSourceError("no AMI to launch the builder from: the node class was not read")
    return LaunchSource(image_id, subnets, node_class.architecture)


def needs_node_class(builder: BuilderSpec) -> bool:
    """Whether the spec leaves the AMI or the subnets to the node class."""
    return builder.image_id is None or not builder.subnet_ids
