"""dispatch_job reads the agent DaemonSet as its own role, with exactly the RBAC `prewarm install` ships,
and leaves out the nodes the DaemonSet puts no agent on; without that read it selects as before and the
job's message says so.

The sample cluster on the embedded API: two GPU nodes tainted `nvidia.com/gpu=true:NoSchedule`, a
Fargate node, an unreachable node, the rest general amd64 and arm64 nodes.
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
from prewarm.domain.registry_budget import LAYERS_IF_UNKNOWN, assumed_layers_note
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.ports import ClusterAuthError
from prewarm_cli.install.render import AGENT_NAME, AGENT_NAMESPACE
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.localinstall import grant_cluster_access
from prewarm_devtools.sam.aws import ACCOUNT, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from prewarm_devtools.sam.template import ROOT

# The jobs' Docker Hub image: its registry's budget costs each pull at the assumed layer count, and says so.
LAYERS = assumed_layers_note("docker.io", LAYERS_IF_UNKNOWN)
pytestmark = pytest.mark.integration

CREDENTIALS = {"registries": [{"account": ACCOUNT, "region": "us-west-2"}], "namespaces": ["ml"]}
GPU = ("ip-10-0-127-36.us-west-2.compute.internal", "ip-10-0-35-56.us-west-2.compute.internal")
ARM = ("ip-10-0-171-179.us-west-2.compute.internal", "ip-10-0-184-152.us-west-2.compute.internal",
       "ip-10-0-55-77.us-west-2.compute.internal")
NO_AGENT = "no agent runs here"


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_from_file(ROOT / "samplefiles" / "cluster.yaml")
        stack = LocalStack(aws.url, stack_name=f"agents-{uuid.uuid4().hex[:6]}",
                           parameters={"ClusterName": "local", "KubeApiEndpoint": api.url,
                                       "ClusterAccess": "access-entries",
                                       "CredentialsConfig": json.dumps(CREDENTIALS)}).deploy()
        grant_cluster_access(api, stack, agent_token="agent-token",
                             agent_role_arn=f"arn:aws:iam::{ACCOUNT}:role/agents", credentials_config=CREDENTIALS)
        stack.prime_streams()
        with KubeCluster(api.url, lambda: api.token) as admin:
            yield {"stack": stack, "api": api, "admin": admin,
                   "store": DynamoJobStore(stack.env()["TABLE_NAME"], client=aws.client("dynamodb"))}


def as_dispatch(env: dict[str, Any]) -> KubeCluster:
    """The embedded API as dispatch_job's role signs for it."""
    identity = env["stack"].functions["DispatchJobFunction"].identity
    session = boto3.session.Session(aws_access_key_id=identity.access_key_id,
                                    aws_secret_access_key=identity.secret_access_key, region_name="us-west-2")
    return KubeCluster(env["api"].url, EksTokenSource("local", session))


def plan(env: dict[str, Any], name: str, **spec: Any) -> Any:
    job = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
           "metadata": {"name": name, "namespace": "shop"}, "spec": {"image": "nginx:1.27", **spec}}
    apply_manifest(env["store"], job, now=1.0)
    env["stack"].run_until_idle()
    return view_job(env["store"], "shop", name, now=0)


def edit_daemon_set(env: dict[str, Any], **pod_spec: Any) -> dict[str, Any]:
    """Replace fields of the installed DaemonSet's pod template, as `kubectl edit` would; returns the old one."""
    admin: KubeCluster = env["admin"]
    daemon_set = admin.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    assert daemon_set is not None
    old = json.loads(json.dumps(daemon_set))
    daemon_set["spec"]["template"]["spec"].update(pod_spec)
    admin.replace_object("apps/v1", "daemonsets", AGENT_NAME, daemon_set, AGENT_NAMESPACE)
    return old


