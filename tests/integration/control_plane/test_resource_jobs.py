"""Kubernetes-native jobs end to end: prewarm.dev resources in the embedded API, `sync_resources` run by the
stack as its own role with the RBAC `prewarm install` ships, jobs planned by `dispatch_job`, status back
on the resources, deletes, and Kubernetes RBAC deciding who may run jobs where.

moto's schedules never fire: the test fires `sync_resources` itself, as local mode's scheduler does.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.kube import KubeCluster
from prewarm.domain.jobs import JobState, job_key
from prewarm.domain.registry_budget import LAYERS_IF_UNKNOWN, assumed_layers_note
from prewarm.domain.sources import Source, source_of
from prewarm.services.ports import ClusterAuthError
from prewarm_cli.app import cli
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.localinstall import grant_cluster_access
from prewarm_devtools.sam.aws import ACCOUNT, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from prewarm_devtools.sam.template import ROOT
from tests.support.kubectl import kubectl_binary

pytestmark = pytest.mark.integration

API = "prewarm.dev/v1alpha1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
KUBECTL = kubectl_binary()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    # Over TLS, as local mode serves it: kubectl sends the kubeconfig's token over TLS only.
    with MotoServer() as aws, KubeApiServer(tls=True) as api, aws_environment(aws.url):
        api.seed_from_file(ROOT / "samplefiles" / "cluster.yaml")
        ca_data = base64.b64encode(str(api.ca_pem).encode()).decode()
        stack = LocalStack(aws.url, stack_name=f"res-{uuid.uuid4().hex[:6]}",
                           parameters={"ClusterName": "local", "KubeApiEndpoint": api.url, "KubeCaData": ca_data,
                                       "ClusterAccess": "access-entries"}).deploy()
        grant_cluster_access(api, stack, agent_token="agent-token",
                             agent_role_arn=f"arn:aws:iam::{ACCOUNT}:role/agents",
                             credentials_config={"registries": [{"account": ACCOUNT, "region": "us-west-2"}]})
        stack.prime_streams()
        state = LocalState.of_stack(stack, pid=os.getpid())
        state.env.update({"KUBE_API_ENDPOINT": api.url, "KUBE_CA_DATA": ca_data, "CLUSTER_NAME": "local"})
        path = write_local_state(state, tmp_path_factory.mktemp("state") / "local.json")
        admin = KubeCluster(api.url, lambda: api.token, ca_data=api.ca_pem)
        yield {"stack": stack, "api": api, "aws": aws, "admin": admin, "state": path,
               "store": DynamoJobStore(stack.env()["TABLE_NAME"], client=aws.client("dynamodb"))}
        admin.close()


def prewarm(env: dict[str, Any], *args: str, input: str | None = None) -> Any:
    environ = {STATE_ENV: str(env["state"]), ENDPOINT_ENV: "", STACK_ENV: ""}
    return CliRunner(env=environ).invoke(cli, ["--local", *args], input=input, catch_exceptions=False)


def job(name: str, namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "nginx:1.27", "parallelism": 2, **spec}}


def test_a_resource_runs_as_a_job_and_its_status_comes_back(env: dict[str, Any]) -> None:
    env["admin"].create_object(API, "imagepulljobs", job("res-web", pullSecrets=["ecr-pull"]), "shop")

    env["stack"].fire("sync_resources")
    env["stack"].run_until_idle()
    summary = env["stack"].fire("sync_resources")

    record = env["store"].get_job(job_key("shop", "res-web"))
    assert record is not None and source_of(record.manifest) is Source.RESOURCE
    status = env["admin"].get_object(API, "imagepulljobs", "res-web", "shop")["status"]
    assert (status["desired"], status["active"], status["observedGeneration"]) == (10, 2, 1)
    # ... its message the job's, with the note that its Docker Hub image is costed at the assumed layer count
    note = assumed_layers_note("docker.io", LAYERS_IF_UNKNOWN)
    assert status["nodes"]["pulling"] == 2 and status["message"] == f"job is running, progress 0.0%; {note}"
    assert summary["unchanged"] >= 1 and summary["applied"] == []


def test_get_jobs_shows_where_each_job_comes_from(env: dict[str, Any]) -> None:
    env["admin"].create_object(API, "imagepulljobs", job("res-listed"), "shop")
    env["stack"].fire("sync_resources")
    cli_job = ("apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\n"
               "metadata: {name: cli-listed, namespace: shop}\nspec: {image: 'redis:7'}\n")
    assert prewarm(env, "apply", "-f", "-", input=cli_job).exit_code == 0

    result = prewarm(env, "get", "jobs", "-n", "shop")

    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["NAME"][6] == "SOURCE"
    assert rows["res-listed"][6] == "resource" and rows["cli-listed"][6] == "cli"


def test_the_cli_is_refused_a_resources_job_and_says_how_to_change_it(env: dict[str, Any]) -> None:
    env["admin"].create_object(API, "imagepulljobs", job("res-owned"), "shop")
    env["stack"].fire("sync_resources")
    manifest = ("apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\n"
                "metadata: {name: res-owned, namespace: shop}\nspec: {image: 'redis:7'}\n")

    applied = prewarm(env, "apply", "-f", "-", input=manifest)
    deleted = prewarm(env, "delete", "job", "res-owned", "-n", "shop")

    assert applied.exit_code == 1 and "managed by its ImagePullJob resource (prewarm.dev/v1alpha1)" in applied.stderr
    assert deleted.exit_code == 1 and "change or delete it with kubectl" in deleted.stderr
    assert env["store"].get_job(job_key("shop", "res-owned")).manifest["spec"]["image"] == "nginx:1.27"


def test_apply_as_resource_writes_the_resource_and_the_sync_runs_it(env: dict[str, Any]) -> None:
    manifest = "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: as-res, namespace: shop}\n" \
               "spec: {image: 'redis:7', parallelism: 3}\n"

    first = prewarm(env, "apply", "--as-resource", "-f", "-", input=manifest)
    again = prewarm(env, "apply", "--as-resource", "-f", "-", input=manifest)
    env["stack"].fire("sync_resources")

    assert first.stdout == "imagepulljob.prewarm.dev/as-res created\n", first.output
    assert again.stdout == "imagepulljob.prewarm.dev/as-res unchanged\n"
    resource = env["admin"].get_object(API, "imagepulljobs", "as-res", "shop")
    # As written, with Kruise's defaults the CRD stores
    assert resource["spec"] == {"image": "redis:7", "parallelism": 3, "imagePullPolicy": "IfNotPresent",
                                "completionPolicy": {"type": "Always"},
                                "pullPolicy": {"backoffLimit": 3, "timeoutSeconds": 600}}
    assert env["store"].get_job(job_key("shop", "as-res")) is not None


def test_deleting_the_resource_deletes_the_job(env: dict[str, Any]) -> None:
    env["admin"].create_object(API, "imagepulljobs", job("res-gone"), "shop")
    env["stack"].fire("sync_resources")
    env["stack"].run_until_idle()

    env["admin"].delete_object(API, "imagepulljobs", "res-gone", "shop")
    summary = env["stack"].fire("sync_resources")
    marked = env["store"].get_job(job_key("shop", "res-gone"))
    env["stack"].run_until_idle()

    assert summary["deleted"] == ["ImagePullJob shop/res-gone"]
    assert marked is not None and marked.state == JobState.DELETING
    assert env["store"].get_job(job_key("shop", "res-gone")) is None


def test_who_may_create_jobs_in_a_namespace_uses_its_pull_secrets_and_no_other_namespaces(env: dict[str, Any]) -> None:
    # alice edits team-a only: the built-in edit role aggregates prewarm-jobs-edit; here it is bound directly.
    api, admin = env["api"], env["admin"]
    api.add_identity("alice-token", Identity("alice", ()))
    admin.create_object("v1", "namespaces", {"metadata": {"name": "team-a"}})
    admin.create_object("rbac.authorization.k8s.io/v1", "rolebindings", {
        "metadata": {"name": "alice-jobs", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "prewarm-jobs-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}, "team-a")

    with KubeCluster(api.url, lambda: "alice-token", ca_data=api.ca_pem) as alice:
        alice.create_object(API, "imagepulljobs", job("alice-job", "team-a", pullSecrets=["team-a-pull"]), "team-a")
        with pytest.raises(ClusterAuthError) as refused:
            alice.create_object(API, "imagepulljobs", job("steal", "shop", pullSecrets=["ecr-pull"]), "shop")

    assert 'cannot create resource "imagepulljobs" in API group "prewarm.dev" in the namespace "shop"' in str(
        refused.value)


def test_the_sync_function_may_not_create_jobs_itself(env: dict[str, Any]) -> None:
    import boto3

    from prewarm.adapters.eks_auth import EksTokenSource

    identity = env["stack"].functions["SyncResourcesFunction"].identity
    session = boto3.session.Session(aws_access_key_id=identity.access_key_id, aws_secret_access_key="local",
                                    region_name="us-west-2")
    with KubeCluster(env["api"].url, EksTokenSource("local", session), ca_data=env["api"].ca_pem) as sync, \
            pytest.raises(ClusterAuthError) as refused:
        sync.create_object(API, "imagepulljobs", job("by-sync"), "shop")

    assert 'cannot create resource "imagepulljobs" in API group "prewarm.dev"' in str(refused.value)


def test_kubectl_applies_a_kruise_manifest_with_only_its_api_version_changed(env: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    kubeconfig = env["api"].write_kubeconfig(tmp_path / "config")
    manifest = tmp_path / "job.yaml"
    sample = (ROOT / "samplefiles" / "jobs").glob("*.yaml")
    kruise = next(p for p in sorted(sample) if "kind: ImagePullJob" in p.read_text())
    doc = yaml.safe_load(re.sub(r"apps\.kruise\.io/v1\w+", API, kruise.read_text()))
    doc["metadata"]["namespace"] = "shop"
    manifest.write_text(yaml.safe_dump(doc))

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), *args],
                              capture_output=True, text=True, timeout=60, check=False)

    applied = kubectl("apply", "-f", str(manifest))
    env["stack"].fire("sync_resources")
    listed = kubectl("get", "imagepulljobs", "-A")

    assert applied.returncode == 0, applied.stderr
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[0].split() == ["NAMESPACE", "NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED",
                                                    "AGE", "MESSAGE"]
    assert json.loads(kubectl("get", "imagepulljobs", "-A", "-o", "json").stdout)["items"]


def kubectl_in(env: dict[str, Any], tmp_path: Path) -> Any:
    kubeconfig = env["api"].write_kubeconfig(tmp_path / "config")

    def kubectl(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                               *args], input=input, capture_output=True, text=True, timeout=60, check=False)

    return kubectl


# Each bad manifest kubectl apply meets, and what the API server answers (the CRD's rules: no webhook).
REFUSED_AT_APPLY = {
    "names-and-labels": ({"selector": {"names": ["node-1"], "matchLabels": {"pool": "general"}}},
                         'spec.selector: Invalid value: "object": names cannot be combined with matchLabels or '
                         "matchExpressions; use one"),
    "percent": ({"parallelism": "50%"},
                'spec.parallelism: Invalid value: "": percentages such as "50%" are not supported: give a number of '
                'nodes such as 5 or "5"'),
    "never-deadline": ({"completionPolicy": {"type": "Never", "activeDeadlineSeconds": 900}},
                       'spec.completionPolicy.activeDeadlineSeconds: Invalid value: "object": may only be set when '
                       "completionPolicy.type is Always"),
    "short-deadline": ({"completionPolicy": {"activeDeadlineSeconds": 60}},
                       'spec.completionPolicy.activeDeadlineSeconds: Invalid value: "object": must be >= '
                       "pullPolicy.timeoutSeconds (600)"),
    "twice": ({"selector": {"names": ["node-1", "node-1"]}},
              'spec.selector.names: Invalid value: "array": must not name a node twice'),
    "in-without-values": ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
                          'spec.podSelector.matchExpressions[0].values: Invalid value: "object": must be non-empty '
                          "when operator is In"),
    "bad-image": ({"image": "Nginx:1.27"}, 'spec.image: Invalid value: "Nginx:1.27": spec.image in body should match'),
}


@pytest.mark.parametrize("name", sorted(REFUSED_AT_APPLY))
def test_kubectl_apply_refuses_a_bad_job_naming_the_field(env: dict[str, Any], tmp_path: Path, name: str) -> None:
    spec, said = REFUSED_AT_APPLY[name]
    kubectl = kubectl_in(env, tmp_path)

    applied = kubectl("apply", "-f", "-", input=yaml.safe_dump(job(f"bad-{name}", **spec)))

    assert applied.returncode == 1 and applied.stdout == ""
    assert applied.stderr.startswith(f'The ImagePullJob "bad-{name}" is invalid: '), applied.stderr
    assert said in applied.stderr
    assert env["admin"].list_objects(API, "imagepulljobs", "shop", field_selector=f"metadata.name=bad-{name}") == []


def test_kubectl_shows_kruises_defaults_stored_and_explains_the_fields(env: dict[str, Any], tmp_path: Path) -> None:
    kubectl = kubectl_in(env, tmp_path)
    manifest = {"apiVersion": API, "kind": "ImagePullJob", "metadata": {"name": "res-defaults", "namespace": "shop"},
                "spec": {"image": "nginx:1.27"}}

    applied = kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    shown = kubectl("get", "imagepulljob", "res-defaults", "-n", "shop", "-o", "yaml")
    explained = kubectl("explain", "imagepulljobs.spec.parallelism")
    deleted = kubectl("delete", "imagepulljob", "res-defaults", "-n", "shop")

    assert applied.returncode == 0, applied.stderr
    spec = yaml.safe_load(shown.stdout)["spec"]
    assert spec == {"image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
                    "completionPolicy": {"type": "Always"}, "pullPolicy": {"backoffLimit": 3, "timeoutSeconds": 600}}
    assert explained.returncode == 0, explained.stderr
    assert "a number, or a numeric string" in explained.stdout
    assert (deleted.returncode, deleted.stdout.strip()) == (
        0, 'imagepulljob.prewarm.dev "res-defaults" deleted from shop namespace')
    assert kubectl("auth", "can-i", "create", "imagepulljobs.prewarm.dev", "-n", "shop").stdout.strip() == "yes"


def test_a_numeric_string_parallelism_is_that_many_nodes_from_kubectl_the_sync_and_the_cli(
    env: dict[str, Any], tmp_path: Path
) -> None:
    kubectl = kubectl_in(env, tmp_path)
    resource = job("res-string-parallelism", parallelism="3")
    cli_job = ("apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\n"
               "metadata: {name: cli-string-parallelism, namespace: shop}\n"
               "spec: {image: 'redis:7', parallelism: '4'}\n")

    applied = kubectl("apply", "-f", "-", input=yaml.safe_dump(resource))
    env["stack"].fire("sync_resources")
    env["stack"].run_until_idle()
    env["stack"].fire("sync_resources")
    by_cli = prewarm(env, "apply", "-f", "-", input=cli_job)

    assert applied.returncode == 0, applied.stderr
    stored = env["store"].get_job(job_key("shop", "res-string-parallelism"))
    assert stored is not None and stored.manifest["spec"]["parallelism"] == 3
    status = env["admin"].get_object(API, "imagepulljobs", "res-string-parallelism", "shop")["status"]
    assert status["active"] == 3 and status["message"].startswith("job is running")
    assert by_cli.exit_code == 0, by_cli.output
    assert env["store"].get_job(job_key("shop", "cli-string-parallelism")).manifest["spec"]["parallelism"] == 4


def test_a_cron_job_resources_runs_are_objects_it_owns_listed_by_kubectl_and_collected_with_it(
        env: dict[str, Any], tmp_path: Path) -> None:
    # Given an AdvancedCronJob resource the sync has applied
    kubectl = kubectl_in(env, tmp_path)
    cron = {"apiVersion": API, "kind": "AdvancedCronJob", "metadata": {"name": "nightly", "namespace": "shop"},
            "spec": {"schedule": "0 3 * * *", "timeZone": "Europe/Berlin", "template": {"imageListPullJobTemplate": {
                "spec": {"images": ["nginx:1.27", "redis:7"], "parallelism": 0,
                         "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 100}}}}}}
    assert kubectl("apply", "-f", "-", input=yaml.safe_dump(cron)).returncode == 0
    env["stack"].fire("sync_resources")

    # When its schedule fires run_cron_job (as its own role, with the RBAC install ships), twice for one time
    event = {"cronJob": "shop/nightly", "scheduledTime": "2026-11-29T02:00:00Z"}
    run = env["stack"].invoke("run_cron_job", event)["run"]
    assert env["stack"].invoke("run_cron_job", event)["run"] == run

    # Then the run is an ImageListPullJob object the cron job controls, as Kruise's controller makes it
    assert run == "nightly-1795917600"
    owner = env["admin"].get_object(API, "advancedcronjobs", "nightly", "shop")
    obj = env["admin"].get_object(API, "imagelistpulljobs", run, "shop")
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": API, "kind": "AdvancedCronJob", "name": "nightly",
                                                   "uid": owner["metadata"]["uid"], "controller": True,
                                                   "blockOwnerDeletion": True}]
    assert obj["spec"]["pullPolicy"]["timeoutSeconds"] == 100  # no pull outlasts the run's deadline
    listed = kubectl("get", "imagelistpulljobs", "-n", "shop", "-o", "name")
    assert f"imagelistpulljob.prewarm.dev/{run}" in listed.stdout.split()
    record = env["store"].get_job(job_key("shop", run))
    assert record is not None and record.source is Source.RESOURCE
    # And the sync finds it applied, writes its status and the cron job's
    summary = env["stack"].fire("sync_resources")
    assert not [line for line in summary["applied"] if run in line]
    assert env["admin"].get_object(API, "imagelistpulljobs", run, "shop")["status"]["desired"] == 2
    assert env["admin"].get_object(API, "advancedcronjobs", "nightly", "shop")["status"]["active"] == [
        {"apiVersion": API, "kind": "ImageListPullJob", "name": run, "namespace": "shop"}]

    # When the cron job is deleted with kubectl, its run's object goes with it (the garbage collector),
    # and the sync deletes the cron job's item and its run's job
    assert kubectl("delete", "advancedcronjob", "nightly", "-n", "shop").returncode == 0
    assert env["admin"].get_object(API, "imagelistpulljobs", run, "shop") is None
    summary = env["stack"].fire("sync_resources")
    assert "AdvancedCronJob shop/nightly" in summary["deleted"]
    gone = env["store"].get_job(job_key("shop", run))
    assert gone is None or gone.state is JobState.DELETING


def test_a_namespaces_warm_budget_refuses_a_resource_beyond_it_in_its_status(env: dict[str, Any]) -> None:
    # Given a Namespace with a warm budget of 1 MiB, and two images in the stack's ECR of 600 KiB and 500 KiB
    ecr, region = env["aws"].client("ecr"), env["aws"].region
    ecr.create_repository(repositoryName="budget/app")
    host = f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com/budget/app"
    for tag, size in (("a", 600 * 1024 - 100), ("b", 500 * 1024 - 100)):
        ecr.put_image(repositoryName="budget/app", imageTag=tag, imageManifestMediaType=OCI_MANIFEST,
                      imageManifest=json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {
                          "mediaType": "application/vnd.oci.image.config.v1+json", "size": 100,
                          "digest": f"sha256:{tag * 64}"}, "layers": [{
                              "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": size,
                              "digest": f"sha256:{tag * 63}0"}]}))
    env["admin"].create_object("v1", "namespaces", {"metadata": {
        "name": "budgeted", "annotations": {"prewarm.dev/warm-bytes-per-node": "1Mi"}}})
    env["admin"].create_object(API, "imagepulljobs", job("fits", "budgeted", image=f"{host}:a"), "budgeted")
    env["admin"].create_object(API, "imagepulljobs", job("over", "budgeted", image=f"{host}:b"), "budgeted")

    # When the stack's sync runs (as its role: it lists the Namespaces and reads the images' sizes from ECR)
    summary = env["stack"].fire("sync_resources")

    # Then the budget is copied to the table, the job that fits is applied, and the other is not: its status
    # says why, with the figures
    assert env["store"].get_warm_budgets()["budgeted"].bytes_per_node == 2**20
    assert env["store"].get_job(job_key("budgeted", "fits")) is not None
    assert env["store"].get_job(job_key("budgeted", "over")) is None
    assert [line.split(":")[0] for line in summary["refused"]] == ["ImagePullJob budgeted/over"]
    status = env["admin"].get_object(API, "imagepulljobs", "over", "budgeted")["status"]
    assert status["message"] == (
        "not applied: ImagePullJob budgeted/over refused: namespace budgeted keeps at most 1048576 bytes (1.0 MiB) "
        "of images warm per node; its other jobs keep 614400 bytes and this job adds 512000 bytes (policy Refuse; "
        "annotation prewarm.dev/warm-bytes-per-node)")
