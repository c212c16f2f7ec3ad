"""`prewarm cluster add|list|remove` against a local stack and a second embedded Kubernetes API that the
AWS limits layer serves as EKS cluster "east": its endpoint and CA come from DescribeCluster, the
function roles' access entries are created through the EKS API with the groups the shipped RBAC binds
(so the functions' EKS tokens are accepted there), the install lands in that cluster with its agents told
their cluster, and remove undoes all of it."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from click.testing import Result

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.eks_auth import EksTokenSource
from prewarm.domain.clusters import ClusterSetup
from prewarm.domain.job import JobState
from prewarm.services.jobs import apply_manifest
from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE, FUNCTION_GROUPS
from prewarm_cli.targets import STACK_OUTPUTS, LocalState, write_local_state
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import OPERATOR
from prewarm_devtools.sam.stack import LocalStack
from tests.integration.cli.conftest import cli_on
from tests.support.kube import call
from tests.support.manifests import job_doc

pytestmark = pytest.mark.integration

Run = Callable[..., Result]


@pytest.fixture
def east(local_stack: LocalStack) -> Iterator[KubeApiServer]:
    """EKS cluster "east": an embedded API that checks a token was made for it, served by the layer; the
    operator (its creator) is its admin, and STS knows the function roles' keys."""
    from prewarm_devtools import aws_limits
    from prewarm_devtools.kubeapi.auth import MASTERS, AccessEntry

    layer = aws_limits.active()
    if layer is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS=off): nothing serves EKS's access entries")
    with KubeApiServer(tls=True, cluster_name="east", access_entries={}) as api:
        api.map_access_key(OPERATOR.access_key_id, OPERATOR.arn)
        api.add_access_entry(OPERATOR.arn, AccessEntry(groups=(MASTERS,)))
        for fn in local_stack.functions.values():
            if fn.identity is not None:
                api.map_access_key(fn.identity.access_key_id, fn.identity.arn)
        layer.eks.serve("east", api.url, base64.b64encode(api.ca_pem.encode()).decode(), api)
        yield api
        layer.eks.forget("east")


@pytest.fixture
def run(local_stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """`prewarm --local ARGS` against the stack, whose outputs name its function roles (as a deployed one's)."""
    outputs = local_stack.outputs()
    env = {**local_stack.env(), **{name: outputs[key] for key, name in STACK_OUTPUTS.items() if outputs.get(key)},
           "AGENT_ROLE_ARN": "arn:aws:iam::123456789012:role/pw-agents"}
    state = write_local_state(LocalState(local_stack.endpoint_url, local_stack.region, env, pid=os.getpid()),
                              tmp_path / "local.json")
    return cli_on(state, monkeypatch)


@pytest.fixture
def store(local_stack: LocalStack) -> DynamoJobStore:
    return DynamoJobStore(local_stack.env()["TABLE_NAME"], client=local_stack.dynamodb)


def eks(local_stack: LocalStack) -> Any:
    return boto3.client("eks", region_name=local_stack.region, endpoint_url=local_stack.endpoint_url,
                        aws_access_key_id=OPERATOR.access_key_id, aws_secret_access_key=OPERATOR.secret_access_key)


def role_of(local_stack: LocalStack, setting: str) -> Any:
    """The identity of the function whose role the stack setting names (`SWEEP_ROLE_ARN`)."""
    outputs = local_stack.outputs()
    arn = {name: outputs[key] for key, name in STACK_OUTPUTS.items() if key in outputs}[setting]
    return next(fn.identity for fn in local_stack.functions.values()
                if fn.identity is not None and fn.identity.arn == arn)


def as_function(api: KubeApiServer, identity: Any, cluster: str, path: str) -> int:
    session = boto3.Session(aws_access_key_id=identity.access_key_id,
                            aws_secret_access_key=identity.secret_access_key, region_name="us-west-2")
    with api.api_client(EksTokenSource(cluster, session)()) as client:
        status: int = call(client, "GET", path).status
    return status


def test_add_creates_the_access_entries_installs_and_records_the_cluster_idempotently(
    run: Run, east: KubeApiServer, local_stack: LocalStack, store: DynamoJobStore
) -> None:
    sweep = role_of(local_stack, "SWEEP_ROLE_ARN")
    # Before: the sweep's role has no access entry in east
    assert as_function(east, sweep, "east", "/api/v1/nodes") == 401

    added = run("cluster", "add", "east", "--label", "env=prod", "--label", "region=us-west-2")

    assert added.exit_code == 0, added.output
    assert added.stdout.splitlines()[-1] == f"cluster/east added ({east.url}, labels env=prod,region=us-west-2)"
    # Recorded before the install, then checked from the stack's network by its resource sync function
    lines = added.stdout.splitlines()
    recorded_at = lines.index(
        "cluster/east recorded (Installing): the stack serves it, its agents' hellos are accepted")
    assert lines[recorded_at + 1] == "cluster east reached from the stack's network: Kubernetes v1.33.5-eks-3025e55"
    assert lines[recorded_at + 2].startswith("customresourcedefinition.apiextensions.k8s.io/")
    # Each function role has its entry, with the groups the shipped RBAC binds
    client = eks(local_stack)
    outputs = {name: local_stack.outputs()[key] for key, name in STACK_OUTPUTS.items() if key in local_stack.outputs()}
    wanted: dict[str, set[str]] = {}
    for setting, groups in FUNCTION_GROUPS.items():
        wanted.setdefault(outputs[setting], set()).update(groups)
    assert sorted(client.list_access_entries(clusterName="east")["accessEntries"]) == sorted(wanted)
    for arn, groups in wanted.items():
        entry = client.describe_access_entry(clusterName="east", principalArn=arn)["accessEntry"]
        assert (set(entry["kubernetesGroups"]), entry["type"]) == (groups, "STANDARD")
    # And they work: the sweep's token for east lists east's nodes through the installed RBAC
    assert as_function(east, sweep, "east", "/api/v1/nodes") == 200
    # The install is in east, its agents told their cluster
    daemon_set = east.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    assert {"name": "PREWARM_CLUSTER", "value": "east"} in container["env"]
    # The table holds it, with the endpoint and CA EKS gave
    recorded = store.get_cluster("east")
    assert recorded is not None and recorded.endpoint == east.url and dict(recorded.labels) == {
        "env": "prod", "region": "us-west-2"}
    assert base64.b64decode(recorded.ca_data).decode() == east.ca_pem
    assert recorded.setup is ClusterSetup.INSTALLED

    # Again: nothing changes
    version = daemon_set["metadata"]["resourceVersion"]
    again = run("cluster", "add", "east", "--label", "env=prod", "--label", "region=us-west-2")
    assert again.exit_code == 0, again.output
    assert [line for line in again.stdout.splitlines()[:-1] if " unchanged" not in line] == [
        "cluster/east recorded (Installing): the stack serves it, its agents' hellos are accepted",
        "cluster east reached from the stack's network: Kubernetes v1.33.5-eks-3025e55"]
    assert again.stdout.splitlines()[-1].startswith("cluster/east configured")
    assert east.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE)["metadata"]["resourceVersion"] == version
    assert store.get_cluster("east").added_at == recorded.added_at  # type: ignore[union-attr]
    run("cluster", "remove", "east")