def restore(env: dict[str, Any], old: dict[str, Any]) -> None:
    admin: KubeCluster = env["admin"]
    current = admin.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE)
    assert current is not None
    old["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    admin.replace_object("apps/v1", "daemonsets", AGENT_NAME, old, AGENT_NAMESPACE)


def test_the_shipped_daemonset_leaves_out_no_linux_node(env: dict[str, Any]) -> None:
    view = plan(env, "shipped", parallelism=2)

    # Only what was left out before: the Fargate node (virtual-kubelet) and the unreachable node
    assert (view.desired, len(view.excluded)) == (10, 2), view.message
    assert view.message == f"job is running, progress 0.0%; {LAYERS}"


def test_dispatch_leaves_out_the_nodes_outside_the_daemonsets_selector_affinity_and_tolerations(
        env: dict[str, Any]) -> None:
    # Given agents kept to amd64 nodes by node affinity, tolerating no GPU taint
    old = edit_daemon_set(env, tolerations=[{"key": "dedicated", "operator": "Exists"}], affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}})
    try:
        view = plan(env, "amd64-only", parallelism=2)
    finally:
        restore(env, old)

    # Then the arm64 and GPU nodes are excluded, each with the reason no agent runs there
    reasons = {e.name: e.reason for e in view.excluded}
    assert {n: reasons[n] for n in ARM} == {
        n: f"outside the agent DaemonSet's node affinity (kubernetes.io/arch In [amd64]): {NO_AGENT}" for n in ARM}
    assert {n: reasons[n] for n in GPU} == {
        n: f"taint nvidia.com/gpu=true:NoSchedule not tolerated by the agent DaemonSet: {NO_AGENT}" for n in GPU}
    assert view.desired == 5 and view.message == f"job is running, progress 0.0%; {LAYERS}"


def test_a_named_node_outside_the_daemonset_gets_its_reason_as_the_jobs_message(env: dict[str, Any]) -> None:
    old = edit_daemon_set(env, nodeSelector={"eks.amazonaws.com/nodegroup": "general-amd64"})
    try:
        view = plan(env, "named-gpu", selector={"names": [GPU[0]]})
    finally:
        restore(env, old)

    assert view.desired == 0
    assert view.message == (f"job has completed; named node {GPU[0]} excluded: outside the agent DaemonSet's "
                            f"nodeSelector (eks.amazonaws.com/nodegroup=general-amd64): {NO_AGENT}; {LAYERS}")


def test_dispatch_may_get_the_agent_daemonset_and_nothing_near_it(env: dict[str, Any]) -> None:
    with as_dispatch(env) as cluster:
        assert cluster.get_object("apps/v1", "daemonsets", AGENT_NAME, AGENT_NAMESPACE) is not None
        for refused, call in [
            ('cannot list resource "daemonsets" in API group "apps" in the namespace "prewarm-system"',
             lambda: cluster.list_objects("apps/v1", "daemonsets", AGENT_NAMESPACE)),
            ('cannot get resource "daemonsets" in API group "apps" in the namespace "kube-system"',
             lambda: cluster.get_object("apps/v1", "daemonsets", AGENT_NAME, "kube-system")),
            ('cannot get resource "daemonsets" in API group "apps" in the namespace "prewarm-system"',
             lambda: cluster.get_object("apps/v1", "daemonsets", "aws-node", AGENT_NAMESPACE)),
            ('cannot update resource "daemonsets" in API group "apps" in the namespace "prewarm-system"',
             lambda: cluster.replace_object("apps/v1", "daemonsets", AGENT_NAME, {}, AGENT_NAMESPACE)),
        ]:
            with pytest.raises(ClusterAuthError) as caught:
                call()
            assert refused in str(caught.value)


def test_without_the_rbac_to_read_the_daemonset_dispatch_selects_as_before_and_says_so(env: dict[str, Any]) -> None:
    # Given an install older than the stack: no binding lets the control plane read the DaemonSet
    admin: KubeCluster = env["admin"]
    binding = admin.get_object("rbac.authorization.k8s.io/v1", "rolebindings", "prewarm-control-plane-agents",
                               AGENT_NAMESPACE)
    assert binding is not None
    admin.delete_object("rbac.authorization.k8s.io/v1", "rolebindings", "prewarm-control-plane-agents", AGENT_NAMESPACE)
    old = edit_daemon_set(env, nodeSelector={"eks.amazonaws.com/nodegroup": "general-amd64"})
    try:
        view = plan(env, "unread", parallelism=2)
    finally:
        restore(env, old)
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            binding["metadata"].pop(key, None)
        admin.create_object("rbac.authorization.k8s.io/v1", "rolebindings", binding, AGENT_NAMESPACE)

    # Then every node is selected as before the check, and the job's message says why
    assert (view.desired, len(view.excluded)) == (10, 2)
    assert view.message == ("job is running, progress 0.0%; nodes without an agent not excluded: cannot read "
                            f"DaemonSet prewarm-system/prewarm-agent (Forbidden; run prewarm install); {LAYERS}")
