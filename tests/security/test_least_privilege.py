"""Every role and policy in template.yaml holds exactly what its code calls.

The calls are read from the code (`aws_calls`: a static call graph from each function's `app.py` and from
the agent's `main`, down to the boto3 operations of the adapters). What AWS itself does with a function's
role (its log group, traces, event sources, failure destinations) is read from the function's own
template configuration. An action no one calls fails, and so does a call the role does not grant.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from prewarm_devtools.sam.template import load_template
from tests.security.aws_calls import ROOT, iam_actions, index, reachable_operations

AGENT_ENTRY = "prewarm_agent.__main__.main"
AGENT_POLICY = "AgentPolicy"
# A warm snapshot's builder runs the agent in bake mode as the builders' instance role.
BUILDER_ENTRY = "prewarm_agent.baking.main"
BUILDER_ROLE = "BuilderRole"
# Actions the code reaches on a path it never takes, each with the check that proves it: the agent asks
# EcrTokenSource for its own role's tokens, never for an assumed role's.
# And its `StatusSink` (one method, `send`) is the status queue, never the control plane's `PacedQueues`,
# which the graph matches by that method and whose sends reserve a registry budget.
_NOT_PACED = "the agent's StatusSink is its StatusQueue, never PacedQueues (prewarm_agent.__main__)"
NOT_TAKEN = {AGENT_POLICY: {"sts:AssumeRole": "the agent's RegistryConfig(...) never names a role_arn",
                            "dynamodb:GetItem": _NOT_PACED, "dynamodb:UpdateItem": _NOT_PACED},
             BUILDER_ROLE: {"sts:AssumeRole": "the builder's RegistryConfig(...) never names a role_arn",
                            "ecr-public:GetAuthorizationToken": "a builder pulls public images anonymously",
                            "sts:GetServiceBearerToken": "a builder pulls public images anonymously"}}
# Pulls with an ECR token are authorised as the token's principal (managed policy
# AmazonEC2ContainerRegistryPullOnly: GetAuthorizationToken, BatchGetImage, GetDownloadUrlForLayer).
ECR_PULLS = {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
# A token carries its caller's permissions to whoever uses it, code that makes no boto3 call: the caller
# of the token action needs what the token's consumers do with it. Each with who those consumers are.
TOKEN_CARRIED: dict[str, tuple[frozenset[str], str]] = {
    "ecr:GetAuthorizationToken": (frozenset(ECR_PULLS), "containerd pulls with the token: the agent's CRI pulls, "
                                  "and the kubelet's with the refresher's pull secrets and the agents' copies"),
}


def _statements(document: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for statement in document.get("Statement", []):
        if "Fn::If" in statement:  # either branch may be deployed
            yield from (s for s in statement["Fn::If"][1:] if s != {"Ref": "AWS::NoValue"})
        else:
            yield statement


def granted(resource: Mapping[str, Any]) -> dict[str, str]:
    """Action → Sid of every Allow of a role's inline policies or of a managed policy."""
    props = resource["Properties"]
    documents = [p["PolicyDocument"] for p in props.get("Policies", [])] + (
        [props["PolicyDocument"]] if "PolicyDocument" in props else [])
    out: dict[str, str] = {}
    for document in documents:
        for statement in _statements(document):
            if statement.get("Effect") == "Allow":
                actions = statement["Action"]
                for action in [actions] if isinstance(actions, str) else actions:
                    out[action] = statement.get("Sid", "?")
    return out


def _ref(value: Any) -> str:
    return value["Fn::GetAtt"][0] if isinstance(value, dict) and "Fn::GetAtt" in value else str(value)


