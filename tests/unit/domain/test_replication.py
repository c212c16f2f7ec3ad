"""Which Regions ECR replicates a repository to, read from `DescribeRegistry`'s answer."""

from __future__ import annotations

import pytest

from prewarm.domain.clusters import ClusterError, RegisteredCluster
from prewarm.domain.replication import Replication, ReplicationConfigError

ANSWER = {
    "registryId": "123456789012",
    "replicationConfiguration": {"rules": [
        {"destinations": [{"region": "eu-west-1", "registryId": "123456789012"},
                          {"region": "eu-west-2", "registryId": "210987654321"}],
         "repositoryFilters": [{"filter": "ml/", "filterType": "PREFIX_MATCH"}]},
        {"destinations": [{"region": "ap-south-1", "registryId": "123456789012"}]},
    ]},
}


def test_a_repository_is_replicated_to_the_own_account_s_regions_its_rules_filters_match() -> None:
    replication = Replication.of_registry(ANSWER)
    assert replication.regions("ml/model") == {"eu-west-1", "ap-south-1"}  # eu-west-2: another account's
    assert replication.regions("web/app") == {"ap-south-1"}  # the unfiltered rule copies every repository


def test_a_registry_with_no_replication_configuration_replicates_nothing() -> None:
    assert Replication.of_registry({"registryId": "123456789012"}).regions("ml/model") == frozenset()


def test_a_malformed_destination_is_named() -> None:
    bad = {"registryId": "123456789012",
           "replicationConfiguration": {"rules": [{"destinations": [{"region": "Europe"}]}]}}
    with pytest.raises(ReplicationConfigError, match=r"rules\[0\]\.destinations: .*Europe"):
        Replication.of_registry(bad)


def test_a_cluster_s_region_must_be_an_aws_region_name() -> None:
    assert RegisteredCluster("eu", region="eu-west-1").region == "eu-west-1"
    with pytest.raises(ClusterError, match="cluster eu: region 'Ireland' is not an AWS Region"):
        RegisteredCluster("eu", region="Ireland")
