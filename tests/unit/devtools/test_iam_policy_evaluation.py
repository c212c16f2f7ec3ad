"""The local stage's IAM evaluation within one account (`prewarm_devtools.aws_limits.policy.evaluate`), as
the IAM User Guide's "Policy evaluation for requests within a single account" has it: an explicit Deny
anywhere refuses; otherwise an Allow in the identity or the resource policy grants; else implicit deny."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm_devtools.aws_limits import PolicyError, Principals, evaluate

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/stack-SweepRole"
OTHER = f"arn:aws:iam::{ACCOUNT}:role/stack-OnImagePushRole"
QUEUE = f"arn:aws:sqs:us-west-2:{ACCOUNT}:stack-node-n0"
TABLE = f"arn:aws:dynamodb:us-west-2:{ACCOUNT}:table/stack-JobsTable"


def allow(action: Any, resource: Any = "*", **more: Any) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource,
                                                     **more}]}


def deny(action: Any, resource: Any = "*", **more: Any) -> dict[str, Any]:
    return {"Statement": [{"Effect": "Deny", "Action": action, "Resource": resource, **more}]}


def test_an_identity_allow_grants_the_action_on_its_resource() -> None:
    identity = [allow("sqs:ReceiveMessage", QUEUE)]
    assert evaluate("sqs:ReceiveMessage", QUEUE, ROLE, identity=identity).allowed


def test_no_allow_is_an_implicit_deny_with_awss_message() -> None:
    identity = [allow("sqs:ReceiveMessage", QUEUE)]
    decision = evaluate("sqs:DeleteMessage", QUEUE, ROLE, identity=identity)
    assert not decision.allowed and not decision.explicit  # the simulator's implicitDeny
    assert decision.message(ROLE, "sqs:DeleteMessage", QUEUE) == (
        f"User: {ROLE} is not authorized to perform: sqs:DeleteMessage on resource: {QUEUE} "
        "because no identity-based policy allows the sqs:DeleteMessage action")


def test_a_role_with_no_policies_may_do_nothing_and_one_with_unknown_policies_is_not_evaluated() -> None:
    assert not evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[]).allowed
    assert evaluate("sqs:SendMessage", QUEUE, ROLE, identity=None).allowed


def test_an_allow_on_another_resource_grants_nothing() -> None:
    identity = [allow("sqs:*", f"arn:aws:sqs:us-west-2:{ACCOUNT}:other-*")]
    assert not evaluate("sqs:SendMessage", QUEUE, ROLE, identity=identity).allowed


def test_an_explicit_deny_in_an_identity_policy_beats_any_allow() -> None:
    identity = [allow("sqs:*"), deny("sqs:DeleteQueue", QUEUE)]
    resource_policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": ROLE}, "Action": "sqs:*",
                                      "Resource": QUEUE}]}
    decision = evaluate("sqs:DeleteQueue", QUEUE, ROLE, identity=identity, resource_policy=resource_policy)
    assert decision == evaluate("sqs:DeleteQueue", QUEUE, ROLE, identity=identity)
    assert decision.reason == "with an explicit deny in an identity-based policy"
    assert decision.explicit  # the simulator's explicitDeny
    assert evaluate("sqs:SendMessage", QUEUE, ROLE, identity=identity).allowed


def test_an_explicit_deny_in_the_resource_policy_beats_the_identity_allow_and_holds_for_unknown_callers() -> None:
    resource_policy = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
                                      "Resource": "*",
                                      "Condition": {"ArnNotEquals": {"aws:PrincipalArn": [OTHER]}}}]}
    for identity in ([allow("sqs:SendMessage", QUEUE)], None):
        decision = evaluate("sqs:SendMessage", QUEUE, ROLE, identity=identity, resource_policy=resource_policy)
        assert decision.reason == "with an explicit deny in a resource-based policy" and decision.explicit


def test_a_resource_policy_that_names_the_role_grants_without_an_identity_allow() -> None:
    resource_policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": [ROLE]},
                                      "Action": "sqs:SendMessage", "Resource": QUEUE}]}
    assert evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[], resource_policy=resource_policy).allowed
    assert evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[],
                    resource_policy={"Statement": [{**resource_policy["Statement"][0], "Principal": "*"}]}).allowed
    # ... but only the role it names, and only the action it names
    assert not evaluate("sqs:SendMessage", QUEUE, OTHER, identity=[], resource_policy=resource_policy).allowed
    assert not evaluate("sqs:PurgeQueue", QUEUE, ROLE, identity=[], resource_policy=resource_policy).allowed


@pytest.mark.parametrize("account", [ACCOUNT, f"arn:aws:iam::{ACCOUNT}:root"])
def test_a_resource_policy_that_names_the_account_leaves_the_grant_to_identity_policies(account: str) -> None:
    # "AWS account principals": naming the account delegates to it; its principals need an IAM grant
    resource_policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": account},
                                      "Action": "sqs:SendMessage", "Resource": QUEUE}]}
    assert not evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[], resource_policy=resource_policy).allowed
    assert evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[allow("sqs:SendMessage", QUEUE)],
                    resource_policy=resource_policy).allowed


@pytest.mark.parametrize(("statement", "allowed"), [
    ({"Action": "sqs:*"}, True),
    ({"Action": "SQS:receivemessage"}, True),
    ({"Action": "sqs:Receive*"}, True),
    ({"Action": "sqs:Receive?essage"}, True),
    ({"Action": ["sqs:SendMessage", "sqs:ReceiveMessage"]}, True),
    ({"Action": "sqs:Delete*"}, False),
    ({"NotAction": "sqs:ReceiveMessage"}, False),
    ({"NotAction": "sqs:DeleteQueue"}, True),
    ({"Resource": f"arn:aws:sqs:*:{ACCOUNT}:stack-node-*"}, True),
    ({"Resource": "arn:aws:sqs:us-west-2:999999999999:*"}, False),
    ({"NotResource": QUEUE}, False),
    ({"Condition": {"StringEquals": {"aws:PrincipalAccount": ACCOUNT}}}, True),
    ({"Condition": {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/stack-*"}}}, True),
    ({"Condition": {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/other-*"}}}, False),
    # A key the request lacks: a positive operator does not hold, IfExists and negated ones do
    ({"Condition": {"StringEquals": {"aws:SourceVpce": "vpce-1"}}}, False),
    ({"Condition": {"StringEqualsIfExists": {"aws:SourceVpce": "vpce-1"}}}, True),
])
def test_an_identity_allow_applies_as_iam_reads_its_elements(statement: dict[str, Any], allowed: bool) -> None:
    base = {"Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": QUEUE}
    negated = {name.removeprefix("Not") for name in statement if name.startswith("Not")}
    policy = {"Statement": [{**{k: v for k, v in base.items() if k not in negated}, **statement}]}
    assert evaluate("sqs:ReceiveMessage", QUEUE, ROLE, identity=[policy]).allowed is allowed


def test_a_statement_may_stand_alone_and_policies_add_up() -> None:
    single = {"Statement": {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": TABLE}}
    assert evaluate("dynamodb:GetItem", TABLE, ROLE, identity=[single]).allowed
    both = [single, allow("dynamodb:Query", [TABLE, f"{TABLE}/index/*"])]
    assert evaluate("dynamodb:Query", f"{TABLE}/index/kinds", ROLE, identity=both).allowed
    assert not evaluate("dynamodb:Scan", TABLE, ROLE, identity=both).allowed


def test_an_action_without_a_resource_type_needs_a_star_resource() -> None:
    assert evaluate("sqs:ListQueues", "*", ROLE, identity=[allow("sqs:ListQueues")]).allowed
    assert not evaluate("sqs:ListQueues", "*", ROLE, identity=[allow("sqs:ListQueues", QUEUE)]).allowed


def test_a_condition_it_does_not_implement_is_an_error_not_a_pass() -> None:
    policy = allow("sqs:*", Condition={"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}})
    with pytest.raises(PolicyError, match="DateGreaterThan"):
        evaluate("sqs:SendMessage", QUEUE, ROLE, identity=[policy])


def test_principals_know_keys_and_the_policies_of_their_arn() -> None:
    principals = Principals()
    principals.add("KEY1", ROLE, [allow("sqs:*")])
    principals.add("KEY2", OTHER)
    assert principals.arn("KEY1") == ROLE and principals.policies(ROLE) == (allow("sqs:*"),)
    assert principals.policies(OTHER) is None  # registered without policies: not evaluated
    assert principals.arn("unknown") is None and principals.arn(None) is None
    principals.remove("KEY1")
    assert principals.arn("KEY1") is None and principals.policies(ROLE) is None


def test_set_operators_over_a_multivalued_key_and_absent_keys() -> None:
    keys = {"ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}}
    allow = [{"Statement": [{"Effect": "Allow", "Action": "sqs:CreateQueue", "Resource": "*", "Condition": keys}]}]

    def allowed(context: dict[str, Any] | None) -> bool:
        return evaluate("sqs:CreateQueue", "arn:aws:sqs:r:1:q", "arn:aws:iam::1:role/r", identity=allow,
                        context=context).allowed

    assert allowed({"aws:TagKeys": ("a",)}) and allowed({"aws:TagKeys": ("a", "b")})
    assert not allowed({"aws:TagKeys": ("a", "c")})
    assert allowed(None)  # ForAllValues holds for an absent set, as in IAM
    any_value = [{"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*",
                                 "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}}]}]
    assert evaluate("sqs:TagQueue", "*", "arn:aws:iam::1:role/r", identity=any_value,
                    context={"aws:TagKeys": ("z", "a")}).allowed
    assert not evaluate("sqs:TagQueue", "*", "arn:aws:iam::1:role/r", identity=any_value).allowed


def test_a_request_tag_condition_reads_the_request_and_names_are_case_insensitive() -> None:
    allow = [{"Statement": [{"Effect": "Allow", "Action": "sqs:DeleteQueue", "Resource": "*",
                             "Condition": {"StringEquals": {"aws:ResourceTag/Stack": "mine"}}}]}]

    def allowed(context: dict[str, Any]) -> bool:
        return evaluate("sqs:DeleteQueue", "*", "arn:aws:iam::1:role/r", identity=allow, context=context).allowed

    assert allowed({"aws:resourcetag/stack": "mine"})
    assert not allowed({"aws:ResourceTag/Stack": "theirs"})
    assert not allowed({})
