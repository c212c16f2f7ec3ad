"""`spec.pullSecretsOnly`: a job or rule that pulls with its own namespace's pull secrets and never with
credentials shared by every job. Its model, its refusal at apply when a secret is missing (CLI and the
resource sync), the rule's jobs. The task the agent gets, with the secrets mirrored to Secrets Manager:
tests/unit/adapters/test_job_pull_secrets.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from prewarm.domain.jobs import hash_spec
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.messages import PullTask, parse_node_message
from prewarm.domain.rules import PrewarmRule
from prewarm.services.jobs import apply_manifest
from prewarm.services.ports import ClusterAuthError
from prewarm.services.resources import sync_resources
from tests.support.control_plane import ControlPlane
from tests.support.resources import FakeResources

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/app:v1"
REGCRED = {"auths": {"123456789012.dkr.ecr.us-west-2.amazonaws.com": {"username": "AWS", "password": "team-a"}}}


def job_doc(name: str = "warm", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"image": IMAGE, **spec}}


def rule_doc(**template_spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "team-a"},
            "spec": {"repositories": ["team/*"], "template": {"metadata": {"namespace": "team-a"},
                                                              "spec": template_spec}}}


def pull_secret(name: str, namespace: str = "team-a", kind: str = "kubernetes.io/dockerconfigjson") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "type": kind,
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(REGCRED).encode()).decode()}}


def refusals(error: pytest.ExceptionInfo[JobValidationError]) -> list[str]:
    return [str(e) for e in error.value.errors]


# --- the model ----------------------------------------------------------------------------------


def test_pull_secrets_only_needs_a_pull_secret_to_pull_with() -> None:
    with pytest.raises(JobValidationError) as refused:
        parse_manifest(job_doc(pullSecretsOnly=True))
    assert refusals(refused) == ["spec.pullSecretsOnly: true needs at least one secret in spec.pullSecrets to "
                                 "pull with"]
    with pytest.raises(JobValidationError) as refused:
        parse_manifest(rule_doc(pullSecretsOnly=True))
    assert refusals(refused) == ["spec.template.spec.pullSecretsOnly: true needs at least one secret in "
                                 "spec.template.spec.pullSecrets to pull with"]


def test_false_is_the_default_and_leaves_a_spec_as_it_was() -> None:
    # Jobs stored before the field existed keep their hash: re-applying them is `unchanged`.
    plain = parse_manifest(job_doc(pullSecrets=["regcred"]))
    explicit = parse_manifest(job_doc(pullSecrets=["regcred"], pullSecretsOnly=False))
    assert hash_spec(plain.spec) == hash_spec(explicit.spec)
    assert "pullSecretsOnly" not in explicit.to_manifest()["spec"]
    assert parse_manifest(job_doc(pullSecrets=["regcred"], pullSecretsOnly=True)).to_manifest()["spec"][
        "pullSecretsOnly"] is True


def test_a_rule_hands_pull_secrets_only_to_the_jobs_it_makes() -> None:
    rule = parse_manifest(rule_doc(pullSecrets=["regcred"], pullSecretsOnly=True))
    assert isinstance(rule, PrewarmRule)
    job = rule.job_for_push("123456789012.dkr.ecr.us-west-2.amazonaws.com", "team/app", "sha256:" + "a" * 64, "v1")
    assert job.spec.pull_secrets_only is True and job.spec.pull_secrets == ["regcred"]


def test_the_task_says_so_only_when_true() -> None:
    # Agents older than the field refuse a task that has it: it is sent only when a job asks.
    fields: dict[str, Any] = {"job": "team-a/warm", "job_uid": "u", "round": 0, "node": "n", "image": IMAGE}
    assert "pull_secrets_only" not in PullTask(**fields).model_dump_json()
    task = parse_node_message(PullTask(**fields, pull_secrets_only=True).model_dump_json())
    assert isinstance(task, PullTask) and task.pull_secrets_only is True


# --- refused at apply ---------------------------------------------------------------------------


def test_apply_refuses_a_missing_secret_naming_the_field_and_the_secret(plane: ControlPlane) -> None:
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    with pytest.raises(JobValidationError) as refused:
        apply_manifest(plane.store, job_doc(pullSecrets=["regcred", "robot"], pullSecretsOnly=True),
                       now=plane.now(), secrets=plane.cluster)
    assert refused.value.subject == "ImagePullJob team-a/warm"
    assert refusals(refused) == ['spec.pullSecrets[1]: secret "robot" not found in namespace "team-a": '
                                 "spec.pullSecretsOnly pulls with these secrets only; create it first"]
    assert plane.store.get_job("team-a/warm") is None


def test_apply_refuses_a_secret_that_holds_no_registry_credentials(plane: ControlPlane) -> None:
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred", kind="Opaque")
    with pytest.raises(JobValidationError) as refused:
        apply_manifest(plane.store, job_doc(pullSecrets=["regcred"], pullSecretsOnly=True), now=plane.now(),
                       secrets=plane.cluster)
    assert refusals(refused) == ['spec.pullSecrets[0]: secret "regcred" in namespace "team-a" is of type "Opaque", '
                                 "not kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg: it holds no "
                                 "registry credentials"]


def test_a_rule_is_checked_in_the_namespace_of_its_jobs(plane: ControlPlane) -> None:
    plane.cluster.secrets[("default", "regcred")] = pull_secret("regcred", "default")
    with pytest.raises(JobValidationError) as refused:
        apply_manifest(plane.store, rule_doc(pullSecrets=["regcred"], pullSecretsOnly=True), now=plane.now(),
                       secrets=plane.cluster)
    assert refusals(refused)[0].startswith('spec.template.spec.pullSecrets[0]: secret "regcred" not found in '
                                           'namespace "team-a"')
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    applied = apply_manifest(plane.store, rule_doc(pullSecrets=["regcred"], pullSecretsOnly=True),
                             now=plane.now(), secrets=plane.cluster)
    assert applied.outcome == "created"


def test_without_a_cluster_to_check_it_is_refused_not_applied_blind(plane: ControlPlane) -> None:
    with pytest.raises(JobValidationError) as refused:
        apply_manifest(plane.store, job_doc(pullSecrets=["regcred"], pullSecretsOnly=True), now=plane.now())
    assert refusals(refused) == ["spec.pullSecretsOnly: cannot check that its pullSecrets exist: no cluster to read "
                                 "them from"]


def test_other_jobs_do_not_read_the_cluster(plane: ControlPlane) -> None:
    applied = apply_manifest(plane.store, job_doc(pullSecrets=["regcred"]), now=plane.now())
    assert applied.outcome == "created"


# --- the resource sync --------------------------------------------------------------------------


def test_the_sync_refuses_it_in_the_resource_status_until_the_secret_exists(plane: ControlPlane) -> None:
    api = FakeResources()
    api.put("ImagePullJob", "warm", job_doc(pullSecrets=["regcred"], pullSecretsOnly=True)["spec"],
            namespace="team-a")

    report = sync_resources(plane.store, api, now=10.0)

    assert plane.store.get_job("team-a/warm") is None
    assert report.refused and api.get("ImagePullJob", "warm", "team-a")["status"]["message"] == (
        'not applied: ImagePullJob team-a/warm is invalid: spec.pullSecrets[0]: secret "regcred" not found in '
        'namespace "team-a": spec.pullSecretsOnly pulls with these secrets only; create it first')
    # Once it exists, the next sync applies it
    api.secrets[("team-a", "regcred")] = pull_secret("regcred")
    report = sync_resources(plane.store, api, now=70.0)
    assert report.applied == ["ImagePullJob team-a/warm created"]
    assert "not applied" not in api.get("ImagePullJob", "warm", "team-a")["status"].get("message", "")


def test_the_sync_does_not_apply_what_it_cannot_check(plane: ControlPlane) -> None:
    api = FakeResources()
    api.secrets_error = ClusterAuthError("GET /api/v1/namespaces/team-a/secrets/regcred: 403 Forbidden: ...",
                                         status=403, reason="Forbidden")
    api.put("ImagePullJob", "warm", job_doc(pullSecrets=["regcred"], pullSecretsOnly=True)["spec"],
            namespace="team-a")

    sync_resources(plane.store, api, now=10.0)

    assert plane.store.get_job("team-a/warm") is None
    assert api.get("ImagePullJob", "warm", "team-a")["status"]["message"].startswith(
        "not applied: cannot check that spec.pullSecrets exist (spec.pullSecretsOnly): GET /api/v1/namespaces/"
        "team-a/secrets/regcred: 403 Forbidden")


def test_switching_it_on_starts_a_new_round(plane: ControlPlane) -> None:
    plane.cluster.secrets[("team-a", "regcred")] = pull_secret("regcred")
    apply_manifest(plane.store, job_doc(pullSecrets=["regcred"]), now=plane.now())
    before = plane.store.get_job("team-a/warm")
    applied = apply_manifest(plane.store, job_doc(pullSecrets=["regcred"], pullSecretsOnly=True), now=plane.now(),
                             secrets=plane.cluster)
    after = plane.store.get_job("team-a/warm")
    assert applied.outcome == "configured"
    assert before is not None and after is not None and after.round == before.round + 1
