"""A `pullSecretsOnly` task: the agent pulls with the task's pull secrets only, never with the node's shared
credential (the registry copy or its role), and fails with a message saying so when they do not do."""

from __future__ import annotations

from prewarm.domain.images import parse_image
from prewarm.domain.registries import RegistryAuth
from prewarm_agent.credentials import RegistryCredentials
from prewarm_agent.cri.client import ImageInfo
from tests.support.agent import IMAGE_ID, REPO_DIGEST, FakeCredentials, make_run, make_task
from tests.unit.agent.test_agent_credentials import ECR_HOST, ECR_IMAGE, FakeSecrets, FakeTokens, keyring
from tests.unit.agent.test_attempts import UNAUTHORIZED, Setup, pull_error

IMAGE = "registry.example.com/team/app:v1"
SECRET = RegistryAuth("robot", "team-a", "registry.example.com")
SHARED = RegistryAuth("AWS", "shared-token", "registry.example.com")


def test_the_nodes_credential_is_never_asked_for_nor_offered() -> None:
    tokens = FakeTokens()
    credentials = RegistryCredentials(secrets=FakeSecrets({"arn:team-a": keyring({ECR_HOST: ("robot", "pw")})}),
                                      tokens=tokens)

    found = credentials.candidates(parse_image(ECR_IMAGE), ["arn:team-a"], shared=False)

    assert [(a.username, a.password) for a in found.auths if a] == [("robot", "pw")]
    assert tokens.asked == []
    # and with no matching secret, no anonymous try either
    assert credentials.candidates(parse_image(ECR_IMAGE), [], shared=False).auths == []
    # the default keeps the node's token after the secrets
    assert [a.username for a in credentials.candidates(parse_image(ECR_IMAGE), ["arn:team-a"]).auths if a] == [
        "robot", "AWS"]


def test_it_pulls_with_the_secret_and_not_the_shared_credential() -> None:
    setup = Setup(credentials=FakeCredentials(auths=[SECRET], node_auths=[SHARED]))

    final = setup.runner.run(make_run(make_task(IMAGE, pull_secrets_only=True, pull_secret_arns=["arn:team-a"])))

    assert final.phase == "Succeeded"
    assert [p.auth for p in setup.runtime.pulls] == [("robot", "team-a")]
    assert setup.credentials.shared_asked == [False]


def test_a_refused_secret_fails_the_pull_without_trying_the_shared_credential() -> None:
    setup = Setup([pull_error(UNAUTHORIZED)], credentials=FakeCredentials(auths=[SECRET], node_auths=[SHARED]))

    final = setup.runner.run(make_run(make_task(IMAGE, pull_secrets_only=True, backoff_limit=0,
                                                pull_secret_arns=["arn:team-a"])))

    assert final.phase == "Failed"
    assert [p.auth for p in setup.runtime.pulls] == [("robot", "team-a")]
    assert final.message == (f"{UNAUTHORIZED} (pullSecretsOnly: the registry refused the job's pull secrets, and "
                             "shared credentials are not tried)")
    # A task that may use them moves on to the shared credential after the refusal
    other = Setup([pull_error(UNAUTHORIZED), IMAGE_ID],
                  credentials=FakeCredentials(auths=[SECRET], node_auths=[SHARED]))
    assert other.runner.run(make_run(make_task(IMAGE, backoff_limit=0))).phase == "Succeeded"
    assert [p.auth for p in other.runtime.pulls] == [("robot", "team-a"), ("AWS", "shared-token")]


def test_no_secret_for_the_registry_fails_at_once_and_pulls_nothing() -> None:
    setup = Setup(credentials=FakeCredentials(auths=[None], node_auths=[SHARED]))

    final = setup.runner.run(make_run(make_task(IMAGE, pull_secrets_only=True, backoff_limit=3,
                                                pull_secret_arns=["arn:team-a"])))

    assert final.phase == "Failed" and setup.runtime.pulls == []
    assert final.message == ("pullSecretsOnly: none of the job's pull secrets holds credentials for "
                             "registry.example.com")
    assert setup.credentials.shared_asked == [False]  # one attempt: retrying cannot make a secret match


def test_an_unreadable_secret_is_named_and_tried_again() -> None:
    setup = Setup(credentials=FakeCredentials(auths=[], problems=["secret arn:team-a does not exist"]))

    final = setup.runner.run(make_run(make_task(IMAGE, pull_secrets_only=True, backoff_limit=1,
                                                pull_secret_arns=["arn:team-a"])))

    assert final.phase == "Failed" and final.attempt == 0
    assert final.message == ("pullSecretsOnly: none of the job's pull secrets holds credentials for "
                             "registry.example.com (secret arn:team-a does not exist)")
    assert setup.credentials.shared_asked == [False, False]


def test_an_image_already_present_is_still_checked_with_the_secrets() -> None:
    # Like the kubelet's AlwaysVerify: the image being here (pulled for another job) says nothing about
    # this job's secrets; the registry is asked, and layers present are not fetched again.
    info = ImageInfo(id=IMAGE_ID, repo_tags=(IMAGE,), repo_digests=(f"registry.example.com/team/app@{REPO_DIGEST}",),
                     size=77)
    setup = Setup([pull_error(UNAUTHORIZED)], present={IMAGE: info},
                  credentials=FakeCredentials(auths=[SECRET], node_auths=[SHARED]))

    final = setup.runner.run(make_run(make_task(IMAGE, image_pull_policy="IfNotPresent", pull_secrets_only=True,
                                                backoff_limit=0, pull_secret_arns=["arn:team-a"])))

    assert final.phase == "Failed" and [p.auth for p in setup.runtime.pulls] == [("robot", "team-a")]
