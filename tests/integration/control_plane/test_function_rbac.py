"""Each function calls the Kubernetes API as its own role, with exactly the RBAC `prewarm install` ships.

As local mode sets it up (`grant_cluster_access`): template.yaml's `AWS::EKS::AccessEntry` resources
give each function role its groups in the embedded API, `prewarm install` binds those groups, and
every function signs its EKS token with its own role's key. Each function does its job through its
real handler, and is refused one verb outside what it needs with the API server's 403.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.eks_auth import EksTokenSource
from prewarm.adapters.kube import KubeCluster
from prewarm.domain.boot import CONDITION_TYPE, NONE_REQUIRED, label_patch
from prewarm.domain.messages import Hello
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import ClusterAuthError, ClusterError
from prewarm_cli.install.render import FUNCTION_GROUPS
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.localinstall import grant_cluster_access
from prewarm_devtools.sam.aws import ACCOUNT, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from prewarm_devtools.sam.template import ROOT

pytestmark = pytest.mark.integration

CREDENTIALS = {"registries": [{"account": ACCOUNT, "region": "us-west-2"}], "namespaces": ["ml"]}
NODE = "ip-10-0-27-143.us-west-2.compute.internal"


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_from_file(ROOT / "samplefiles" / "cluster.yaml")
        stack = LocalStack(aws.url, stack_name=f"rbac-{uuid.uuid4().hex[:6]}",
                           parameters={"ClusterName": "local", "KubeApiEndpoint": api.url,
                                       "ClusterAccess": "access-entries",
                                       "CredentialsConfig": json.dumps(CREDENTIALS)}).deploy()
        grant_cluster_access(api, stack, agent_token="agent-token",
                             agent_role_arn=f"arn:aws:iam::{ACCOUNT}:role/agents", credentials_config=CREDENTIALS)
        stack.prime_streams()
        yield {"stack": stack, "api": api, "aws": aws,
               "store": DynamoJobStore(stack.env()["TABLE_NAME"], client=aws.client("dynamodb"))}


def as_function(env: dict[str, Any], logical_id: str) -> KubeCluster:
    """The embedded API as the function's role signs for it: an EKS token made with the role's key."""
    identity = env["stack"].functions[logical_id].identity
    session = boto3.session.Session(aws_access_key_id=identity.access_key_id,
                                    aws_secret_access_key=identity.secret_access_key, region_name="us-west-2")
    return KubeCluster(env["api"].url, EksTokenSource("local", session))


def test_the_template_gives_each_function_role_the_groups_install_binds(env: dict[str, Any]) -> None:
    outputs = env["stack"].outputs()
    by_setting = {"DISPATCH_JOB_ROLE_ARN": "DispatchJobRoleArn", "RECORD_STATUS_ROLE_ARN": "RecordStatusRoleArn",
                  "SWEEP_ROLE_ARN": "SweepRoleArn",
                  "REFRESH_ECR_CREDENTIALS_ROLE_ARN": "RefreshEcrCredentialsRoleArn",
                  "SYNC_RESOURCES_ROLE_ARN": "SyncResourcesRoleArn",
                  "BAKE_SNAPSHOTS_ROLE_ARN": "BakeSnapshotsRoleArn", "RUN_CRON_JOB_ROLE_ARN": "RunCronJobRoleArn"}

    assert env["stack"].access_entries() == {outputs[by_setting[k]]: groups for k, groups in FUNCTION_GROUPS.items()}


def test_dispatch_job_selects_nodes_and_reads_the_jobs_pull_secret(env: dict[str, Any]) -> None:
    job = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
           "metadata": {"name": "rbac-web", "namespace": "shop"},
           "spec": {"image": "nginx:1.27", "pullSecrets": ["ecr-pull"], "parallelism": 2}}
    apply_manifest(env["store"], job, now=1.0)

    env["stack"].run_until_idle()

    view = view_job(env["store"], "shop", "rbac-web", now=0)
    assert (view.desired, view.active, len(view.excluded)) == (10, 2, 2), view.message
    mirrors = env["aws"].client("secretsmanager").list_secrets()["SecretList"]
    assert [m["Description"] for m in mirrors] == ["prewarm mirror of image pull secret shop/ecr-pull"]


def test_record_status_reads_a_hellos_node(env: dict[str, Any]) -> None:
    e = env["stack"].env()
    env["aws"].client("sqs").send_message(QueueUrl=e["STATUS_QUEUE_URL"],
                                          MessageBody=Hello(node=NODE, architecture="amd64").model_dump_json())

    env["stack"].run_until_idle()

    assert NODE in {n.name for n in env["store"].list_nodes()}


def test_sweep_lists_the_nodes(env: dict[str, Any]) -> None:
    result = env["stack"].fire("sweep")

    assert "error" not in json.dumps(result).lower()


def test_refresh_writes_the_pull_secret_into_its_target_namespace(env: dict[str, Any]) -> None:
    env["stack"].fire("refresh_ecr_credentials")

    secret = env["api"].get_object("secrets", "prewarm-ecr", "ml")
    assert secret is not None and secret["type"] == "kubernetes.io/dockerconfigjson"
    account = env["api"].get_object("serviceaccounts", "default", "ml")
    assert {"name": "prewarm-ecr"} in account["imagePullSecrets"]


@pytest.mark.parametrize(("function", "call", "refused"), [
    ("DispatchJobFunction", lambda c: c.delete_object("v1", "nodes", NODE),
     'cannot delete resource "nodes" in API group "" at the cluster scope'),
    ("RecordStatusFunction", lambda c: c.get_secret("shop", "ecr-pull"),
     'cannot get resource "secrets" in API group "" in the namespace "shop"'),
    ("SweepFunction", lambda c: c.list_namespaces(),
     'cannot list resource "namespaces" in API group "" at the cluster scope'),
    ("RefreshEcrCredentialsFunction", lambda c: c.list_nodes(),
     'cannot list resource "nodes" in API group "" at the cluster scope'),
    ("RunCronJobFunction", lambda c: c.list_objects("prewarm.dev/v1alpha1", "imagelistpulljobs"),
     'cannot list resource "imagelistpulljobs" in API group "prewarm.dev" at the cluster scope'),
])
def test_each_function_is_refused_one_verb_outside_its_rbac(env: dict[str, Any], function: str, call: Any,
                                                            refused: str) -> None:
    role = env["stack"].functions[function].identity.arn.rsplit("/", 1)[1]

    with as_function(env, function) as cluster, pytest.raises(ClusterAuthError) as caught:
        call(cluster)

    assert f'"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/' in str(caught.value)
    assert refused in str(caught.value)


def test_record_status_sets_a_nodes_warm_condition_and_may_change_no_other(env: dict[str, Any]) -> None:
    # Given a node's first hello (no Never job selects it: nothing is required of it)
    node = "ip-10-0-109-55.us-west-2.compute.internal"
    e = env["stack"].env()
    env["aws"].client("sqs").send_message(QueueUrl=e["STATUS_QUEUE_URL"],
                                          MessageBody=Hello(node=node, architecture="amd64").model_dump_json())

    env["stack"].run_until_idle()

    # Then record_status set its PrewarmWarm condition, through the status subresource, as its own role
    conditions = {c["type"]: c for c in env["api"].get_object("nodes", node)["status"]["conditions"]}
    assert (conditions[CONDITION_TYPE]["status"], conditions[CONDITION_TYPE]["reason"]) == ("True", NONE_REQUIRED)
    assert conditions["Ready"]["status"] == "True"
    # And the admission policy refuses it any other condition
    ready = {"type": "Ready", "status": "False", "reason": "Forged"}
    with as_function(env, "RecordStatusFunction") as cluster, pytest.raises(ClusterError) as caught:
        cluster.patch_node_status(node, {"status": {"conditions": [ready]}})
    assert "Prewarm may set only the PrewarmWarm condition of a node" in str(caught.value)


def test_record_status_may_set_a_rules_node_label_and_no_other_label(env: dict[str, Any]) -> None:
    # Given a node, and record_status's role (groups prewarm-startup-taint and prewarm-node-warm)
    node = "ip-10-0-109-55.us-west-2.compute.internal"
    with as_function(env, "RecordStatusFunction") as cluster:
        seen = cluster.get_node(node)
        assert seen is not None
        # When it sets a rule's node label, then removes it
        ops = label_patch(seen, "prewarm.dev/torch", True)
        assert ops is not None
        cluster.patch_node(node, ops)
        assert env["api"].get_object("nodes", node)["metadata"]["labels"]["prewarm.dev/torch"] == "true"
        removal = label_patch(env["api"].get_object("nodes", node), "prewarm.dev/torch", False)
        assert removal is not None
        cluster.patch_node(node, removal)
        assert "prewarm.dev/torch" not in env["api"].get_object("nodes", node)["metadata"]["labels"]
        # Then any other label is refused by the admission policy
        with pytest.raises(ClusterError) as caught:
            cluster.patch_node(node, [{"op": "add", "path": "/metadata/labels/pool", "value": "stolen"}])
    assert 'Prewarm may only set or remove node labels valued "true"' in str(caught.value)