def test_an_entry_missing_a_group_gets_it(run: Run, east: KubeApiServer, local_stack: LocalStack) -> None:
    client = eks(local_stack)
    arn = local_stack.outputs()["DispatchJobRoleArn"]
    client.create_access_entry(clusterName="east", principalArn=arn, kubernetesGroups=["team-a"])
    added = run("cluster", "add", "east")
    assert added.exit_code == 0, added.output
    groups = client.describe_access_entry(clusterName="east", principalArn=arn)["accessEntry"]["kubernetesGroups"]
    assert groups == ["team-a", *FUNCTION_GROUPS["DISPATCH_JOB_ROLE_ARN"]]
    assert f"access entry {arn} configured" in added.stdout
    run("cluster", "remove", "east")


@pytest.mark.parametrize(("args", "named"), [
    (["cluster", "add", "east", "--label", "env"], "'env': a label is KEY=VALUE"),
    (["cluster", "add", "east", "--label", "env=no good"], "env"),
    (["cluster", "add", "east", "--label", "-bad=x"], "-bad"),
    (["cluster", "add", "_east"], "'_east'"),
    (["cluster", "add", "a" * 101], "no more than 100 characters"),
    (["cluster", "remove", "bad/name"], "'bad/name'"),
])
def test_bad_input_exits_2_naming_the_value(run: Run, east: KubeApiServer, args: list[str], named: str,
                                           store: DynamoJobStore) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and named in result.stderr, result.stderr
    assert store.get_cluster("east") is None


def test_a_cluster_eks_does_not_know_is_refused_and_nothing_recorded(run: Run, store: DynamoJobStore) -> None:
    result = run("cluster", "add", "west")
    assert result.exit_code == 1
    # One line, as for every error a user can act on (before: "error: unexpected RegistrationError: ...")
    assert result.stderr.startswith("error: EKS cluster 'west' not found in us-west-2"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert store.get_cluster("west") is None


def test_a_cluster_older_than_kubernetes_1_30_is_refused_naming_its_version_and_nothing_is_installed(
    run: Run, east: KubeApiServer, store: DynamoJobStore
) -> None:
    east.version = {**east.version, "minor": "29+", "gitVersion": "v1.29.8-eks-a737599"}

    result = run("cluster", "add", "east")

    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: cluster east runs Kubernetes v1.29.8-eks-a737599, older than 1.30: the ValidatingAdmissionPolicy the "
        "install applies is GA from 1.30; upgrade the cluster (cluster east is recorded Failed"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert east.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE) is None
    listed = run("cluster", "list")
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("east ")]
    assert listed.exit_code == 1 and row.split()[:3] == ["east", "none", "Failed"]
    assert "cluster add failed: cluster east runs Kubernetes v1.29.8-eks-a737599" in row

    # Once upgraded, adding it again finishes the job
    east.version = {**east.version, "minor": "30+", "gitVersion": "v1.30.4-eks-a737599"}
    again = run("cluster", "add", "east")
    assert again.exit_code == 0, again.output
    assert "cluster east reached from the stack's network: Kubernetes v1.30.4-eks-a737599" in again.stdout
    recorded = store.get_cluster("east")
    assert recorded is not None and (recorded.setup, recorded.setup_message) == (ClusterSetup.INSTALLED, "")
    run("cluster", "remove", "east")


