"""Job commands across clusters: `--cluster` on apply, get, describe, watch and delete, the CLUSTER column,
and a cluster name that is not served refused naming it. On a stack of its own: a registered cluster
changes what `get jobs` shows for every test that shares a stack."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.domain.clusters import RegisteredCluster
from prewarm_devtools.sam.stack import LocalStack
from tests.integration.cli.conftest import stack_state
from tests.support.cli import Run
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster_stack(local_stack: LocalStack) -> LocalStack:
    """A second stack on the package's moto server (moto's backends are the process's: a server of its own
    would reset the package stack's table when it stops)."""
    return LocalStack(local_stack.endpoint_url, parameters={"ClusterName": "home"},
                      stack_name=f"prewarm-clusters-{uuid.uuid4().hex[:8]}").deploy()


@pytest.fixture(scope="module")
def state_file(cluster_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stack_state(cluster_stack, tmp_path_factory)


@pytest.fixture(scope="module")
def store(cluster_stack: LocalStack) -> DynamoJobStore:
    return DynamoJobStore(cluster_stack.env()["TABLE_NAME"], client=cluster_stack.dynamodb)


def test_one_cluster_output_is_unchanged_until_a_second_cluster_is_served(prewarm: Run, store: DynamoJobStore
                                                                          ) -> None:
    assert prewarm("apply", "-f", "-", input=job_yaml("solo")).exit_code == 0
    header = prewarm("get", "jobs").stdout.splitlines()[0].split()
    assert header[0] == "NAME"
    # Naming the stack's own cluster is the same as naming none
    assert prewarm("get", "jobs", "solo", "--cluster", "home").exit_code == 0


def test_apply_to_several_clusters_makes_one_job_each_and_get_shows_the_cluster(prewarm: Run, store: DynamoJobStore
                                                                               ) -> None:
    store.put_cluster(RegisteredCluster("prod-eu", endpoint="https://127.0.0.1:1", labels={"env": "prod"}))
    # When one manifest is applied to the own cluster and prod-eu
    applied = prewarm("apply", "-f", "-", "--cluster", "home", "--cluster", "prod-eu", input=job_yaml("web"))
    assert applied.exit_code == 0, applied.stderr
    assert applied.stdout.splitlines() == ["imagepulljob.apps.kruise.io/web created (cluster home)",
                                           "imagepulljob.apps.kruise.io/web created (cluster prod-eu)"]
    assert store.get_job("default/web") is not None and store.get_job("prod-eu:default/web") is not None
    # Then get jobs lists both under a CLUSTER column, the own cluster by its ClusterName
    lines = prewarm("get", "jobs").stdout.splitlines()
    assert lines[0].split()[:2] == ["CLUSTER", "NAME"]
    assert sorted(line.split()[0] for line in lines[1:] if line.split()[1] == "web") == ["home", "prod-eu"]
    only = prewarm("get", "jobs", "--cluster", "prod-eu").stdout.splitlines()
    assert [line.split()[:2] for line in only[1:]] == [["prod-eu", "web"]]
    # and describe shows the job of the cluster named, then every cluster's counts
    described = prewarm("describe", "job", "web", "--cluster", "prod-eu").stdout
    assert "Cluster:" in described and "prod-eu" in described
    counts = described.split("Clusters:\n", 1)[1].splitlines()
    assert counts[0].split()[:3] == ["CLUSTER", "NAME", "TOTAL"]
    assert sorted(row.split()[0] for row in counts[1:]) == ["home", "prod-eu"]


def test_delete_takes_the_job_of_the_cluster_named_only(prewarm: Run, store: DynamoJobStore) -> None:
    store.put_cluster(RegisteredCluster("staging", endpoint="https://127.0.0.1:1"))
    assert prewarm("apply", "-f", "-", "--cluster", "staging", "--cluster", "home",
                   input=job_yaml("gone")).exit_code == 0
    deleted = prewarm("delete", "job", "gone", "--cluster", "staging")
    assert deleted.exit_code == 0, deleted.stderr
    staged, own = store.get_job("staging:default/gone"), store.get_job("default/gone")
    assert staged is not None and staged.state.value == "Deleting"
    assert own is not None and own.state.value == "Running"
    missing = prewarm("delete", "job", "solo", "--cluster", "staging")
    assert missing.exit_code == 1
    assert 'job "solo" not found in namespace "default" of cluster "staging"' in missing.stderr


@pytest.mark.parametrize(("name", "why"), [
    ("nowhere", 'cluster "nowhere" is not registered with'),
    ("bad:name", "invalid cluster name 'bad:name'"),
])
def test_a_cluster_the_stack_does_not_serve_is_a_usage_error_naming_it(prewarm: Run, name: str, why: str) -> None:
    for args in (("get", "jobs"), ("apply", "-f", "-"), ("describe", "job", "web"), ("delete", "job", "web"),
                 ("watch", "job", "web")):
        result = prewarm(*args, "--cluster", name, input=job_yaml("never-applied"))
        assert result.exit_code == 2, (args, result.output)
        assert "--cluster" in result.stderr and why in result.stderr, (args, result.stderr)


def test_get_jobs_as_json_or_yaml_names_each_jobs_cluster(prewarm: Run, store: DynamoJobStore) -> None:
    import json

    import yaml

    store.put_cluster(RegisteredCluster("twin-b", endpoint="https://127.0.0.1:1"))
    assert prewarm("apply", "-f", "-", "--cluster", "home", "--cluster", "twin-b",
                   input=job_yaml("twin")).exit_code == 0
    # Before, the two namesake jobs printed as the same document but for their uid
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        items = load(prewarm("get", "jobs", "twin", "--cluster", "twin-b", "-o", output).stdout)
        assert items["metadata"]["annotations"]["prewarm.dev/cluster"] == "twin-b"
        listed = load(prewarm("get", "jobs", "-o", output).stdout)["items"]
        assert sorted(d["metadata"]["annotations"]["prewarm.dev/cluster"] for d in listed
                      if d["metadata"]["name"] == "twin") == ["home", "twin-b"]


def rule_names(store: DynamoJobStore) -> set[str]:
    return {r["metadata"]["name"] for r in store.list_rules()}


def rule_yaml(name: str, clusters: list[str] | None = None) -> str:
    names = f"\n  clusters:\n    names: [{', '.join(clusters)}]" if clusters else ""
    return (f"apiVersion: prewarm.dev/v1alpha1\nkind: PrewarmRule\nmetadata:\n  name: {name}\nspec:\n"
            f"  repositories: [team/*]{names}\n")


def test_a_rule_is_the_stacks_so_apply_refuses_cluster_with_one(prewarm: Run, store: DynamoJobStore) -> None:
    store.put_cluster(RegisteredCluster("rule-b", endpoint="https://127.0.0.1:1"))
    # Before: "prewarmrule.prewarm.dev/... unchanged (cluster rule-b)", exit 0
    refused = prewarm("apply", "-f", "-", "--cluster", "rule-b", input=rule_yaml("by-cluster"))
    assert refused.exit_code == 2, refused.output
    assert "--cluster does not apply to a rule" in refused.stderr and "unchanged" not in refused.stdout
    assert "by-cluster" not in rule_names(store)
    assert prewarm("apply", "-f", "-", input=rule_yaml("by-cluster", ["home", "rule-b"])).exit_code == 0


def test_a_rule_naming_a_cluster_the_stack_does_not_serve_is_refused_naming_it(prewarm: Run, store: DynamoJobStore
                                                                              ) -> None:
    # Before: accepted (exit 0), and its pushes silently made no job
    refused = prewarm("apply", "-f", "-", input=rule_yaml("typo", ["home", "prod-ue"]))
    assert refused.exit_code == 2, refused.output
    assert 'spec.clusters.names: cluster "prod-ue" is not registered' in refused.stderr
    assert "typo" not in rule_names(store)
