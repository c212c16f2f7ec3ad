"""What each IAM role of `template.yaml` may do: its identity policies, resolved as CloudFormation would.

A role's policies are its inline `Policies`, the template's `AWS::IAM::ManagedPolicy` resources it
names in `ManagedPolicyArns` (or that name it in their `Roles`), and `AWS::IAM::Policy` resources that
name it. Local mode hands them to the AWS limits layer with each role's access key, so every function
runs under exactly the permissions it ships with (`prewarm_devtools.aws_limits.policy`).

AWS managed policies are not in the template. Those a role may name are listed here with why their
grants do not matter locally; any other fails, so a template change local mode cannot follow is seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prewarm_devtools.sam.intrinsics import Resolver
from prewarm_devtools.sam.template import TemplateError

# They grant CloudWatch Logs and, for functions in a VPC, EC2 network interfaces: services nothing calls locally.
_AWS_MANAGED_NOT_EVALUATED = ("service-role/AWSLambdaVPCAccessExecutionRole",
                              "service-role/AWSLambdaBasicExecutionRole")

Document = dict[str, Any]


def policy_document(resolver: Resolver, logical: str) -> Document:
    """The resolved document of the template's policy resource `logical` (an `AWS::IAM::ManagedPolicy`)."""
    resource = resolver.template["Resources"].get(logical)
    if resource is None or resource["Type"] not in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
        raise TemplateError(f"{logical} is no AWS::IAM::ManagedPolicy or AWS::IAM::Policy of the template")
    document: Document = resolver.resolve(resource["Properties"]["PolicyDocument"])
    return document


def role_policies(resolver: Resolver) -> dict[str, list[Document]]:
    """Role ARN → its identity policies, for every `AWS::IAM::Role` of the template whose Condition holds."""
    resources = {logical: res for logical, res in resolver.template["Resources"].items()
                 if "Condition" not in res or resolver.condition(res["Condition"])}
    roles = {logical: res for logical, res in resources.items() if res["Type"] == "AWS::IAM::Role"}
    arns = {logical: resolver.get_att([logical, "Arn"]) for logical in roles}
    by_ref = {str(resolver.ref(logical)): arns[logical] for logical in roles}
    managed = {str(resolver.ref(logical)): logical for logical, res in resources.items()
               if res["Type"] == "AWS::IAM::ManagedPolicy"}
    policies: dict[str, list[Document]] = {arn: [] for arn in arns.values()}
    for logical, res in roles.items():
        props = _resolved(resolver, res, ("Policies", "ManagedPolicyArns"))
        policies[arns[logical]] += [p["PolicyDocument"] for p in props.get("Policies", [])]
        for arn in props.get("ManagedPolicyArns", []):
            if arn in managed:
                policies[arns[logical]].append(policy_document(resolver, managed[arn]))
            elif not str(arn).endswith(_AWS_MANAGED_NOT_EVALUATED):
                raise TemplateError(f"{logical}: managed policy {arn} is neither the template's nor one local mode "
                                    "knows grants nothing it evaluates (sam/roles.py)")
    for logical, res in resources.items():
        if res["Type"] not in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
            continue
        for role in _resolved(resolver, res, ("Roles",)).get("Roles", []):
            if str(role) not in by_ref:
                raise TemplateError(f"{logical}: role {role} is not a role of the template")
            policies[by_ref[str(role)]].append(policy_document(resolver, logical))
    return policies


def _resolved(resolver: Resolver, resource: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    props = resource.get("Properties", {})
    resolved: dict[str, Any] = resolver.resolve({name: props[name] for name in names if name in props})
    return resolved
