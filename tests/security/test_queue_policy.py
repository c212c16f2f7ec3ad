"""Only the stack's roles can send to node queues (a task there is a pull the node will run).

tests/unit/test_template.py checks that NODE_QUEUE_SENDER_ARNS lists exactly the roles granted
sqs:SendMessage on node queues. Here: the policy `NodeQueues` writes on each queue, evaluated the way
IAM does within one account (an explicit Deny wins; an Allow in either the queue policy or the
caller's identity policy suffices), and the template's list reaching the queues the deployed
functions create.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.messages import Hello
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from prewarm_devtools.sam.stack import ACCOUNT, LocalStack
from tests.support.manifests import job_doc

ROLE = f"arn:aws:iam::{ACCOUNT}:role/"
SENDERS = [ROLE + "stack-DispatchJobRole", ROLE + "stack-RecordStatusRole", ROLE + "stack-SweepRole"]
AGENT_ROLE = ROLE + "prewarm-agent"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _principal_matches(principal: Any, caller: str) -> bool:
    if principal == "*":
        return True
    return any(p in ("*", caller) for p in _as_list(principal.get("AWS", [])))


def _condition_holds(condition: Mapping[str, Any], caller: str) -> bool:
    for operator, keys in condition.items():
        for key, values in keys.items():
            assert (operator, key) == ("ArnNotEquals", "aws:PrincipalArn"), f"unexpected condition {operator} {key}"
            if any(fnmatch.fnmatchcase(caller, v) for v in _as_list(values)):
                return False
    return True


def may_send(policy: Mapping[str, Any] | None, caller: str, *, identity_allows: bool) -> bool:
    """IAM's decision for `caller` (a role, or a session of it: aws:PrincipalArn is the role) sending."""
    matching = [s for s in (policy or {}).get("Statement", [])
                if "sqs:SendMessage" in _as_list(s["Action"]) and _principal_matches(s["Principal"], caller)
                and _condition_holds(s.get("Condition", {}), caller)]
    if any(s["Effect"] == "Deny" for s in matching):
        return False
    return identity_allows or any(s["Effect"] == "Allow" for s in matching)


def queue_policy(queues: NodeQueues) -> dict[str, Any] | None:
    raw = queues._attributes().get("Policy")
    return json.loads(raw) if raw else None


@pytest.mark.parametrize("caller", SENDERS)
def test_each_listed_role_may_send_even_without_an_identity_grant(caller: str) -> None:
    policy = queue_policy(NodeQueues("pw", "https://sqs/1/status", sender_arns=SENDERS))
    assert may_send(policy, caller, identity_allows=False)


OTHERS = [ROLE + "developer", ROLE + "stack-OnImagePushRole", f"arn:aws:iam::{ACCOUNT}:root",
          f"arn:aws:iam::{ACCOUNT}:user/ci", "arn:aws:iam::999999999999:role/stack-SweepRole"]


@pytest.mark.parametrize("caller", OTHERS)
def test_any_other_principal_is_denied_even_with_an_identity_grant(caller: str) -> None:
    # Given a principal whose own IAM policy allows sqs:SendMessage on every queue
    policy = queue_policy(NodeQueues("pw", "https://sqs/1/status", sender_arns=SENDERS))
    # Then the node queue's policy still refuses it: an explicit Deny beats any Allow
    assert not may_send(policy, caller, identity_allows=True)


def test_the_policy_denies_exactly_the_principals_it_does_not_allow() -> None:
    policy = queue_policy(NodeQueues("pw", "https://sqs/1/status", sender_arns=SENDERS))
    assert policy is not None
    allow = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert [s["Principal"]["AWS"] for s in allow] == [SENDERS]
    assert [(s["Principal"], s["Action"], s["Condition"]) for s in deny] == [
        ("*", "sqs:SendMessage", {"ArnNotEquals": {"aws:PrincipalArn": SENDERS}})]


def test_without_senders_the_queue_has_no_policy_and_iam_alone_decides() -> None:
    assert queue_policy(NodeQueues("pw", "https://sqs/1/status")) is None
    assert may_send(None, ROLE + "anyone", identity_allows=True)


@pytest.fixture(scope="module")
def deployed() -> Iterator[dict[str, Any]]:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "labels": {}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    with MotoServer() as aws, KubeApiServer() as api, aws_environment(aws.url):
        api.seed_objects([node])
        stack = LocalStack(aws.url, stack_name="stack", parameters={
            "ClusterName": "local", "KubeApiEndpoint": api.url, "AgentRoleArn": AGENT_ROLE}).deploy()
        stack.prime_streams()
        yield {"stack": stack, "aws": aws}


@pytest.mark.integration
def test_the_stacks_sending_roles_alone_reach_the_policy_of_queues_record_status_makes(
    deployed: dict[str, Any],
) -> None:
    stack, aws = deployed["stack"], deployed["aws"]
    env = stack.env()
    # Given the deployed template, when the node's agent says hello (record_status makes its queue, with the
    # senders of the stack's NodeQueueSenderArns output)
    queues = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=aws.client("sqs"))
    hello = Hello(node="n0", architecture="amd64", queue_url=queues.queue_url("n0"))
    aws.client("sqs").send_message(QueueUrl=env["STATUS_QUEUE_URL"], MessageBody=hello.model_dump_json())
    stack.run_until_idle()
    assert queues.find_queue("n0") == queues.queue_url("n0")
    # and dispatch_job plans a job and sends the node its task
    apply_manifest(DynamoJobStore(env["TABLE_NAME"], client=aws.client("dynamodb")), job_doc(), now=1.0)
    stack.run_until_idle()
    raw = aws.client("sqs").get_queue_attributes(QueueUrl=queues.queue_url("n0"), AttributeNames=["Policy"])
    policy = json.loads(raw["Attributes"]["Policy"])
    # Then the queue admits the three sending functions' roles, and no one else
    senders = [stack.physical[f"{name}Role"].attrs["Arn"] for name in ("DispatchJob", "RecordStatus", "Sweep")]
    assert all(may_send(policy, caller, identity_allows=False) for caller in senders)
    # ... not the agents' role: a compromised node must not put tasks on another node's queue
    assert not may_send(policy, AGENT_ROLE, identity_allows=True)
    others = [stack.physical[f"{name}Role"].attrs["Arn"] for name in ("OnImagePush", "RepullDaily")]
    assert not any(may_send(policy, caller, identity_allows=True) for caller in [*others, ROLE + "developer"])
