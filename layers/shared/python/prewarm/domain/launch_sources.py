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

The spec's `builder.imageId` and `builder.subnetIds` override either. Pure: the adapter makes the calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prewarm.domain.snapshots import AmiFamily, BuilderSpec


class LaunchSourceError(ValueError):
    """A node class that does not say where its nodes launch in a way a builder can follow."""


@dataclass(frozen=True)
class LaunchSource:
    """The builder's AMI (an id, or `resolve:ssm:PARAMETER`) and the subnets it may launch in."""

    image_id: str
    subnet_ids: tuple[str, ...]


# The alias families Prewarm bakes, by Karpenter's alias name ("amiSelectorTerms", alias: family@version).
_ALIAS_FAMILIES = {"al2023": AmiFamily.AL2023, "bottlerocket": AmiFamily.BOTTLEROCKET}
# Builders are x86_64 (their default instance type is m6i.large).
_ARCHITECTURE = "x86_64"


def family_image_id(family: AmiFamily, kubernetes_version: str, version: str = "latest") -> str:
    """The family's EKS-optimized AMI for a Kubernetes version, as the SSM parameter Karpenter reads for an
    alias (`version`: `latest` or a pinned release such as `v20240807` / `v1.26.0`)."""
    if family is AmiFamily.BOTTLEROCKET:
        release = "latest" if version == "latest" else version.removeprefix("v")
        return f"resolve:ssm:/aws/service/bottlerocket/aws-k8s-{kubernetes_version}/{_ARCHITECTURE}/{release}/image_id"
    name = ("recommended" if version == "latest"
            else f"amazon-eks-node-al2023-{_ARCHITECTURE}-standard-{kubernetes_version}-{version}")
    return (f"resolve:ssm:/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/{_ARCHITECTURE}/"
            f"standard/{name}/image_id")


def alias_image_id(alias: str, family: AmiFamily, kubernetes_version: str) -> str:
    """An `amiSelectorTerms[].alias` as the image id a builder of `family` launches from."""
    name, _, version = alias.partition("@")
    aliased = _ALIAS_FAMILIES.get(name.lower())
    if not version or aliased is None:
        raise LaunchSourceError(f'amiSelectorTerms alias "{alias}" is not one Prewarm bakes: use '
                                '"al2023@latest", "bottlerocket@latest" or a pinned version (family@vX)')
    if aliased is not family:
        raise LaunchSourceError(f'amiSelectorTerms alias "{alias}" is not of the warm snapshot\'s amiFamily '
                                f"{family}: the snapshot would be baked for another OS")
    return family_image_id(family, kubernetes_version, version)


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


def newest_image(images: Sequence[Mapping[str, Any]], where: str) -> str:
    """The newest available AMI among those the terms selected (Karpenter's choice among several)."""
    available = [i for i in images if i.get("State", "available") == "available"]
    if not available:
        raise LaunchSourceError(f"{where}: its amiSelectorTerms select no available AMI")
    return str(max(available, key=lambda i: str(i.get("CreationDate", "")))["ImageId"])


def builder_source(builder: BuilderSpec, node_class: LaunchSource | None) -> LaunchSource:
    """What the builder launches from: the spec's `imageId` / `subnetIds` where given, else the node
    class's (None: the spec names both, the node class is not read)."""
    image_id = builder.image_id or (node_class.image_id if node_class else "")
    subnets = tuple(builder.subnet_ids) or (node_class.subnet_ids if node_class else ())
    if not subnets:
        raise LaunchSourceError("no subnet to launch the builder in: the node class selects none and "
                                "spec.builder.subnetIds is empty")
    return LaunchSource(image_id, subnets)


def needs_node_class(builder: BuilderSpec) -> bool:
    """Whether the spec leaves the AMI or the subnets to the node class."""
    return builder.image_id is None or not builder.subnet_ids
