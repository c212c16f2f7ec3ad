"""ECR's private replication, as Prewarm uses it: which Regions a pushed repository is copied to, so that a
cluster in one of them pulls its own Region's replica, and only once ECR says the replica is there.

A cluster in another Region than the push pulls `<account>.dkr.ecr.<its region>.amazonaws.com/...` at the
same digest when the registry's replication configuration (`DescribeRegistry`) copies the repository there.
Its job is stored holding for that Region's `ECR Replication Action` event: a pull that races replication
fails with "not found".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prewarm.domain.push import REGION


class ReplicationConfigError(ValueError):
    """A replication configuration that is not the shape `DescribeRegistry` answers; names the field."""


@dataclass(frozen=True)
class ReplicationRule:
    """One rule of a registry's replication configuration: the (account, region) destinations of the
    repositories its prefix filters match (no filter: every repository)."""

    destinations: tuple[tuple[str, str], ...]
    prefixes: tuple[str, ...] = ()

    def copies(self, repository: str) -> bool:
        # PutReplicationConfiguration: "filterType ... Valid Values: PREFIX_MATCH", the only type.
        return not self.prefixes or any(repository.startswith(p) for p in self.prefixes)


@dataclass(frozen=True)
class Replication:
    """A registry's replication configuration (its `registryId`'s rules)."""

    registry: str
    rules: tuple[ReplicationRule, ...] = ()

    @classmethod
    def of_registry(cls, answer: Mapping[str, Any]) -> Replication:
        """From `DescribeRegistry`'s answer (`registryId`, `replicationConfiguration.rules`)."""
        registry = answer.get("registryId")
        if not isinstance(registry, str) or not registry:
            raise ReplicationConfigError("registryId: missing from the DescribeRegistry answer")
        rules = []
        raw_rules = (answer.get("replicationConfiguration") or {}).get("rules") or []
        for index, rule in enumerate(raw_rules):
            where = f"replicationConfiguration.rules[{index}]"
            destinations = []
            for d in rule.get("destinations") or []:
                region, account = d.get("region"), d.get("registryId")
                if not isinstance(region, str) or not REGION.fullmatch(region) or not isinstance(account, str):
                    raise ReplicationConfigError(f"{where}.destinations: {d!r} is not a region and registryId")
                destinations.append((account, region))
            prefixes = tuple(str(f.get("filter", "")) for f in rule.get("repositoryFilters") or []
                             if f.get("filterType", "PREFIX_MATCH") == "PREFIX_MATCH")
            rules.append(ReplicationRule(tuple(destinations), prefixes))
        return cls(registry, tuple(rules))

    def regions(self, repository: str) -> frozenset[str]:
        """The Regions of this registry's own account that `repository` is replicated to (a copy to another
        account's registry is that account's image, pulled with its credentials: not used here)."""
        return frozenset(region for rule in self.rules if rule.copies(repository)
                         for account, region in rule.destinations if account == self.registry)


def replica_region(cluster_region: str, push_region: str, replicated: Iterable[str]) -> str:
    """The Region whose replica a cluster in `cluster_region` pulls ("" for a cluster with no Region of its
    own, in the push's Region, or one the repository is not replicated to: it pulls the pushed image).

    >>> replica_region("eu-west-1", "us-west-2", {"eu-west-1"}), replica_region("eu-west-1", "us-west-2", ())
    ('eu-west-1', '')
    """
    if not cluster_region or cluster_region == push_region:
        return ""
    return cluster_region if cluster_region in set(replicated) else ""


def replication_note(region: str) -> str:
    """What a job holding for Region `region`'s replica says (get, describe)."""
    return f"waiting for ECR replication to {region}: starts on its ECR Replication Action event"