def test_a_cluster_the_stacks_functions_cannot_reach_is_refused_saying_why(
    run: Run, east: KubeApiServer, store: DynamoJobStore
) -> None:
    east.stop()  # its endpoint refuses connections, as one with no route from the stack's network
    try:
        result = run("cluster", "add", "east")
    finally:
        east.start()
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cluster east cannot be reached from the stack's network: cluster east "
                                     "cannot be reached: connection refused"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    recorded = store.get_cluster("east")
    assert recorded is not None and recorded.setup is ClusterSetup.FAILED
    run("cluster", "remove", "east")


def test_naming_the_stacks_own_cluster_records_its_labels_only(run: Run, local_stack: LocalStack,
                                                                store: DynamoJobStore) -> None:
    result = run("cluster", "add", "local", "--label", "env=dev")
    assert result.exit_code == 0, result.output
    assert "this stack's own cluster" in result.stdout
    own = store.get_cluster("local")
    assert own is not None and dict(own.labels) == {"env": "dev"} and own.endpoint == ""
    listed = run("cluster", "list", "-o", "json")
    assert json.loads(listed.stdout)[0]["name"] == "local" and json.loads(listed.stdout)[0]["labels"] == {
        "env": "dev"}
    removed = run("cluster", "remove", "local")
    assert removed.exit_code == 0 and "it stays served" in removed.stdout
    assert store.get_cluster("local") is None


def test_list_shows_the_own_cluster_first_then_each_with_its_recorded_or_live_health(
    run: Run, east: KubeApiServer, store: DynamoJobStore
) -> None:
    assert run("cluster", "add", "east", "--label", "env=prod").exit_code == 0
    store.record_cluster_check("east", reachable=False, reason="connection refused", checked_at=1.0)

    recorded = run("cluster", "list")
    lines = recorded.stdout.splitlines()
    assert recorded.exit_code == 1  # a cluster is unreachable
    assert lines[0].split() == ["NAME", "LABELS", "SETUP", "API", "AGENTS", "CHECKED", "LAST", "SYNC", "MESSAGE"]
    assert lines[1].split()[:5] == ["local", "(own)", "none", "-", "unknown"]
    assert lines[2].split()[:5] == ["east", "env=prod", "Installed", "unreachable", "0"]
    assert lines[2].endswith("connection refused")

    live = run("cluster", "list", "--check", "-o", "json")
    by_name = {c["name"]: c for c in json.loads(live.stdout)}
    assert by_name["east"]["reachable"] is True and by_name["east"]["live"] is True
    assert by_name["east"]["agentPods"] == "0/0"
    run("cluster", "remove", "east")


def test_remove_undoes_add_and_marks_the_clusters_jobs_for_deletion(
    run: Run, east: KubeApiServer, local_stack: LocalStack, store: DynamoJobStore
) -> None:
    assert run("cluster", "add", "east").exit_code == 0
    apply_manifest(store, job_doc("east-job"), now=1.0, cluster="east")
    apply_manifest(store, job_doc("own-job"), now=1.0)

    removed = run("cluster", "remove", "east")

    assert removed.exit_code == 0, removed.output
    assert removed.stdout.splitlines()[0] == "1 job of cluster east marked for deletion"
    assert removed.stdout.splitlines()[-1] == "cluster/east removed (0 node registrations forgotten)"
    assert store.get_job("east:default/east-job").state is JobState.DELETING  # type: ignore[union-attr]
    assert store.get_job("default/own-job").state is not JobState.DELETING  # type: ignore[union-attr]
    assert eks(local_stack).list_access_entries(clusterName="east")["accessEntries"] == []
    assert east.get_object("daemonsets", AGENT_NAME, AGENT_NAMESPACE) is None
    assert store.get_cluster("east") is None
    # Removing it again says it is not there
    again = run("cluster", "remove", "east")
    assert again.exit_code == 1 and 'cluster "east" is not registered' in again.stderr
    # The package's other tests share the table: the control plane's half of the delete, done here
    for key in ("east:default/east-job", "default/own-job"):
        store.delete_job(key)
