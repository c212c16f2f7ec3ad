"""`replication events`: ECR sends `ECR Replication Action` in the destination Region, so every Region with
a registered cluster other than the stack's needs a rule on its default bus forwarding ECR's events to the
stack Region's default bus, where the stack's `EcrReplication` rule starts the held jobs
(docs/operations.md, "Replicas").

Per such Region, as you: `events:ListRules` and `events:ListTargetsByRule` find the enabled rules that
target the stack's bus; EventBridge itself (`events:TestEventPattern`) says whether a rule's pattern lets
a successful replication through, whatever filters it uses (prefix, anything-but, wildcard, `$or`); and
IAM's policy simulator (`iam:SimulatePrincipalPolicy`) with `iam:GetRole` says whether the target's role
may be assumed by EventBridge and may `events:PutEvents` to that bus (a target on another Region's bus
needs a role). The simulator does not see SCPs or permission boundaries, which may still refuse it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prewarm.domain.clusters import RegisteredCluster
from prewarm_cli.doctor.checks import CheckResult

NAME = "replication events"
DETAIL_TYPE = "ECR Replication Action"


def replication_event(region: str, account: str) -> dict[str, Any]:
    """A successful replication as ECR sends it in `region` (the fields a pattern may filter on)."""
    return {"version": "0", "id": "00000000-0000-0000-0000-000000000000", "detail-type": DETAIL_TYPE,
            "source": "aws.ecr", "account": account, "region": region,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "resources": [f"arn:aws:ecr:{region}:{account}:repository/prewarm-doctor"],
            "detail": {"result": "SUCCESS", "action-type": "REPLICATE", "repository-name": "prewarm-doctor",
                       "image-digest": "sha256:" + "0" * 64, "image-tag": "doctor", "source-account": account,
                       "source-region": region}}


# What a replication event's `detail` says of which replication: a rule may forward only some repositories'
# (their names, tags, digests, `resources`), which the check does not judge; the rest must let it through.
_WHICH_REPLICATION = ("repository-name", "image-tag", "image-digest", "source-account", "source-region")


def replication_filters(pattern: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """`pattern` without its filters on which repository or image (those say what is forwarded, not whether
    replications are), and whether it had any."""
    detail = pattern.get("detail")
    kept = {k: v for k, v in pattern.items() if k != "resources"}
    if isinstance(detail, Mapping):
        kept["detail"] = {k: v for k, v in detail.items() if k not in _WHICH_REPLICATION}
        if not kept["detail"]:
            del kept["detail"]
    return kept, kept != dict(pattern)


def forwards_replication(events: Any, pattern: str, region: str, account: str) -> bool | str:
    """Whether EventBridge matches a successful replication against `pattern` (a pattern it cannot read
    matches nothing), or why that could not be asked (denied to you)."""
    from botocore.exceptions import ClientError

    try:
        answer = events.test_event_pattern(EventPattern=pattern, Event=json.dumps(replication_event(region, account)))
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code == "InvalidEventPatternException":
            return False
        if code in _DENIED:
            return f"its pattern not checked ({code}: you need events:TestEventPattern)"
        raise
    return bool(answer.get("Result"))


_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


def _rules(events: Any) -> Iterator[dict[str, Any]]:
    token: dict[str, str] = {}
    while True:
        page = events.list_rules(EventBusName="default", **token)
        yield from page.get("Rules", [])
        if not page.get("NextToken"):
            return
        token = {"NextToken": page["NextToken"]}


def _targets(events: Any, rule: str) -> Iterator[dict[str, Any]]:
    token: dict[str, str] = {}
    while True:
        page = events.list_targets_by_rule(Rule=rule, EventBusName="default", **token)
        yield from page.get("Targets", [])
        if not page.get("NextToken"):
            return
        token = {"NextToken": page["NextToken"]}


def stack_bus(rule_arn: str, stack_region: str) -> str:
    """The stack Region's default bus, in the account and partition of a rule's ARN.

    >>> stack_bus("arn:aws:events:eu-west-1:123456789012:rule/fwd", "us-west-2")
    'arn:aws:events:us-west-2:123456789012:event-bus/default'
    """
    _, partition, _, _, account, _ = rule_arn.split(":", 5)
    return f"arn:{partition}:events:{stack_region}:{account}:event-bus/default"


def role_problem(iam: Any, role_arn: str | None, bus: str) -> str | None:
    """What keeps a target's role from forwarding to `bus` (None: nothing the simulator sees); a problem that
    starts `not checked` when IAM would not say (denied to you)."""
    from botocore.exceptions import ClientError

    if not role_arn:
        return "its target names no role (a target on another Region's bus needs one)"
    try:
        trust = iam.get_role(RoleName=role_arn.rsplit("/", 1)[-1])["Role"].get("AssumeRolePolicyDocument") or {}
        answer = iam.simulate_principal_policy(PolicySourceArn=role_arn, ActionNames=["events:PutEvents"],
                                               ResourceArns=[bus])
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code in {"NoSuchEntity", "NoSuchEntityException"}:
            return f"its role {role_arn} does not exist"
        if code in _DENIED:
            return f"not checked: its role {role_arn} ({code}: you need iam:GetRole and iam:SimulatePrincipalPolicy)"
        raise
    if isinstance(trust, str):
        from urllib.parse import unquote

        trust = json.loads(unquote(trust))
    if not _trusts_eventbridge(trust):
        return f"its role {role_arn} does not trust events.amazonaws.com (sts:AssumeRole)"
    decisions = [r.get("EvalDecision") for r in answer.get("EvaluationResults") or ()]
    if decisions != ["allowed"]:
        return f"its role {role_arn} may not events:PutEvents on {bus}"
    return None


def _trusts_eventbridge(document: Mapping[str, Any]) -> bool:
    statements = document.get("Statement") or []
    for statement in statements if isinstance(statements, list) else [statements]:
        if not isinstance(statement, Mapping) or statement.get("Effect") != "Allow":
            continue
        principal = statement.get("Principal")
        services = ["*"] if principal == "*" else _listed(principal.get("Service")) if isinstance(
            principal, Mapping) else []
        if ({"events.amazonaws.com", "*"} & set(services)
                and {"sts:AssumeRole", "sts:*", "*"} & set(_listed(statement.get("Action")))):
            return True
    return False


def _listed(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [] if value is None else [str(value)]


def forwarding_rule(events: Any, iam: Any, region: str, stack_region: str) -> tuple[str | None, list[str]]:
    """The rule of `region`'s default bus that forwards ECR's replication events to the stack Region's default
    bus through a role that may, with what could not be checked of it (None: none does); else what is wrong
    with each rule that targets that bus but does not forward them."""
    problems = []
    for rule in _rules(events):
        pattern = rule.get("EventPattern")
        if rule.get("State") != "ENABLED" or not pattern:
            continue
        bus = stack_bus(rule["Arn"], stack_region)
        targets = [t for t in _targets(events, rule["Name"]) if t.get("Arn") == bus]
        if not targets:
            continue
        try:
            judged, narrowed = replication_filters(json.loads(pattern))
        except (ValueError, AttributeError):
            judged, narrowed = {}, False
        forwards = forwards_replication(events, json.dumps(judged) if judged else pattern, region,
                                        rule["Arn"].split(":")[4])
        if forwards is False:
            problems.append(f"rule {rule['Name']}'s pattern does not match ECR's replication events")
            continue
        notes = [forwards] if isinstance(forwards, str) else []
        if narrowed:
            notes.append("it forwards only the repositories or images its pattern names")
        why = [role_problem(iam, t.get("RoleArn"), bus) for t in targets]
        if None in why or all(w and w.startswith("not checked") for w in why):
            notes += [w for w in dict.fromkeys(why) if w]
            return f"{rule['Name']}" + (f": {'; '.join(notes)}" if notes else ""), []
        problems += [f"rule {rule['Name']}: {w}" for w in dict.fromkeys(why) if w]
    return None, problems


def fix_for(region: str, stack_region: str) -> str:
    """The commands that forward `region`'s replication events to the stack's bus."""
    return (f"forward them: `aws events put-rule --region {region} --name prewarm-ecr-replication --event-pattern "
            f"'{{\"source\":[\"aws.ecr\"],\"detail-type\":[\"{DETAIL_TYPE}\"]}}'` then `aws events put-targets "
            f"--region {region} --rule prewarm-ecr-replication --targets 'Id=stack-bus,Arn=arn:aws:events:"
            f"{stack_region}:ACCOUNT:event-bus/default,RoleArn=ROLE'` (ROLE may call events:PutEvents on that bus; "
            "docs/operations.md, \"Replicas\")")


def check_replication_events(clusters: Sequence[RegisteredCluster], *, stack_region: str,
                             events: Callable[[str], Any], iam: Any) -> CheckResult:
    """Per Region of a registered cluster other than the stack's (`events(region)`: an EventBridge client
    there; `iam`: an IAM client): a rule forwarding ECR's replication events to the stack's bus. Without it
    the jobs of the clusters there that pull a replica wait for ever."""
    regions = sorted({c.region for c in clusters if c.region and c.region != stack_region})
    if not regions:
        return CheckResult(NAME, True, f"no registered cluster outside {stack_region}")
    missing, found, why = [], [], []
    for region in regions:
        rule, problems = forwarding_rule(events(region), iam, region, stack_region)
        if rule is None:
            missing.append(region)
            why += [f"{region}: {p}" for p in problems]
        else:
            found.append(f"{region} (rule {rule})")
    if missing:
        names = ", ".join(c.name for c in clusters if c.region in missing)
        fixes = "; ".join(fix_for(region, stack_region) for region in missing)
        return CheckResult(NAME, False, f"no rule in {', '.join(missing)} forwards ECR's replication events to "
                           f"the default bus of {stack_region}: jobs of {names} that pull a replica wait for "
                           "ever" + (f" ({'; '.join(why)})" if why else ""), fixes)
    return CheckResult(NAME, True, f"forwarded to {stack_region} from {', '.join(found)}")
