"""`prewarm local up --clusters`: what it refuses before starting anything, and how the further clusters
are named."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from prewarm_devtools.commands import local
from prewarm_devtools.localclusters import extra_cluster_names


def test_the_further_clusters_are_named_after_the_own_one() -> None:
    assert extra_cluster_names("local", 1) == []
    assert extra_cluster_names("local", 3) == ["local-2", "local-3"]


@pytest.mark.parametrize("args", [["--clusters", "2", "--agents", "image"],
                                  ["--clusters", "2", "--kubeconfig", __file__]])
def test_further_clusters_need_the_embedded_api_and_agent_processes(args: list[str]) -> None:
    result = CliRunner().invoke(local, ["up", *args])
    assert result.exit_code == 2
    assert "--clusters plays further clusters with embedded APIs and agent processes" in result.output


def test_zero_clusters_is_refused_naming_the_option() -> None:
    result = CliRunner().invoke(local, ["up", "--clusters", "0"])
    assert result.exit_code == 2 and "--clusters" in result.output
