"""KEP-2535 and own pull secrets through the CLI, against the embedded Kubernetes API as the cluster:
`describe job` reads the job's nodes' kubelet policies through the node proxy (RBAC enforced), the doctor's
check reads every node's, and `apply` refuses a pullSecretsOnly job whose secret is missing."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from prewarm.adapters.kube import KubeCluster
from prewarm_cli.doctor.checks import check_image_credentials
from prewarm_cli.kubelets import read_policies
from prewarm_devtools.kubeapi import Identity, KubeApiServer
from tests.support.cli import Run
from tests.support.control_plane import ControlPlane
from tests.support.kube import binding, call, node, role, rule, subject
from tests.support.manifests import NODES

pytestmark = pytest.mark.integration

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/app:v1"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.seed_objects([node(n) for n in NODES] + [{"kind": "Namespace", "metadata": {"name": "team-a"}}])
        server.set_image_credentials_policy("node-a", "NeverVerifyPreloadedImages")
        server.set_image_credentials_policy("node-b", "AlwaysVerify")
        server.add_identity("alice", Identity("alice"))
        yield server


def kubeconfig(api: KubeApiServer, tmp_path: Path, token: str | None = None) -> str:
    config = api.kubeconfig()
    config["users"][0]["user"]["token"] = token or api.token
    path = tmp_path / f"kubeconfig-{uuid.uuid4().hex[:6]}"
    import yaml

    path.write_text(yaml.safe_dump(config))
    return str(path)


def planned_job(prewarm: Run, control_plane: ControlPlane, image: str, **spec: str) -> str:
    name = f"creds-{uuid.uuid4().hex[:6]}"
    extra = "".join(f"\n  {k}: {v}" for k, v in spec.items())
    manifest = textwrap.dedent(f"""\
        apiVersion: apps.kruise.io/v1alpha1
        kind: ImagePullJob
        metadata: {{name: {name}}}
        spec:
          image: {image}
          parallelism: 3
          selector: {{names: [node-a, node-b, node-c]}}""") + extra
    assert prewarm("apply", "-f", "-", input=manifest).exit_code == 0
    control_plane.plan(name)
    return name


def test_describe_warns_of_nodes_where_any_pod_may_use_a_shared_credential_warm(
        prewarm: Run, control_plane: ControlPlane, api: KubeApiServer, tmp_path: Path) -> None:
    name = planned_job(prewarm, control_plane, ECR_IMAGE)

    result = prewarm("describe", "job", name, "--kubeconfig", kubeconfig(api, tmp_path))

    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert ("  Pulled With:       shared credentials (the agents' registry copy or role, which every job may "
            "use)") in text
    assert ("  Kubelet Policies:  NeverVerifyPreloadedImages on node-a; AlwaysVerify on node-b; not enforced (kubelet "
            "before 1.35, or feature gate KubeletEnsureSecretPulledImages off) on node-c") in text
    assert ("  Warning:           any pod on 2 of 3 nodes (node-a, node-c) may use this image without credentials of "
            "its own") in text


def test_describe_names_the_nodes_it_may_not_read(prewarm: Run, control_plane: ControlPlane, api: KubeApiServer,
                                                 tmp_path: Path) -> None:
    name = planned_job(prewarm, control_plane, ECR_IMAGE)

    result = prewarm("describe", "job", name, "--kubeconfig", kubeconfig(api, tmp_path, "alice"))

    assert result.exit_code == 0, result.stderr
    assert ("  Not Read:          3 nodes (node-a, node-b, node-c: forbidden: no get on nodes/proxy): grant `get` on "
            "`nodes/proxy`") in result.stdout


def test_a_public_image_reads_no_node(prewarm: Run, control_plane: ControlPlane, api: KubeApiServer,
                                      tmp_path: Path) -> None:
    name = planned_job(prewarm, control_plane, "busybox:1.36")

    result = prewarm("describe", "job", name, "--kubeconfig", kubeconfig(api, tmp_path, "alice"))

    assert "  Pulled With:       no credentials (no pull secrets, not a private ECR image)" in result.stdout
    assert "Kubelet Policies" not in result.stdout


def test_the_doctors_check_reads_every_node_and_needs_nodes_proxy(api: KubeApiServer) -> None:
    with KubeCluster(api.url, token_source=lambda: "alice") as alice:
        found = read_policies(alice, NODES)
        assert found.unreadable == dict.fromkeys(NODES, "forbidden: no get on nodes/proxy")
        # The RBAC docs/credentials.md gives the operator
        with api.api_client() as client:
            for obj in (role("prewarm-doctor", [rule(["nodes/proxy"], ["get"])]),
                        binding("prewarm-doctor", "prewarm-doctor", [subject("User", "alice")])):
                plural = obj["kind"].lower() + "s"
                assert call(client, "POST", f"/apis/rbac.authorization.k8s.io/v1/{plural}", body=obj).status == 201
        found = read_policies(alice, NODES)
    result = check_image_credentials(["job default/web"], [ECR_IMAGE], found)
    assert result.warning and "any pod of 2 of 3 nodes may use them" in result.detail


def test_apply_refuses_pull_secrets_only_without_the_secret_and_applies_it_once_there(
        prewarm: Run, api: KubeApiServer, tmp_path: Path) -> None:
    name = f"own-{uuid.uuid4().hex[:6]}"
    manifest = textwrap.dedent(f"""\
        apiVersion: prewarm.dev/v1alpha1
        kind: ImagePullJob
        metadata: {{name: {name}, namespace: team-a}}
        spec:
          image: {ECR_IMAGE}
          pullSecrets: [team-a-ecr]
          pullSecretsOnly: true
        """)
    config = kubeconfig(api, tmp_path)

    refused = prewarm("apply", "-f", "-", "--kubeconfig", config, input=manifest)

    assert refused.exit_code == 2
    assert refused.stderr == (f"error: <stdin> document 1 (ImagePullJob team-a/{name}): spec.pullSecrets[0]: secret "
                              '"team-a-ecr" not found in namespace "team-a": spec.pullSecretsOnly pulls with these '
                              "secrets only; create it first\n")
    api.seed_objects([{"kind": "Secret", "metadata": {"name": "team-a-ecr", "namespace": "team-a"},
                       "type": "kubernetes.io/dockerconfigjson",
                       "data": {".dockerconfigjson": "eyJhdXRocyI6IHt9fQ=="}}])
    applied = prewarm("apply", "-f", "-", "--kubeconfig", config, input=manifest)
    assert (applied.exit_code, applied.stdout) == (0, f"imagepulljob.apps.kruise.io/{name} created\n")
