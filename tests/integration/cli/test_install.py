"""`prewarm install` and `uninstall` through the CLI: rendered from a stack's outputs, applied into the
embedded Kubernetes API as the operator (an EKS token from the operator's AWS credentials), idempotent,
pruning, and removed again without touching anything else."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from click.testing import CliRunner

from prewarm_cli.app import cli
from prewarm_cli.install.apply import DIGEST_ANNOTATION
from prewarm_cli.install.render import KIND_PLURALS
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.stack import LocalStack
from tests.integration.cli.conftest import cli_on

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::123456789012:role/prewarm-agents"
CREDENTIALS = {"registries": [{"account": "123456789012", "region": "us-west-2"}], "namespaces": ["ml"]}
OUTPUTS = {
    "JobsTableName": "pw-JobsTable", "StatusQueueUrl": "https://sqs.us-west-2.amazonaws.com/123456789012/pw-Status",
    "NodeQueuePrefix": "pw-node", "NodeDLQArn": "arn:aws:sqs:us-west-2:123456789012:pw-NodeDLQ",
    "SecretPrefix": "prewarm/pw", "NodeQueueSenderArns": "arn:aws:iam::123456789012:role/pw-DispatchJobRole",
    "ClusterName": "my-cluster", "AgentRoleArn": ROLE,
}


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.seed_from_file(Path(__file__).resolve().parents[3] / "samplefiles" / "cluster.yaml")
        yield server


@pytest.fixture
def run(api: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`prewarm --local ARGS` against a local state whose stack settings name the embedded API."""
    env = {"TABLE_NAME": "pw-JobsTable", "STATUS_QUEUE_URL": OUTPUTS["StatusQueueUrl"], "NODE_QUEUE_PREFIX": "pw-node",
           "NODE_DLQ_ARN": OUTPUTS["NodeDLQArn"], "SECRET_PREFIX": "prewarm/pw", "CLUSTER_NAME": "local",
           "KUBE_API_ENDPOINT": api.url, "AGENT_ROLE_ARN": ROLE, "CREDENTIALS_CONFIG": json.dumps(CREDENTIALS),
           "NODE_QUEUE_SENDER_ARNS": OUTPUTS["NodeQueueSenderArns"]}
    state = write_local_state(LocalState("http://127.0.0.1:9", "us-west-2", env, pid=os.getpid()), tmp_path / "s.json")
    return cli_on(state, monkeypatch)


