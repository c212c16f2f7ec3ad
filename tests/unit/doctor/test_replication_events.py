"""`prewarm doctor` checks that every Region with a registered cluster other than the stack's forwards ECR's
replication events (sent in the destination Region) to the stack's bus: without that rule the jobs of the
clusters there that pull a replica wait for ever (before: nothing said so until a job was seen waiting).
EventBridge decides whether a rule's pattern matches (`TestEventPattern`, whatever filters it uses) and IAM's
simulator whether the target's role may forward (the AWS limits layer stands in for both, which moto lacks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm.domain.clusters import RegisteredCluster
from prewarm_cli.doctor.replication import check_replication_events, forwards_replication
from tests.support.aws import mocked_aws

STACK, ELSEWHERE, ACCOUNT = "us-west-2", "eu-west-1", "123456789012"
STACK_BUS = f"arn:aws:events:{STACK}:{ACCOUNT}:event-bus/default"
CLUSTERS = [RegisteredCluster("home", region=STACK), RegisteredCluster("eu", endpoint="https://eu.example",
                                                                         region=ELSEWHERE)]
ROLE = f"arn:aws:iam::{ACCOUNT}:role/forwarding"
TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"},
                                                 "Action": "sts:AssumeRole"}]}
PUT_EVENTS = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "events:PutEvents",
                                                      "Resource": STACK_BUS}]}


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, aws_limits: Any) -> Iterator[Any]:
    if aws_limits is None:
        pytest.skip("the AWS limits layer is off (PREWARM_AWS_LIMITS): nothing stands in for TestEventPattern")
    with mocked_aws(monkeypatch, STACK):
        yield lambda region: boto3.client("events", region_name=region)


def role(*, trust: dict[str, Any] = TRUST, policy: dict[str, Any] | None = PUT_EVENTS) -> None:
    iam = boto3.client("iam")
    iam.create_role(RoleName="forwarding", AssumeRolePolicyDocument=json.dumps(trust))
    if policy is not None:
        iam.put_role_policy(RoleName="forwarding", PolicyName="put", PolicyDocument=json.dumps(policy))


def forward(events: Any, *, pattern: dict[str, Any] | None = None, target: str = STACK_BUS,
            state: str = "ENABLED", role_arn: str | None = ROLE) -> None:
    client = events(ELSEWHERE)
    client.put_rule(Name="fwd", State=state, EventPattern=json.dumps(
        pattern or {"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]}))
    client.put_targets(Rule="fwd", Targets=[{"Id": "bus", "Arn": target,
                                             **({"RoleArn": role_arn} if role_arn else {})}])


def check(events: Any) -> Any:
    return check_replication_events(CLUSTERS, stack_region=STACK, events=events, iam=boto3.client("iam"))


def test_a_region_with_a_cluster_and_no_forwarding_rule_fails_with_the_commands_that_fix_it(events: Any) -> None:
    result = check(events)
    assert result.failed
    assert result.detail == (f"no rule in {ELSEWHERE} forwards ECR's replication events to the default bus of "
                             f"{STACK}: jobs of eu that pull a replica wait for ever")
    assert f"aws events put-rule --region {ELSEWHERE}" in result.fix
    assert f"Arn=arn:aws:events:{STACK}:ACCOUNT:event-bus/default" in result.fix


@pytest.mark.parametrize("pattern", [
    {"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]},
    {"source": ["aws.ecr"]},
    {"source": [{"prefix": "aws."}], "detail-type": [{"prefix": "ECR "}]},
    {"source": ["aws.ecr"], "detail": {"result": [{"anything-but": "FAILURE"}]}},
], ids=["exact", "source-only", "prefix", "anything-but"])
def test_a_rule_forwarding_ecr_s_replication_events_through_a_role_that_may_passes(
        events: Any, pattern: dict[str, Any]) -> None:
    role()
    forward(events, pattern=pattern)
    result = check(events)
    assert result.ok and result.detail == f"forwarded to {STACK} from {ELSEWHERE} (rule fwd)"


@pytest.mark.parametrize(("pattern", "target", "state"), [
    ({"source": ["aws.ecr"], "detail-type": ["ECR Image Action"]}, STACK_BUS, "ENABLED"),
    ({"source": ["aws.ecr"], "detail": {"result": [{"anything-but": "SUCCESS"}]}}, STACK_BUS, "ENABLED"),
    ({"source": [{"prefix": "aws.s3"}]}, STACK_BUS, "ENABLED"),
    ({"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]}, STACK_BUS, "DISABLED"),
    ({"source": ["aws.ecr"]}, f"arn:aws:events:{ELSEWHERE}:{ACCOUNT}:event-bus/other", "ENABLED"),
], ids=["other-events", "anything-but-success", "other-prefix", "disabled", "other-bus"])
def test_a_rule_that_does_not_forward_them_to_the_stack_s_bus_fails(events: Any, pattern: dict[str, Any],
                                                                    target: str, state: str) -> None:
    role()
    forward(events, pattern=pattern, target=target, state=state)
    assert check(events).failed


@pytest.mark.parametrize(("make_role", "role_arn", "why"), [
    (lambda: role(policy=None), ROLE, f"its role {ROLE} may not events:PutEvents on {STACK_BUS}"),
    (lambda: role(policy={**PUT_EVENTS, "Statement": [{**PUT_EVENTS["Statement"][0], "Resource":
                                                       STACK_BUS.replace("default", "other")}]}), ROLE,
     f"its role {ROLE} may not events:PutEvents on {STACK_BUS}"),
    (lambda: role(trust={**TRUST, "Statement": [{**TRUST["Statement"][0], "Principal": {
        "Service": "lambda.amazonaws.com"}}]}), ROLE, f"its role {ROLE} does not trust events.amazonaws.com"),
    (lambda: None, ROLE, f"its role {ROLE} does not exist"),
    (lambda: role(), None, "its target names no role"),
], ids=["no-policy", "other-bus-only", "not-trusted", "no-role", "no-role-named"])
def test_a_rule_whose_role_may_not_forward_fails_naming_what_the_role_lacks(
        events: Any, make_role: Any, role_arn: str | None, why: str) -> None:
    make_role()
    forward(events, role_arn=role_arn)
    result = check(events)
    assert result.failed
    assert f"({ELSEWHERE}: rule fwd: {why}" in result.detail


def test_no_cluster_outside_the_stack_s_region_reads_nothing() -> None:
    def never(region: str) -> Any:
        raise AssertionError(f"asked {region}")

    result = check_replication_events(CLUSTERS[:1], stack_region=STACK, events=never, iam=None)
    assert result.ok and result.detail == f"no registered cluster outside {STACK}"


def test_eventbridge_decides_the_match_and_a_pattern_it_cannot_read_matches_nothing(events: Any) -> None:
    client = events(ELSEWHERE)
    assert forwards_replication(client, json.dumps({"source": ["aws.ecr"]}), ELSEWHERE, ACCOUNT)
    assert not forwards_replication(client, json.dumps({"source": ["aws.ecr"], "detail": {"result": ["FAILURE"]}}),
                                    ELSEWHERE, ACCOUNT)
    assert not forwards_replication(client, "{not json", ELSEWHERE, ACCOUNT)


def test_a_rule_forwarding_only_some_repositories_passes_saying_so(events: Any) -> None:
    role()
    forward(events, pattern={"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"],
                             "detail": {"repository-name": [{"prefix": "ml/"}], "result": ["SUCCESS"]}})
    result = check(events)
    assert result.ok and result.detail == (f"forwarded to {STACK} from {ELSEWHERE} (rule fwd: it forwards only the "
                                           "repositories or images its pattern names)")


class DeniedIam:
    """IAM refusing you what the role check asks."""

    def __getattr__(self, name: str) -> Any:
        def denied(**kwargs: Any) -> Any:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized"}}, name)

        return denied


def test_a_role_you_may_not_read_is_not_held_against_the_rule_and_the_check_says_so(events: Any) -> None:
    forward(events)
    result = check_replication_events(CLUSTERS, stack_region=STACK, events=events, iam=DeniedIam())
    assert result.ok
    assert result.detail == (f"forwarded to {STACK} from {ELSEWHERE} (rule fwd: not checked: its role {ROLE} "
                             "(AccessDenied: you need iam:GetRole and iam:SimulatePrincipalPolicy))")


def test_a_role_trusting_any_principal_trusts_eventbridge(events: Any) -> None:
    role(trust={**TRUST, "Statement": [{**TRUST["Statement"][0], "Principal": "*"}]})
    forward(events)
    assert check(events).ok
