"""A rule whose spec.clusters names a cluster the stack does not serve makes no job there, and each push it
matches says so in the log, naming the rule and the cluster (before: `push handled {"jobs": []}`, no word)."""

from __future__ import annotations

import logging

import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm.domain.push import ImagePush
from prewarm.services.jobs import apply_manifest
from prewarm.services.push import handle_push
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane

PUSH = ImagePush(account="123456789012", region="us-west-2", repository="ml/model", digest="sha256:" + "a" * 64,
                 tag="v1")


def test_each_push_a_rule_naming_an_unknown_cluster_matches_warns_naming_both(
    plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    plane.store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://prod.example"))
    rule = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "models"},
            "spec": {"repositories": ["ml/*"], "clusters": {"names": ["home", "prod-ue"]}}}
    apply_manifest(plane.store, rule, now=plane.now())
    with caplog.at_level(logging.WARNING, logger="prewarm.services.push"):
        applied = handle_push(plane.store, None, PUSH, now=plane.now(), clusters=clusters_of(plane.store,
                                                                                            own_name="home"))
    assert [a.cluster for a in applied] == [""]
    warned = [(r.getMessage(), getattr(r, "rule", None), getattr(r, "cluster", None)) for r in caplog.records]
    assert warned == [("rule names a cluster the stack does not serve: no job there", "models", "prod-ue")]
