"""`JobSources=resources`: the jobs table's resource-based policy refuses writes from everyone but the
stack's own roles, so jobs come only from Kubernetes resources. Local mode's moto keeps the policy and
the AWS limits layer evaluates its Deny for each caller's key, as IAM does."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.services.jobs import apply_manifest
from prewarm_cli.app import cli
from prewarm_cli.targets import ENDPOINT_ENV, STACK_ENV, STATE_ENV, LocalState, write_local_state
from prewarm_devtools.sam.aws import OPERATOR, REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.manifests import job_doc

pytestmark = pytest.mark.integration

NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})


@pytest.fixture(scope="module")
def aws() -> Iterator[MotoServer]:
    with MotoServer(limits=True) as server, aws_environment(server.url):
        yield server


def deploy(aws: MotoServer, sources: str, name: str = "tp") -> LocalStack:
    return LocalStack(aws.url, stack_name=f"{name}-{uuid.uuid4().hex[:6]}",
                      parameters={"ClusterName": "local", "JobSources": sources}).deploy()


def store_as(aws: MotoServer, stack: LocalStack, identity: LocalIdentity) -> DynamoJobStore:
    client = boto3.client("dynamodb", region_name=REGION, endpoint_url=aws.url, config=NO_RETRIES,
                          aws_access_key_id=identity.access_key_id, aws_secret_access_key=identity.secret_access_key)
    return DynamoJobStore(stack.env()["TABLE_NAME"], client=client)


def test_resources_only_refuses_the_operators_writes_with_access_denied(aws: MotoServer) -> None:
    stack = deploy(aws, "resources")
    table_arn = aws.client("dynamodb").describe_table(TableName=stack.env()["TABLE_NAME"])["Table"]["TableArn"]

    with pytest.raises(ClientError) as refused:
        store_as(aws, stack, OPERATOR).client.put_item(
            TableName=stack.env()["TABLE_NAME"], Item={"pk": {"S": "JOB#default/x"}, "sk": {"S": "JOB"}})

    error = refused.value.response["Error"]
    assert error["Code"] == "AccessDeniedException"
    assert error["Message"] == (f"User: {OPERATOR.arn} is not authorized to perform: dynamodb:PutItem on resource: "
                                f"{table_arn} with an explicit deny in a resource-based policy")


def test_resources_only_lets_the_stacks_roles_write_and_everyone_read(aws: MotoServer) -> None:
    stack = deploy(aws, "resources")
    sync = stack.functions["SyncResourcesFunction"].identity
    assert sync is not None

    applied = apply_manifest(store_as(aws, stack, sync), job_doc("by-sync"), now=1.0)

    assert applied.outcome == "created"
    assert [r.name for r in store_as(aws, stack, OPERATOR).list_jobs()] == ["by-sync"]


def test_resources_only_lets_the_roles_of_a_long_stack_name_write(aws: MotoServer) -> None:
    # 59 characters: CloudFormation cuts its roles' generated names (64 at most) short of the whole stack name
    stack = deploy(aws, "resources", name="prewarm-production-eu-central-1-image-prewarming-fleet")
    sync = stack.functions["SyncResourcesFunction"].identity
    assert sync is not None
    role_name = sync.arn.rsplit("/", 1)[1]
    assert len(role_name) <= 64 and not role_name.startswith(f"{stack.stack_name}-")

    applied = apply_manifest(store_as(aws, stack, sync), job_doc("by-sync"), now=1.0)

    assert applied.outcome == "created"


def test_the_default_lets_the_cli_write(aws: MotoServer) -> None:
    stack = deploy(aws, "cli-and-resources")

    assert apply_manifest(store_as(aws, stack, OPERATOR), job_doc("by-cli"), now=1.0).outcome == "created"


def test_prewarm_apply_on_a_resources_only_stack_is_one_error_naming_the_denial(aws: MotoServer,
                                                                               tmp_path: Path) -> None:
    stack = deploy(aws, "resources")
    state = write_local_state(LocalState.of_stack(stack, pid=os.getpid()), tmp_path / "local.json")
    environ = {STATE_ENV: str(state), ENDPOINT_ENV: "", STACK_ENV: ""}
    manifest: Any = "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: web}\n" \
                    "spec: {image: 'nginx:1.27'}\n"

    result = CliRunner(env=environ).invoke(cli, ["--local", "apply", "-f", "-"], input=manifest,
                                           catch_exceptions=False)

    assert result.exit_code == 1
    assert "AccessDeniedException" in result.stderr and "explicit deny in a resource-based policy" in result.stderr