def installed(api: KubeApiServer) -> dict[tuple[str, str, str], dict[str, Any]]:
    found = {}
    for _, plural, _ in KIND_PLURALS.values():
        for obj in api.list_objects(plural):
            if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "prewarm-install":
                found[(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace", ""))] = obj
    return found


def rendered(run: Any, *args: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(run("install", "--render", *args).stdout))


def test_install_creates_every_rendered_object_then_a_rerun_changes_nothing(api: KubeApiServer, run: Any) -> None:
    first = run("install", "--pull-secret-namespaces", "shop")
    versions = {k: o["metadata"]["resourceVersion"] for k, o in installed(api).items()}
    second = run("install", "--pull-secret-namespaces", "shop")

    assert first.exit_code == 0, first.output
    assert len(first.stdout.splitlines()) == len(versions) == len(rendered(run, "--pull-secret-namespaces", "shop"))
    assert all(line.split(" ")[1] == "created" for line in first.stdout.splitlines())
    assert "daemonset.apps/prewarm-agent created (namespace prewarm-system)" in first.stdout
    assert "rolebinding.rbac.authorization.k8s.io/prewarm-pull-secrets created (namespace shop)" in first.stdout
    assert second.exit_code == 0 and all(line.split(" ")[1] == "unchanged" for line in second.stdout.splitlines())
    assert {k: o["metadata"]["resourceVersion"] for k, o in installed(api).items()} == versions


def test_installed_objects_match_the_render_and_the_daemonset_is_served(api: KubeApiServer, run: Any) -> None:
    docs = rendered(run, "--pull-secret-namespaces", "shop")
    run("install", "--pull-secret-namespaces", "shop")
    objects = installed(api)

    assert sorted(objects) == sorted((o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""))
                                     for o in docs)
    for doc in docs:
        obj = objects[(doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", ""))]
        assert obj["metadata"]["labels"].items() >= doc["metadata"]["labels"].items()
        assert DIGEST_ANNOTATION in obj["metadata"]["annotations"]
        for key in ("rules", "subjects", "roleRef", "data", "value"):
            assert obj.get(key) == doc.get(key)
    daemonset = objects[("DaemonSet", "prewarm-agent", "prewarm-system")]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == "prewarm-agent:local"
    assert daemonset["metadata"]["generation"] == 1


def test_a_changed_option_reconfigures_and_prunes_what_is_no_longer_wanted(api: KubeApiServer, run: Any) -> None:
    run("install", "--pull-secret-namespaces", "shop,ml")

    result = run("install", "--pull-secret-namespaces", "ml", "--registry-allowlist", "ghcr.io")

    assert result.exit_code == 0, result.output
    assert "configmap/prewarm-agent configured (namespace prewarm-system)" in result.stdout
    assert "rolebinding.rbac.authorization.k8s.io/prewarm-pull-secrets deleted (namespace shop)" in result.stdout
    assert "rolebinding.rbac.authorization.k8s.io/prewarm-pull-secrets unchanged (namespace ml)" in result.stdout
    assert api.get_object("rolebindings", "prewarm-pull-secrets", "shop") is None
    assert api.get_object("configmaps", "prewarm-agent", "prewarm-system")["data"]["REGISTRY_ALLOWLIST"] == "ghcr.io"


def test_uninstall_removes_what_install_made_and_nothing_else(api: KubeApiServer, run: Any) -> None:
    before = {(p, o["metadata"]["name"]) for p in ("clusterroles", "namespaces") for o in api.list_objects(p)}
    run("install", "--pull-secret-namespaces", "shop")

    removed = run("uninstall")
    crds = run("uninstall", "--crds")
    again = run("uninstall")

    kept = [d for d in rendered(run, "--pull-secret-namespaces", "shop") if d["kind"] == "CustomResourceDefinition"]
    assert removed.exit_code == 0
    assert len(removed.stdout.splitlines()) == len(rendered(run, "--pull-secret-namespaces", "shop")) - len(kept)
    assert "CustomResourceDefinitions and their resources were kept" in removed.stderr
    assert sorted(crds.stdout.splitlines()) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{d['metadata']['name']} deleted" for d in kept)
    assert removed.stdout.splitlines()[0] == "daemonset.apps/prewarm-agent deleted (namespace prewarm-system)"
    assert installed(api) == {}
    assert {(p, o["metadata"]["name"]) for p in ("clusterroles", "namespaces") for o in api.list_objects(p)} == before
    assert again.exit_code == 0 and "No resources found" in again.stdout


def test_an_api_refusal_is_one_error_line_naming_the_api(api: KubeApiServer, run: Any) -> None:
    api.stop()

    result = run("install")

    assert result.exit_code == 1
    assert result.stderr.startswith("error: Kubernetes API: ")


def test_bad_options_are_usage_errors_naming_them(run: Any) -> None:
    result = run("install", "--pull-secret-namespaces", "Shop", "--render")

    assert result.exit_code == 2
    assert "--pull-secret-namespaces: 'Shop'" in result.stderr


def test_a_deployed_stacks_outputs_and_parameters_fill_in_the_render(
    local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto's CloudFormation keeps a stack's outputs and parameters: a stack of one resource stands in
    # for Prewarm's, with the outputs and parameters install reads. The package's moto server, not
    # mock_aws: that would reset the backends the server shares with this process.
    for name, value in {"AWS_DEFAULT_REGION": "us-west-2", "AWS_ENDPOINT_URL": local_stack.endpoint_url,
                        "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}.items():
        monkeypatch.setenv(name, value)
    for name in (ENDPOINT_ENV, STACK_ENV, STATE_ENV):
        monkeypatch.delenv(name, raising=False)
    template = {
        "Parameters": {"CredentialsConfig": {"Type": "String"}},
        "Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {k: {"Value": v} for k, v in OUTPUTS.items()},
    }
    boto3.client("cloudformation", region_name="us-west-2").create_stack(
        StackName="pw-install", TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": "CredentialsConfig", "ParameterValue": json.dumps(CREDENTIALS)}])

    result = CliRunner().invoke(cli, ["install", "--stack", "pw-install", "--render", "--image", "repo/agent:1"],
                                catch_exceptions=False)
    default = CliRunner().invoke(cli, ["install", "--stack", "pw-install", "--render"], catch_exceptions=False)

    assert result.exit_code == 0, result.output
    docs = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")): d
            for d in yaml.safe_load_all(result.stdout)}
    config = docs[("ConfigMap", "prewarm-agent", "prewarm-system")]["data"]
    assert (config["AWS_REGION"], config["STATUS_QUEUE_URL"]) == ("us-west-2", OUTPUTS["StatusQueueUrl"])
    account = docs[("ServiceAccount", "prewarm-agent", "prewarm-system")]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == ROLE
    assert ("RoleBinding", "prewarm-credentials", "ml") in docs
    # Without --image: the agent image of the CLI's own version, in the stack account's ECR
    assert default.exit_code == 0, default.output
    (daemon_set,) = [d for d in yaml.safe_load_all(default.stdout) if d["kind"] == "DaemonSet"]
    assert daemon_set["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"123456789012.dkr.ecr.us-west-2.amazonaws.com/prewarm-agent:{version('prewarm')}")
