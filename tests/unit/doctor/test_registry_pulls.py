"""`prewarm doctor`'s registry pulls: IAM's policy simulator (moto in-process; the AWS limits layer stands
in for IAM's with its one evaluator) decides whether each registry token's principal may pull, with the
refresher role's policies as template.yaml ships them, and without its pull statement."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.domain.refresh import CredentialsConfig
from prewarm_cli.doctor.pulls import check_registry_pulls, repository_arns
from prewarm_devtools.sam.aws import LocalIdentity
from prewarm_devtools.sam.template import load_template
from tests.support.aws import mocked_aws

ACCOUNT = "123456789012"
REGION = "us-west-2"
HOST = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
CONFIG = CredentialsConfig.model_validate({"registries": [{"account": ACCOUNT, "region": REGION}],
                                          "namespaces": ["*"]})


REFRESHER = f"arn:aws:iam::{ACCOUNT}:role/prod-RefreshEcrCredentialsRole-AbC"


def refresher_policies(template: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The refresher role's ECR statements as the template has them, its `!Sub`s filled in."""
    document = template["Resources"]["RefreshEcrCredentialsRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    statements = []
    for statement in document["Statement"]:
        if "Fn::If" in statement or not str(statement.get("Action")).count("ecr:"):
            continue
        resource = statement["Resource"]
        if isinstance(resource, dict) and "Fn::If" in resource:  # PullRepositoryArns left empty: its default
            resource = resource["Fn::If"][2]
        if isinstance(resource, dict):
            resource = resource["Fn::Sub"].replace("${AWS::Partition}", "aws").replace("${AWS::AccountId}", ACCOUNT)
        statements.append({**statement, "Resource": resource})
    return REFRESHER, [{"Version": "2012-10-17", "Statement": statements}]


_REGISTERED: list[LocalIdentity] = []


@pytest.fixture
def iam(monkeypatch: pytest.MonkeyPatch, aws_limits: Any) -> Iterator[Any]:
    if aws_limits is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS): nothing stands in for IAM's simulator")
    with mocked_aws(monkeypatch, REGION):
        try:
            yield boto3.client("iam", region_name=REGION)
        finally:
            while _REGISTERED:
                _REGISTERED.pop().unregister()


def registered(arn: str, policies: list[dict[str, Any]]) -> str:
    """`arn` known to the AWS limits layer with `policies`, until the test ends."""
    identity = LocalIdentity.of_role(arn)
    identity.register(policies)
    _REGISTERED.append(identity)
    return arn


def test_the_shipped_refresher_role_may_pull_from_its_registry(iam: Any) -> None:
    arn = registered(*refresher_policies(load_template()))

    result = check_registry_pulls(CONFIG, iam=iam, refresher_role_arn=arn, images=[f"{HOST}/team/app:v1"],
                                  secret_name="prewarm-ecr")

    assert (result.ok, result.detail) == (True, f"each registry's token may pull: {HOST} as {arn}")


def test_a_refresher_role_without_pull_rights_is_named_with_each_missing_permission(iam: Any) -> None:
    template = copy.deepcopy(load_template())
    document = template["Resources"]["RefreshEcrCredentialsRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    document["Statement"] = [s for s in document["Statement"] if s.get("Sid") != "RegistryPulls"]
    arn = registered(*refresher_policies(template))

    result = check_registry_pulls(CONFIG, iam=iam, refresher_role_arn=arn, images=[], secret_name="prewarm-ecr")

    repositories = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/*"
    assert result.failed
    assert result.detail == (
        f"{HOST}: its token's principal {arn} may not ecr:BatchGetImage on {repositories}; "
        f"ecr:GetDownloadUrlForLayer on {repositories}, so the registry refuses its pulls (403) (pods pulling "
        "with the pull secret prewarm-ecr and agents pulling with the shared credentials get 403 Forbidden)")
    assert result.fix == ("grant ecr:BatchGetImage, ecr:GetDownloadUrlForLayer to refresh_ecr_credentials' role "
                          "(template.yaml RefreshEcrCredentialsRole, statement RegistryPulls; redeploy the stack) "
                          "(docs/credentials.md)")


def test_a_registry_with_a_role_arn_is_checked_as_that_role(iam: Any) -> None:
    reader = registered(f"arn:aws:iam::{ACCOUNT}:role/team-a-reader", [{"Statement": [{
        "Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
        "Resource": f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/team-a/*"}]}])
    config = CredentialsConfig.model_validate({"registries": [{"account": ACCOUNT, "region": REGION,
                                                               "roleArn": reader}]})

    allowed = check_registry_pulls(config, iam=iam, refresher_role_arn="", images=[f"{HOST}/team-a/app:v1"])
    refused = check_registry_pulls(config, iam=iam, refresher_role_arn="", images=[f"{HOST}/team-b/app:v1"])

    assert allowed.ok
    assert refused.failed and f"may not ecr:BatchGetImage on arn:aws:ecr:{REGION}:{ACCOUNT}:repository/team-b/app" \
        in refused.detail
    assert refused.fix.startswith(f"grant ecr:BatchGetImage, ecr:GetDownloadUrlForLayer on the registry's "
                                  f"repositories to the registry's roleArn {reader}")


def test_the_repositories_checked_are_the_jobs_of_that_registry_else_all_of_them() -> None:
    (registry,) = CONFIG.registries
    base = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/"

    assert repository_arns(registry, [f"{HOST}/a/b:1", "quay.io/x/y:1", f"{HOST}/a/b:2", "Not An Image"]) == [
        base + "a/b"]
    assert repository_arns(registry, ["quay.io/x/y:1"]) == [base + "*"]


def test_without_the_refresher_role_s_arn_the_check_is_skipped_and_ecr_public_needs_none() -> None:
    assert check_registry_pulls(CONFIG, iam=None, refresher_role_arn="", images=[]).ok is None
    public = CredentialsConfig.model_validate({"registries": [{"public": True}]})
    assert check_registry_pulls(public, iam=None, refresher_role_arn="", images=[]).ok
