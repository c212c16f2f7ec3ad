"""`prewarm local up --registry-quota API=RATE` lowers the local registry's request quotas (before: only a
test could, by reaching into the AWS limits layer), and `--replica-region` needs further clusters."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from prewarm_devtools.commands import local, parse_registry_quotas


def test_each_quota_names_the_aws_limits_layer_s_rate_it_lowers() -> None:
    assert parse_registry_quotas(("layer=20", "manifest=5.5", "token=1")) == {
        "ecr_layer_per_s": 20.0, "ecr_manifest_per_s": 5.5, "ecr_auth_per_s": 1.0}


@pytest.mark.parametrize("bad", ["blob=20", "layer=0", "layer=fast", "layer", "layer=inf"])
def test_a_bad_quota_is_named(bad: str) -> None:
    with pytest.raises(click.BadParameter, match=f"'{bad}': give API=RATE with API one of token, manifest, layer"):
        parse_registry_quotas((bad,))


def test_local_up_refuses_a_bad_quota_or_a_replica_without_further_clusters_before_starting_anything() -> None:
    refused = CliRunner().invoke(local, ["up", "--registry-quota", "blob=3"])
    assert refused.exit_code == 2 and "--registry-quota" in refused.output
    refused = CliRunner().invoke(local, ["up", "--replica-region", "us-east-1"])
    assert refused.exit_code == 2 and "--replica-region is the further clusters' Region" in refused.output
