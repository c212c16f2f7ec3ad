"""What each role of a template may do, as local mode hands it to the AWS limits layer (`sam/roles.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm_devtools.sam.intrinsics import Physical, Resolver
from prewarm_devtools.sam.roles import role_policies
from prewarm_devtools.sam.template import TemplateError

ACCOUNT = "123456789012"
ARN = f"arn:aws:iam::{ACCOUNT}:role/s-FnRole"


def statement(action: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]}


def resolver(resources: dict[str, Any], parameters: dict[str, Any] | None = None) -> Resolver:
    physical = {"FnRole": Physical("s-FnRole", {"Arn": ARN}),
                "Shared": Physical(f"arn:aws:iam::{ACCOUNT}:policy/s-Shared", {})}
    template = {"Parameters": parameters or {}, "Conditions": {"Never": {"Fn::Equals": ["a", "b"]}},
                "Resources": resources}
    return Resolver(template, parameters={}, physical=physical, stack_name="s", region="us-west-2", account=ACCOUNT)


def test_a_role_holds_its_inline_policies_its_template_managed_policies_and_those_naming_it() -> None:
    resources = {
        "FnRole": {"Type": "AWS::IAM::Role", "Properties": {
            "Policies": [{"PolicyName": "p", "PolicyDocument": statement("sqs:SendMessage")},
                         {"Fn::If": ["Never", {"PolicyName": "q", "PolicyDocument": statement("sqs:*")},
                                     {"Ref": "AWS::NoValue"}]}],
            "ManagedPolicyArns": [{"Ref": "Shared"},
                                  "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"]}},
        "Shared": {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": statement("ecr:*")}},
        "Extra": {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [{"Ref": "FnRole"}],
                                                              "PolicyDocument": statement("ssm:GetParameter")}},
    }
    found = role_policies(resolver(resources))
    assert [d["Statement"][0]["Action"] for d in found[ARN]] == ["sqs:SendMessage", "ecr:*", "ssm:GetParameter"]


def test_a_role_with_no_policies_is_known_to_have_none() -> None:
    assert role_policies(resolver({"FnRole": {"Type": "AWS::IAM::Role", "Properties": {}}})) == {ARN: []}


def test_an_aws_managed_policy_local_mode_does_not_know_fails_rather_than_granting_nothing() -> None:
    resources = {"FnRole": {"Type": "AWS::IAM::Role", "Properties": {
        "ManagedPolicyArns": ["arn:aws:iam::aws:policy/AmazonSQSFullAccess"]}}}
    with pytest.raises(TemplateError, match="AmazonSQSFullAccess"):
        role_policies(resolver(resources))


@pytest.mark.parametrize(("given", "refused"), [
    ("1", "Parameter 'StatusConcurrency' must be a number not less than 2"),
    ("1001", "Parameter 'StatusConcurrency' must be a number not greater than 1000"),
    ("ten", "Parameter 'StatusConcurrency' must be a number"),
])
def test_local_mode_refuses_a_number_parameter_outside_its_bounds_as_cloudformation_does(given: str,
                                                                                       refused: str) -> None:
    from prewarm_devtools.sam.template import load_template

    with pytest.raises(TemplateError) as caught:
        Resolver(load_template(), parameters={"ClusterName": "c", "StatusConcurrency": given}, physical={},
                 stack_name="s", region="us-west-2", account=ACCOUNT)

    assert str(caught.value) == refused
