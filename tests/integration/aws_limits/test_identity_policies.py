"""IAM identity policies, enforced by the AWS limits layer on local mode's moto server: a role that lacks
an action is refused with its service's own error, a role that has it is not, and every function of the
local stack runs under exactly the policies `template.yaml` gives its role."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import node_queue_name
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import ACCOUNT, REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.manifests import job_doc

pytestmark = pytest.mark.integration

NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})
ROLE = f"arn:aws:iam::{ACCOUNT}:role/limits-test"


@pytest.fixture(scope="module")
def aws() -> Iterator[MotoServer]:
    with MotoServer(limits=True) as server:
        yield server


def role(aws: MotoServer, name: str, *statements: dict[str, Any]) -> LocalIdentity:
    identity = LocalIdentity.of_role(f"{ROLE}-{name}")
    identity.register([{"Version": "2012-10-17", "Statement": list(statements)}])
    return identity


def client(aws: MotoServer, service: str, identity: LocalIdentity) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=aws.url, config=NO_RETRIES,
                        aws_access_key_id=identity.access_key_id, aws_secret_access_key=identity.secret_access_key)


def refused(call: Any, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    error: dict[str, str] = caught.value.response["Error"]
    return error


def implicit(identity: LocalIdentity, action: str, resource: str) -> str:
    return (f"User: {identity.arn} is not authorized to perform: {action} on resource: {resource} "
            f"because no identity-based policy allows the {action} action")


def test_sqs_refuses_a_role_without_the_action_with_access_denied(aws: MotoServer) -> None:
    url = aws.client("sqs").create_queue(QueueName="iam-q")["QueueUrl"]
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:iam-q"
    reader = role(aws, "reader", {"Effect": "Allow", "Action": ["sqs:ReceiveMessage"], "Resource": arn})
    sqs = client(aws, "sqs", reader)

    sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    error = refused(sqs.send_message, QueueUrl=url, MessageBody="{}")

    assert error["Code"] == "AccessDenied"
    assert error["Message"] == implicit(reader, "sqs:sendmessage", arn)
    # A batch is authorized as its single action, and ListQueues (no resource type) takes "*"
    assert "sqs:deletemessage" in refused(sqs.delete_message_batch, QueueUrl=url,
                                          Entries=[{"Id": "1", "ReceiptHandle": "x"}])["Message"]
    assert refused(sqs.list_queues)["Message"] == implicit(reader, "sqs:listqueues", "*")


def test_sqs_create_queue_with_tags_needs_tag_queue_too(aws: MotoServer) -> None:
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:iam-tagged"
    creator = role(aws, "creator", {"Effect": "Allow", "Action": "sqs:CreateQueue", "Resource": arn})
    sqs = client(aws, "sqs", creator)

    assert refused(sqs.create_queue, QueueName="iam-tagged", tags={"a": "b"})["Message"] == implicit(
        creator, "sqs:tagqueue", arn)
    sqs.create_queue(QueueName="iam-tagged")


def test_sqs_tag_conditions_decide_who_creates_and_deletes_a_queue(aws: MotoServer) -> None:
    # The shape of template.yaml's CreateOwnTaskQueue and DeleteDepartedNodesQueues statements
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:tagq-*"
    creator = client(aws, "sqs", role(aws, "tag-creator", {
        "Effect": "Allow", "Action": ["sqs:CreateQueue", "sqs:TagQueue"], "Resource": arn,
        "Condition": {"StringEquals": {"aws:RequestTag/stack": "mine"},
                      "ForAllValues:StringEquals": {"aws:TagKeys": ["stack", "node"]}}}))
    deleter = client(aws, "sqs", role(aws, "tag-deleter", {
        "Effect": "Allow", "Action": "sqs:DeleteQueue", "Resource": arn,
        "Condition": {"StringEquals": {"aws:ResourceTag/stack": "mine"}}}))

    # A queue tagged as this stack's, with only the allowed tag keys, may be made
    url = creator.create_queue(QueueName="tagq-a", tags={"stack": "mine", "node": "a"})["QueueUrl"]
    # ... not with another stack's tag, an extra tag key, or no tags at all
    assert refused(creator.create_queue, QueueName="tagq-b", tags={"stack": "theirs"})["Code"] == "AccessDenied"
    assert refused(creator.create_queue, QueueName="tagq-c",
                   tags={"stack": "mine", "owner": "x"})["Code"] == "AccessDenied"
    assert refused(creator.create_queue, QueueName="tagq-d")["Code"] == "AccessDenied"
    # Only a queue that carries the tag may be deleted
    other = aws.client("sqs").create_queue(QueueName="tagq-e", tags={"stack": "theirs"})["QueueUrl"]
    assert refused(deleter.delete_queue, QueueUrl=other)["Code"] == "AccessDenied"
    deleter.delete_queue(QueueUrl=url)


def test_a_queue_policy_that_names_the_role_grants_what_its_identity_policy_does_not(aws: MotoServer) -> None:
    bare = role(aws, "bare")
    url = aws.client("sqs").create_queue(QueueName="iam-shared", Attributes={"Policy": json.dumps({
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": bare.arn}, "Action": "sqs:SendMessage",
                       "Resource": "*"}]})})["QueueUrl"]

    client(aws, "sqs", bare).send_message(QueueUrl=url, MessageBody="{}")
    assert refused(client(aws, "sqs", bare).purge_queue, QueueUrl=url)["Code"] == "AccessDenied"


def test_dynamodb_refuses_with_access_denied_exception_per_table_index_and_transaction_part(
    aws: MotoServer,
) -> None:
    dynamodb = aws.client("dynamodb")
    dynamodb.create_table(
        TableName="iam-t", BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "k", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[{"IndexName": "by-k", "KeySchema": [{"AttributeName": "k", "KeyType": "HASH"}],
                                 "Projection": {"ProjectionType": "KEYS_ONLY"}}])
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/iam-t"
    writer = role(aws, "writer", {"Effect": "Allow", "Action": ["dynamodb:PutItem", "dynamodb:Query"],
                                  "Resource": table})
    db = client(aws, "dynamodb", writer)

    db.put_item(TableName="iam-t", Item={"pk": {"S": "a"}, "k": {"S": "x"}})
    db.query(TableName="iam-t", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "a"}})
    error = refused(db.get_item, TableName="iam-t", Key={"pk": {"S": "a"}})
    assert error["Code"] == "AccessDeniedException"
    assert error["Message"] == implicit(writer, "dynamodb:GetItem", table)
    # An index is a resource of its own
    assert refused(db.query, TableName="iam-t", IndexName="by-k", KeyConditionExpression="k = :k",
                   ExpressionAttributeValues={":k": {"S": "x"}})["Message"] == implicit(
        writer, "dynamodb:Query", f"{table}/index/by-k")
    # A transaction is authorized part by part: its Put passes, its Delete does not
    assert refused(db.transact_write_items, TransactItems=[
        {"Put": {"TableName": "iam-t", "Item": {"pk": {"S": "b"}}}},
        {"Delete": {"TableName": "iam-t", "Key": {"pk": {"S": "a"}}}},
    ])["Message"] == implicit(writer, "dynamodb:DeleteItem", table)
    assert refused(db.batch_get_item, RequestItems={"iam-t": {"Keys": [{"pk": {"S": "a"}}]}})["Message"] == (
        implicit(writer, "dynamodb:BatchGetItem", table))


def test_secrets_manager_ecr_ssm_and_sts_refuse_a_role_without_the_action(aws: MotoServer) -> None:
    prefix = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:prewarm/s/"
    reader = role(aws, "secrets",
                  {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": prefix + "*"},
                  {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"})
    made = aws.client("secretsmanager").create_secret(Name="prewarm/s/ns", SecretString="{}")
    aws.client("secretsmanager").create_secret(Name="other/ns", SecretString="{}")
    aws.client("ecr").create_repository(repositoryName="iam-repo")
    secrets = client(aws, "secretsmanager", reader)

    assert secrets.get_secret_value(SecretId="prewarm/s/ns")["ARN"] == made["ARN"]
    error = refused(secrets.get_secret_value, SecretId="other/ns")
    assert error["Code"] == "AccessDeniedException" and "secretsmanager:GetSecretValue on resource: " \
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:other/ns-" in error["Message"]
    assert refused(secrets.create_secret, Name="prewarm/s/new", SecretString="{}")["Message"] == implicit(
        reader, "secretsmanager:CreateSecret", prefix + "new")

    ecr = client(aws, "ecr", reader)
    ecr.get_authorization_token()
    error = refused(ecr.describe_images, repositoryName="iam-repo")
    assert error["Code"] == "AccessDeniedException"
    assert error["Message"] == implicit(reader, "ecr:DescribeImages",
                                        f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/iam-repo")

    error = refused(client(aws, "ssm", reader).get_parameter, Name="/prewarm/config")
    assert error["Code"] == "AccessDeniedException"
    assert error["Message"] == implicit(reader, "ssm:GetParameter",
                                        f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/prewarm/config")

    sts = client(aws, "sts", reader)
    sts.get_caller_identity()  # needs no permission (STS API Reference)
    target = f"arn:aws:iam::{ACCOUNT}:role/registry-reader"
    error = refused(sts.assume_role, RoleArn=target, RoleSessionName="s1")
    assert error["Code"] == "AccessDenied"
    assert error["Message"] == implicit(reader, "sts:AssumeRole", target)


def test_a_refusal_is_counted_and_a_principal_without_known_policies_is_not_evaluated(aws: MotoServer) -> None:
    assert aws.layer is not None
    before = aws.layer.stats.refusals.get("AccessDenied", 0)
    url = aws.client("sqs").create_queue(QueueName="iam-count")["QueueUrl"]
    refused(client(aws, "sqs", role(aws, "nothing")).send_message, QueueUrl=url, MessageBody="{}")
    assert aws.layer.stats.refusals["AccessDenied"] == before + 1
    unknown = LocalIdentity.of_role(f"{ROLE}-unknown")
    unknown.register()  # known by key, policies not given: an administrator, as the operator
    client(aws, "sqs", unknown).send_message(QueueUrl=url, MessageBody="{}")


# -- the local stack: each function under its role's shipped policies ------------------------------


@pytest.fixture
def stack() -> Iterator[tuple[LocalStack, MotoServer]]:
    with MotoServer(limits=True) as aws, KubeApiServer() as api, aws_environment(aws.url):
        yield LocalStack(aws.url, stack_name="roles", parameters={
            "ClusterName": "local", "KubeApiEndpoint": api.url}).deploy(), aws


def test_every_function_role_is_registered_with_its_template_policies(stack: tuple[LocalStack, MotoServer]) -> None:
    local, aws = stack
    assert aws.layer is not None
    for fn in local.functions.values():
        assert fn.identity is not None
        policies = aws.layer.principals.policies(fn.identity.arn)
        assert policies and policies == tuple(local.role_policies[fn.identity.arn]), fn.logical_id
    sids = {s["Sid"] for s in local.policy_document("AgentPolicy")["Statement"]}
    assert {"NodeTaskQueues", "StatusReports"} <= sids and "CreateOwnTaskQueue" not in sids


def test_an_agent_may_not_make_or_change_a_node_queue_and_record_status_makes_it(
    stack: tuple[LocalStack, MotoServer],
) -> None:
    # CreateQueue may set any Policy and no condition key restricts it: with it, a node could make a future
    # node's queue with a policy of its own (issue 35). Only the control plane makes node queues.
    local, aws = stack
    env = local.env()
    agent = LocalIdentity.of_role(f"{ROLE}-agents")
    agent.register([local.policy_document("AgentPolicy")])
    agents = client(aws, "sqs", agent)
    name = node_queue_name(env["NODE_QUEUE_PREFIX"], "ip-10-0-9-9.ec2.internal")
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    tags = {"prewarm:node-queue-prefix": env["NODE_QUEUE_PREFIX"], "prewarm:node": "ip-10-0-9-9.ec2.internal"}
    own_policy = json.dumps({"Statement": [{"Effect": "Allow", "Principal": {"AWS": agent.arn},
                                            "Action": "sqs:SendMessage", "Resource": "*"}]})

    # The agents' role, with the stack's AgentPolicy, may not create a node queue, tagged as the stack's or not
    error = refused(agents.create_queue, QueueName=name, Attributes={"Policy": own_policy}, tags=tags)
    assert (error["Code"], error["Message"]) == ("AccessDenied", implicit(agent, "sqs:createqueue", arn))
    assert refused(agents.create_queue, QueueName=name)["Code"] == "AccessDenied"
    # record_status's role makes it, with the stack's policy and tags
    recorder = next(fn.identity for fn in local.functions.values() if fn.logical_id == "RecordStatusFunction")
    assert recorder is not None
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], dlq_arn=env["NODE_DLQ_ARN"],
                        sender_arns=env["NODE_QUEUE_SENDER_ARNS"].split(","), client=client(aws, "sqs", recorder))
    made = queues.provide_queue("ip-10-0-9-9.ec2.internal")
    assert made.created
    # ... which the agent finds and consumes, but may not tag or change
    assert agents.get_queue_url(QueueName=name)["QueueUrl"] == made.url
    agents.receive_message(QueueUrl=made.url, WaitTimeSeconds=0)
    assert refused(agents.tag_queue, QueueUrl=made.url, Tags={"prewarm:node": "x"})["Message"] == implicit(
        agent, "sqs:tagqueue", arn)
    assert refused(agents.set_queue_attributes, QueueUrl=made.url,
                   Attributes={"Policy": own_policy})["Message"] == implicit(agent, "sqs:setqueueattributes", arn)
    # A queue someone else made with their policy is set back by record_status' role (a hello) and by the
    # sweep's role (its check), each under its template policies
    other = node_queue_name(env["NODE_QUEUE_PREFIX"], "ip-10-0-9-8.ec2.internal")
    aws.client("sqs").create_queue(QueueName=other, Attributes={"Policy": own_policy})
    assert "Policy" in queues.provide_queue("ip-10-0-9-8.ec2.internal").repaired
    sweeper = next(fn.identity for fn in local.functions.values() if fn.logical_id == "SweepFunction")
    assert sweeper is not None
    swept = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], dlq_arn=env["NODE_DLQ_ARN"],
                       sender_arns=env["NODE_QUEUE_SENDER_ARNS"].split(","), client=client(aws, "sqs", sweeper))
    aws.client("sqs").set_queue_attributes(QueueUrl=made.url, Attributes={"Policy": own_policy})
    assert swept.repair_queue(made.url) == ("Policy",)


def test_the_daily_round_reads_the_jobs_it_re_pulls(stack: tuple[LocalStack, MotoServer]) -> None:
    # repull_daily lists jobs with BatchGetItem, which its role lacked: on AWS every round with a job failed
    local, aws = stack
    apply_manifest(DynamoJobStore(local.env()["TABLE_NAME"], client=aws.client("dynamodb")),
                   job_doc(), now=1.0)

    # Then the round reads the job (a round starts for running Never jobs only: none here)
    assert local.fire("repull_daily") == {"rounds_started": []}


def test_scheduler_holds_schedules_to_their_name_grant_the_passed_role_and_its_own_rules(aws: MotoServer) -> None:
    target = {"Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:run", "RoleArn": f"{ROLE}-scheduler-target"}
    grant = {"Effect": "Allow", "Action": ["scheduler:CreateSchedule", "scheduler:DeleteSchedule"],
             "Resource": f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/default/stack-cron-*"}
    passes = {"Effect": "Allow", "Action": "iam:PassRole", "Resource": target["RoleArn"],
              "Condition": {"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}}
    allowed = client(aws, "scheduler", role(aws, "scheduler", grant, passes))
    without_pass = client(aws, "scheduler", role(aws, "scheduler-no-pass", grant))
    schedule = {"GroupName": "default", "ScheduleExpression": "cron(* * * * ? *)",
                "FlexibleTimeWindow": {"Mode": "OFF"}, "Target": target}

    allowed.create_schedule(Name="stack-cron-a-0", **schedule)
    assert refused(allowed.create_schedule, Name="other-a-0", **schedule)["Code"] == "AccessDeniedException"
    assert refused(without_pass.create_schedule, Name="stack-cron-b-0", **schedule)["Code"] == "AccessDeniedException"
    # What Scheduler itself refuses: both day fields given, a day-of-week step, a name over 64, an unknown zone
    for bad in ({"ScheduleExpression": "cron(0 0 1 * MON *)"}, {"ScheduleExpression": "every minute"},
                {"ScheduleExpression": "cron(0 9 ? * 2/2 *)"}, {"ScheduleExpressionTimezone": "Mars/Olympus"}):
        assert refused(allowed.create_schedule, Name="stack-cron-c-0", **{**schedule, **bad})["Code"] == \
            "ValidationException"
    assert refused(allowed.create_schedule, Name="stack-cron-" + "d" * 60, **schedule)["Code"] == "ValidationException"
    allowed.delete_schedule(Name="stack-cron-a-0", GroupName="default")
