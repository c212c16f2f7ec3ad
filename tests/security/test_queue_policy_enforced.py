"""Local mode refuses a send the node-queue policy denies, as AWS does: each local principal signs with
its own access key (each function role, the agents' role, the operator), and the AWS limits layer
evaluates the queue's policy for it (`prewarm_devtools.aws_limits.policy`)."""

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
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.aws_limits import PolicyError, explicit_deny
from prewarm_devtools.aws_limits.authorization import Authorization
from prewarm_devtools.aws_limits.sqs import access_key_id
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import ACCOUNT, OPERATOR, REGION, LocalIdentity, MotoServer, aws_environment
from prewarm_devtools.sam.stack import LocalStack
from tests.support.manifests import job_doc

ROLE = f"arn:aws:iam::{ACCOUNT}:role/"
SENDERS = [ROLE + "stack-DispatchJobRole", ROLE + "stack-RecordStatusRole", ROLE + "stack-SweepRole",
           ROLE + "stack-agent"]
QUEUE = f"arn:aws:sqs:{REGION}:{ACCOUNT}:pw-n0"
NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})


def _node_queue_policy(senders: list[str]) -> dict[str, Any]:
    raw = NodeQueues("pw", "https://sqs/1/status", sender_arns=senders)._attributes()["Policy"]
    policy: dict[str, Any] = json.loads(raw)
    return policy


# -- the evaluation, on its own --------------------------------------------------------------------

def test_the_node_queue_policy_denies_every_principal_but_its_senders() -> None:
    policy = _node_queue_policy(SENDERS)
    for sender in SENDERS:
        assert explicit_deny(policy, "sqs:SendMessage", QUEUE, sender) is None
    for other in [OPERATOR.arn, ROLE + "stack-OnImagePushRole", f"arn:aws:iam::{ACCOUNT}:root",
                  "arn:aws:iam::999999999999:role/stack-SweepRole"]:
        denied = explicit_deny(policy, "sqs:SendMessage", QUEUE, other)
        assert denied is not None and denied["Sid"] == "NobodyElseSends"
    # Receiving is not what the Deny is about
    assert explicit_deny(policy, "sqs:ReceiveMessage", QUEUE, OPERATOR.arn) is None


@pytest.mark.parametrize(("statement", "caller", "denied"), [
    ({"Action": "sqs:*"}, OPERATOR.arn, True),
    ({"Action": "SQS:sendmessage"}, OPERATOR.arn, True),
    ({"Action": "sqs:Receive*"}, OPERATOR.arn, False),
    ({"NotAction": "sqs:SendMessage"}, OPERATOR.arn, False),
    ({"Principal": {"AWS": ACCOUNT}}, OPERATOR.arn, True),
    ({"Principal": {"AWS": "arn:aws:iam::999999999999:root"}}, OPERATOR.arn, False),
    ({"NotPrincipal": {"AWS": [OPERATOR.arn]}}, OPERATOR.arn, False),
    ({"Resource": "arn:aws:sqs:*:*:pw-*"}, OPERATOR.arn, True),
    ({"Resource": "arn:aws:sqs:*:*:other-*"}, OPERATOR.arn, False),
    ({"Condition": {"ArnNotLike": {"aws:PrincipalArn": ROLE + "stack-*"}}}, ROLE + "stack-SweepRole", False),
    ({"Condition": {"ArnNotLike": {"aws:PrincipalArn": ROLE + "stack-*"}}}, OPERATOR.arn, True),
    ({"Condition": {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:user/oper?tor"}}}, OPERATOR.arn, True),
    ({"Condition": {"StringNotEquals": {"aws:PrincipalAccount": [ACCOUNT, "1"]}}}, OPERATOR.arn, False),
    ({"Condition": {"StringEquals": {"aws:PrincipalAccount": ACCOUNT},
                    "ArnNotEquals": {"aws:PrincipalArn": OPERATOR.arn}}}, OPERATOR.arn, False),
    # A key the request lacks: a negated operator holds, a positive one does not unless IfExists
    ({"Condition": {"StringNotEquals": {"aws:SourceArn": "x"}}}, OPERATOR.arn, True),
    ({"Condition": {"StringEquals": {"aws:SourceArn": "x"}}}, OPERATOR.arn, False),
    ({"Condition": {"StringEqualsIfExists": {"aws:SourceArn": "x"}}}, OPERATOR.arn, True),
])
def test_a_deny_applies_as_iam_reads_its_elements(statement: dict[str, Any], caller: str, denied: bool) -> None:
    base = {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}
    negated = {name.removeprefix("Not") for name in statement if name.startswith("Not")}
    policy = {"Statement": [{**{k: v for k, v in base.items() if k not in negated}, **statement}]}
    assert (explicit_deny(policy, "sqs:SendMessage", QUEUE, caller) is not None) is denied


def test_an_operator_it_does_not_implement_is_an_error_not_a_pass() -> None:
    policy = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "*",
                             "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}}}]}
    with pytest.raises(PolicyError, match="DateGreaterThan"):
        explicit_deny(policy, "sqs:SendMessage", QUEUE, OPERATOR.arn)


# -- through boto3, on local mode's moto server ----------------------------------------------------

@pytest.fixture
def aws() -> Iterator[MotoServer]:
    with MotoServer(limits=True) as server:
        for arn in SENDERS:
            LocalIdentity.of_role(arn).register()
        yield server


def _sqs(aws: MotoServer, identity: LocalIdentity) -> Any:
    return boto3.client("sqs", region_name=REGION, endpoint_url=aws.url, aws_access_key_id=identity.access_key_id,
                        aws_secret_access_key=identity.secret_access_key, config=NO_RETRIES)


def _node_queue(aws: MotoServer, senders: list[str]) -> str:
    status = aws.client("sqs").create_queue(QueueName="pw-status")["QueueUrl"]
    return NodeQueues("pw", status, sender_arns=senders, client=aws.client("sqs")).ensure_queue("n0")


@pytest.mark.integration
def test_the_operators_send_to_a_node_queue_is_refused_with_access_denied(aws: MotoServer) -> None:
    url = _node_queue(aws, SENDERS)
    with pytest.raises(ClientError) as refused:
        _sqs(aws, OPERATOR).send_message(QueueUrl=url, MessageBody="{}")
    error = refused.value.response["Error"]
    assert error["Code"] == "AccessDenied"
    assert error["Message"] == (
        f"User: {OPERATOR.arn} is not authorized to perform: sqs:sendmessage on resource: "
        f"{QUEUE} with an explicit deny in a resource-based policy")
    # A batch is authorized as sqs:SendMessage too
    with pytest.raises(ClientError, match="AccessDenied"):
        _sqs(aws, OPERATOR).send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "{}"}])
    assert "Messages" not in aws.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=0)