def platform_actions(template: Mapping[str, Any], function: Mapping[str, Any]) -> set[str]:
    """What Lambda does with the function's role, from the function's configuration (Lambda developer guide:
    execution role, "Using Lambda with Amazon SQS", "... with DynamoDB", destinations, X-Ray)."""
    props = function["Properties"]
    actions: set[str] = set()
    if "LoggingConfig" in props:
        actions |= {"logs:CreateLogStream", "logs:PutLogEvents"}
    if props.get("Tracing", template["Globals"]["Function"].get("Tracing")) == "Active":
        # AWSXRayDaemonWriteAccess, which the Lambda guide names for active tracing.
        actions |= {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                    "xray:GetSamplingTargets"}
    for event in props.get("Events", {}).values():
        if event["Type"] == "DynamoDB":
            actions |= {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator",
                        "dynamodb:ListStreams"}
            if event["Properties"].get("DestinationConfig"):
                actions.add("sqs:SendMessage")
        elif event["Type"] == "SQS":
            actions |= {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
    if props.get("EventInvokeConfig", {}).get("DestinationConfig", {}).get("OnFailure", {}).get("Type") == "SQS":
        actions.add("sqs:SendMessage")
    return actions


def code_actions(entries: list[str]) -> dict[str, set[str]]:
    """Action → where the code reached from `entries` calls it."""
    out: dict[str, set[str]] = {}
    for op in reachable_operations(entries):
        for action in iam_actions(op):
            out.setdefault(action, set()).add(op.where)
    return out


def roles_and_code(template: Mapping[str, Any]) -> dict[str, tuple[list[str], set[str]]]:
    """Each role or managed policy → (the code's entry points, what AWS does with it for that code)."""
    resources = template["Resources"]
    out: dict[str, tuple[list[str], set[str]]] = {}
    functions = index().funcs
    for function in resources.values():
        if function["Type"] != "AWS::Serverless::Function":
            continue
        name = function["Properties"]["CodeUri"].rstrip("/").rsplit("/", 1)[1]
        role = _ref(function["Properties"]["Role"])
        entries = [q for q in functions if q.startswith(f"functions.{name}.app.")]
        assert entries, f"{role}: no code in functions/{name}/app.py"
        out[role] = (entries, platform_actions(template, function))
    out[AGENT_POLICY] = ([AGENT_ENTRY], set())
    out[BUILDER_ROLE] = ([BUILDER_ENTRY], set())
    for name, resource in resources.items():
        if resource["Type"] == "AWS::IAM::Role" and _service_principal(resource) == SCHEDULER:
            # Scheduler runs the cron jobs' schedules as this role: their target is a function
            # (adapters/scheduler.py), which it invokes.
            out[name] = ([], {"lambda:InvokeFunction"})
    return out


SCHEDULER = "scheduler.amazonaws.com"


def _service_principal(role: Mapping[str, Any]) -> str:
    statements = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    return str(statements[0].get("Principal", {}).get("Service", ""))


def problems(template: Mapping[str, Any]) -> list[str]:
    """Every action granted with no caller and every call with no grant, by role."""
    found: list[str] = []
    resources = template["Resources"]
    mapped = roles_and_code(template)
    for name, resource in resources.items():
        if resource["Type"] in {"AWS::IAM::Role", "AWS::IAM::ManagedPolicy"} and name not in mapped:
            found.append(f"{name}: no code uses this role or policy")
    for name, (entries, platform) in sorted(mapped.items()):
        grants = granted(resources[name])
        for attached in resources.values():  # AWS::IAM::Policy resources naming the role in their Roles
            if attached["Type"] == "AWS::IAM::Policy" and {"Ref": name} in attached["Properties"]["Roles"]:
                grants.update(granted(attached))
        calls = code_actions(entries)
        for action in NOT_TAKEN.get(name, {}):
            calls.pop(action, None)
        needed = set(calls) | platform
        for action, (carried, _consumers) in TOKEN_CARRIED.items():
            if action in calls:
                needed |= carried
        for action in sorted(set(grants) - needed):
            found.append(f"{name}: {action} (statement {grants[action]}) has no caller")
        for action in sorted(set(calls) - set(grants)):
            found.append(f"{name}: {action} is called ({', '.join(sorted(calls[action]))}) but not granted")
        for action in sorted((needed - set(calls)) - set(grants)):
            found.append(f"{name}: {action} is needed by Lambda or by a token's consumers but not granted")
    return found


def test_every_granted_action_has_a_caller_and_every_call_a_grant() -> None:
    assert problems(load_template()) == []


def test_an_action_nothing_calls_fails_the_check() -> None:
    # sqs:SetQueueAttributes is what the agents' policy held before: no code calls it.
    template = copy.deepcopy(load_template())
    statements = template["Resources"][AGENT_POLICY]["Properties"]["PolicyDocument"]["Statement"]
    statements.append({"Sid": "Extra", "Effect": "Allow", "Action": "sqs:SetQueueAttributes", "Resource": "*"})
    assert problems(template) == [f"{AGENT_POLICY}: sqs:SetQueueAttributes (statement Extra) has no caller"]


def test_a_call_without_a_grant_fails_the_check() -> None:
    # The sweep lists jobs with BatchGetItem (the keys-only index, then the items).
    template = copy.deepcopy(load_template())
    for statement in template["Resources"]["SweepRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]:
        if statement.get("Sid") == "JobsTable":
            statement["Action"].remove("dynamodb:BatchGetItem")
    found = problems(template)
    assert len(found) == 1 and found[0].startswith("SweepRole: dynamodb:BatchGetItem is called (layers/")


def test_a_token_caller_without_what_its_token_is_used_for_fails_the_check() -> None:
    # The refresher's token goes into pull secrets and the agents' copies: pulls with it are its own.
    template = copy.deepcopy(load_template())
    statements = template["Resources"]["RefreshEcrCredentialsRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    statements["Statement"] = [s for s in statements["Statement"] if s.get("Sid") != "RegistryPulls"]
    assert problems(template) == [
        f"RefreshEcrCredentialsRole: {action} is needed by Lambda or by a token's consumers but not granted"
        for action in sorted(ECR_PULLS)]


@pytest.mark.parametrize(("role", "action"), sorted((r, a) for r, v in NOT_TAKEN.items() for a in v))
def test_every_path_said_not_taken_is_reached_in_code_and_still_not_taken(role: str, action: str) -> None:
    # Stale if the code no longer reaches the action at all ...
    entries = roles_and_code(load_template())[role][0]
    assert action in code_actions(entries), f"{role}: {action} is no longer reached; drop it from NOT_TAKEN"
    # ... and wrong if the agent now asks for an assumed role's token.
    for path in (ROOT / "agent" / "prewarm_agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "RegistryConfig":
                assert all(k.arg != "role_arn" for k in node.keywords), f"{path}: the agent names a role_arn"
