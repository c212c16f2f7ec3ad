"""A job's pullSecrets through the control plane: mirrored at planning, read by agents, cleaned by sweep.

The mirror and the agents' reader are the Secrets Manager adapters, on moto in-process; the control plane
is the services' in-memory one. Moved here from tests/unit/services, which runs without moto."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.adapters.secrets import AgentCredentials, SecretsManagerMirror
from prewarm.domain.messages import PullTask
from prewarm.services.dispatch import plan_job
from prewarm.services.jobs import apply_manifest, delete_job
from prewarm.services.schedules import SweepSettings, referenced_pull_secrets, sweep
from tests.support.aws import mocked_aws
from tests.support.clock import Clock
from tests.support.cluster import FakeCluster, make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane, memory_plane

IMAGE = "registry.example.com/team/app@sha256:" + "b" * 64
REGCRED = {"auths": {"registry.example.com": {"username": "robot", "password": "s3cret-robot"}}}


def job_doc(name: str, namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"image": IMAGE, **spec}}


def pull_secret(name: str, namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(REGCRED).encode()).decode()}}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with mocked_aws(monkeypatch, "us-west-2"):
        yield


@pytest.fixture
def plane(aws: None) -> ControlPlane:
    return memory_plane()


@pytest.fixture
def clock() -> Clock:
    return Clock(1_800_000_000.0)


@pytest.fixture
def mirror(plane: ControlPlane, clock: Clock) -> SecretsManagerMirror:
    client = boto3.client("secretsmanager")
    return SecretsManagerMirror("prewarm/test", plane.cluster, client=client, clock=clock)


def plan(plane: ControlPlane, mirror: SecretsManagerMirror, name: str, namespace: str = "team-a") -> Any:
    return plan_job(plane.store, plane.cluster, plane.queues, f"{namespace}/{name}", now=plane.now(), secrets=mirror)


def test_missing_pull_secret_fails_the_job_with_a_message_naming_it(plane: ControlPlane,
                                                                    mirror: SecretsManagerMirror) -> None:
    # Given a job naming a pull secret that does not exist
    plane.cluster.nodes.append(make_node("node-1"))
    apply_manifest(plane.store, job_doc("warm", pullSecrets=["regcred"]), now=plane.now())
    # When it is planned
    result = plan(plane, mirror, "warm")
    # Then the job fails, saying which secret is missing and where; no task is sent
    record = plane.store.get_job("team-a/warm")
    assert record is not None and record.state == "Failed"
    assert record.message == ("pull secret team-a/regcred not found: create it in namespace team-a or remove it "
                              "from the job's pullSecrets")
    assert result.action.startswith("failed: pull secret team-a/regcred not found")
    assert plane.node_messages("node-1") == []


def test_tasks_carry_mirror_arns_the_agent_turns_into_a_keyring(plane: ControlPlane,
                                                               mirror: SecretsManagerMirror, clock: Clock) -> None:
    plane.cluster.nodes.append(make_node("node-1"))
    plane.start_agents()
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    apply_manifest(plane.store, job_doc("warm", pullSecrets=["regcred"]), now=plane.now())
    plan(plane, mirror, "warm")
    (task,) = plane.node_messages("node-1")
    assert isinstance(task, PullTask) and len(task.pull_secret_arns) == 1
    keyring = AgentCredentials(client=boto3.client("secretsmanager"), clock=clock).keyring(
        task.pull_secret_arns)
    (auth,) = keyring.lookup(IMAGE)
    assert (auth.username, auth.password) == ("robot", "s3cret-robot")


def test_sweep_deletes_mirrors_of_pull_secrets_no_job_names_any_more(plane: ControlPlane,
                                                                    mirror: SecretsManagerMirror, clock: Clock) -> None:
    # Given two jobs in two namespaces, each with a mirrored pull secret
    for namespace in ("team-a", "team-b"):
        plane.cluster.secrets[(namespace, "regcred")] = pull_secret("regcred", namespace)
        apply_manifest(plane.store, job_doc("warm", namespace, pullSecrets=["regcred"]), now=plane.now())
        plan(plane, mirror, "warm", namespace)
    assert referenced_pull_secrets(plane.store.list_jobs()) == {("team-a", "regcred"), ("team-b", "regcred")}
    # When one job is deleted and the sweep runs well after the mirrors were written
    delete_job(plane.store, plane.queues, "team-b", "warm")
    clock.now += 3600
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now(),
                   config=SweepSettings(prefix="pw"), secrets=mirror)
    # Then only the deleted job's mirror is gone, for good
    assert result.pull_secrets_deleted == ["prewarm/test/pull-secrets/team-b/regcred"]
    names = {s["Name"] for s in boto3.client("secretsmanager").list_secrets(
        IncludePlannedDeletion=True)["SecretList"]}
    assert names == {"prewarm/test/pull-secrets/team-a/regcred"}


def test_sweep_keeps_a_mirror_written_moments_ago_even_if_unreferenced(plane: ControlPlane,
                                                                      mirror: SecretsManagerMirror) -> None:
    # A job applied while the sweep runs may have claimed this mirror after the sweep listed the jobs.
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    mirror.mirror("team-a", ["regcred"])
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now(),
                   config=SweepSettings(prefix="pw"), secrets=mirror)
    assert result.pull_secrets_deleted == []


def test_a_registered_clusters_job_mirrors_that_clusters_secret_under_its_own_name(
    plane: ControlPlane, clock: Clock
) -> None:
    # Given a secret of the same name in team-a of the own cluster and of prod-eu, with other contents
    prod = FakeCluster(nodes=[make_node("node-1")])
    other = {"auths": {"registry.example.com": {"username": "prod-robot", "password": "prod-s3cret"}}}
    plane.cluster.nodes.append(make_node("node-1"))
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    prod.secrets[("team-a", "regcred")] = {**pull_secret("regcred"), "data": {
        ".dockerconfigjson": base64.b64encode(json.dumps(other).encode()).decode()}}
    mirror = SecretsManagerMirror("prewarm/test", plane.cluster, client=boto3.client("secretsmanager"), clock=clock,
                                  registered=lambda name: prod if name == "prod-eu" else None)
    # When the same job is planned in both clusters
    for cluster, api in (("", plane.cluster), ("prod-eu", prod)):
        apply_manifest(plane.store, job_doc("warm", pullSecrets=["regcred"]), now=plane.now(), cluster=cluster)
        key = f"{cluster}:team-a/warm" if cluster else "team-a/warm"
        plan_job(plane.store, api, plane.queues, key, now=plane.now(), secrets=mirror)
    # Then each job's tasks name its own cluster's mirror, with that cluster's contents
    secrets = boto3.client("secretsmanager")
    values = {}
    for key in ("team-a/warm", "prod-eu:team-a/warm"):
        record = plane.store.get_job(key)
        assert record is not None and len(record.pull_secret_arns) == 1, key
        values[key] = json.loads(secrets.get_secret_value(SecretId=record.pull_secret_arns[0])["SecretString"])
    assert values == {"team-a/warm": REGCRED, "prod-eu:team-a/warm": other}
    assert referenced_pull_secrets(plane.store.list_jobs()) == {("team-a", "regcred"), ("prod-eu:team-a", "regcred")}
    # and the sweep deletes the mirror of the cluster whose job went, not its namesake
    delete_job(plane.store, plane.queues, "team-a", "warm", cluster="prod-eu")
    clock.now += 3600
    result = sweep(plane.store, plane.queues, clusters_of(plane.store), now=plane.now(),
                   config=SweepSettings(prefix="pw"), secrets=mirror)
    assert result.pull_secrets_deleted == ["prewarm/test/pull-secrets/@prod-eu/team-a/regcred"]


def test_the_planned_task_carries_the_mirrored_secrets_and_the_flag(plane: ControlPlane) -> None:
    # `spec.pullSecretsOnly` (tests/unit/services/test_pull_secrets_only.py) down to the agent's task
    from tests.unit.services.test_pull_secrets_only import job_doc, pull_secret

    plane.cluster.nodes.append(make_node("node-1"))
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    apply_manifest(plane.store, job_doc(pullSecrets=["regcred"], pullSecretsOnly=True), now=plane.now(),
                   secrets=plane.cluster)
    mirror = SecretsManagerMirror("prewarm/test", plane.cluster, client=boto3.client("secretsmanager"))
    plane.start_agents()
    plan_job(plane.store, plane.cluster, plane.queues, "team-a/warm", now=plane.now(), secrets=mirror)

    (task,) = plane.node_messages("node-1")
    assert isinstance(task, PullTask) and task.pull_secrets_only is True
    assert task.pull_secret_arns and task.pull_secret_arns[0].split(":")[-1].startswith(
        "prewarm/test/pull-secrets/team-a/regcred")