@pytest.mark.integration
def test_a_sending_roles_send_and_batch_pass(aws: MotoServer) -> None:
    url = _node_queue(aws, SENDERS)
    sweep = LocalIdentity.of_role(ROLE + "stack-SweepRole")
    _sqs(aws, sweep).send_message(QueueUrl=url, MessageBody="{}")
    _sqs(aws, sweep).send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "{}"}])
    got = aws.client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    assert len(got["Messages"]) == 2


@pytest.mark.integration
def test_the_agents_role_may_send_only_when_the_stack_lists_it(aws: MotoServer) -> None:
    # The policy lists the agents' role when the stack was given AgentRoleArn, and only then
    agent = LocalIdentity.of_role(ROLE + "stack-agent", "AG")
    agent.register()
    listed = _node_queue(aws, SENDERS)
    _sqs(aws, agent).send_message(QueueUrl=listed, MessageBody="{}")
    unlisted = NodeQueues("pw", listed, sender_arns=SENDERS[:3], client=aws.client("sqs")).ensure_queue("n1")
    with pytest.raises(ClientError, match="AccessDenied"):
        _sqs(aws, agent).send_message(QueueUrl=unlisted, MessageBody="{}")


@pytest.mark.integration
def test_a_queue_without_a_policy_accepts_anyone(aws: MotoServer) -> None:
    url = _node_queue(aws, [])
    _sqs(aws, OPERATOR).send_message(QueueUrl=url, MessageBody="{}")
    assert aws.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"]


@pytest.mark.integration
def test_a_key_the_layer_does_not_know_is_mocks_default_caller_and_not_evaluated(aws: MotoServer) -> None:
    url = _node_queue(aws, SENDERS)
    _sqs(aws, LocalIdentity("arn:unknown", "testing", "testing")).send_message(QueueUrl=url, MessageBody="{}")


# -- through LocalStack: each function signs as its role -------------------------------------------

@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalStack, MotoServer, list[str]]]:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "labels": {}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    with MotoServer(limits=True) as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_objects([node])
        # Who each send to a node queue came from, as the layer read it from the request's key
        callers: list[str] = []
        check = Authorization.refusal

        def recording(self: Authorization, handler: Any) -> Any:
            if handler.service_name == "sqs" and handler._get_action() in ("SendMessage", "SendMessageBatch") \
                    and "-node-" in handler._get_queue_name():
                callers.append(str(self.layer.principals.arn(access_key_id(handler.headers))))
            return check(self, handler)

        monkeypatch.setattr(Authorization, "refusal", recording)
        stack = LocalStack(aws.url, stack_name="stack", parameters={
            "ClusterName": "local", "KubeApiEndpoint": api.url}).deploy()
        stack.prime_streams()
        yield stack, aws, callers


@pytest.mark.integration
def test_a_function_sends_as_its_role_and_the_operator_is_refused(
    stack: tuple[LocalStack, MotoServer, list[str]],
) -> None:
    local, aws, callers = stack
    env = local.env()
    # Given the node's agent's queue, created as the agent creates it
    NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=aws.client("sqs"),
               sender_arns=env["NODE_QUEUE_SENDER_ARNS"].split(",")).ensure_queue("n0")
    # And a job applied by the operator
    apply_manifest(DynamoJobStore(env["TABLE_NAME"], client=aws.client("dynamodb")), job_doc(), now=1.0)
    # When the stack runs: dispatch_job plans it and sends the node its task
    local.run_until_idle()
    url = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"]).queue_url("n0")
    got = aws.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"]
    # Then the task arrived, sent by dispatch_job's role
    assert json.loads(got[0]["Body"])["kind"] == "task"
    assert set(callers) == {local.physical["DispatchJobRole"].attrs["Arn"]}
    # And the operator's own send to that queue is refused
    with pytest.raises(ClientError, match="AccessDenied"):
        aws.client("sqs").send_message(QueueUrl=url, MessageBody="{}")


@pytest.mark.integration
def test_each_function_runs_with_its_roles_key(stack: tuple[LocalStack, MotoServer, list[str]]) -> None:
    local, _aws, _callers = stack
    keys = {fn.logical_id: fn.identity.access_key_id for fn in local.functions.values() if fn.identity}
    assert len(set(keys.values())) == len(local.functions)
    assert all(key.startswith("LOCALFN") for key in keys.values())
    senders = local.function("dispatch_job").env["NODE_QUEUE_SENDER_ARNS"].split(",")
    assert senders == [local.physical[f"{name}Role"].attrs["Arn"] for name in ("DispatchJob", "RecordStatus", "Sweep")]
