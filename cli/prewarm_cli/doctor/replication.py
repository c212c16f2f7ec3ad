"""`replication events`: ECR sends `ECR Replication Action` in the destination Region, so every Region with
a registered cluster other than the stack's needs a rule on its default bus forwarding ECR's events to the
stack Region's default bus, where the stack's `EcrReplication` rule starts the held jobs
(docs/operations.md, "Replicas"). Read with `events:ListRules` and `events:ListTargetsByRule` in each
such Region, as you."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prewarm.domain.clusters import RegisteredCluster
from prewarm_cli.doctor.checks import CheckResult

NAME = "replication events"
DETAIL_TYPE = "ECR Replication Action"


def forwards_replication(pattern: Mapping[str, Any]) -> bool:
    """Whether an event pattern lets ECR's successful replication events through: source `aws.ecr`, and
    the detail type, action type and result not filtered out (exact values only: an anything-but or
    prefix filter is not read as a match)."""

    def allows(values: Any, wanted: str) -> bool:
        return values is None or (isinstance(values, list) and wanted in values)

    detail = pattern.get("detail") or {}
    return (isinstance(pattern.get("source"), list) and "aws.ecr" in pattern["source"]
            and allows(pattern.get("detail-type"), DETAIL_TYPE) and isinstance(detail, Mapping)
            and allows(detail.get("action-type"), "REPLICATE") and allows(detail.get("result"), "SUCCESS"))


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


def forwarding_rule(events: Any, stack_region: str) -> str | None:
    """The name of an enabled rule of this Region's default bus that sends ECR's replication events to
    the stack Region's default bus (None: none does)."""
    for rule in _rules(events):
        try:
            pattern = json.loads(rule.get("EventPattern") or "{}")
        except json.JSONDecodeError:
            continue
        if rule.get("State") != "ENABLED" or not isinstance(pattern, Mapping) or not forwards_replication(pattern):
            continue
        bus = stack_bus(rule["Arn"], stack_region)
        if any(t.get("Arn") == bus for t in _targets(events, rule["Name"])):
            return str(rule["Name"])
    return None


def fix_for(region: str, stack_region: str) -> str:
    """The commands that forward `region`'s replication events to the stack's bus."""
    return (f"forward them: `aws events put-rule --region {region} --name prewarm-ecr-replication --event-pattern "
            f"'{{\"source\":[\"aws.ecr\"],\"detail-type\":[\"{DETAIL_TYPE}\"]}}'` then `aws events put-targets "
            f"--region {region} --rule prewarm-ecr-replication --targets 'Id=stack-bus,Arn=arn:aws:events:"
            f"{stack_region}:ACCOUNT:event-bus/default,RoleArn=ROLE'` (ROLE may call events:PutEvents on that bus; "
            "docs/operations.md, \"Replicas\")")


def check_replication_events(clusters: Sequence[RegisteredCluster], *, stack_region: str,
                             events: Callable[[str], Any]) -> CheckResult:
    """Per Region of a registered cluster other than the stack's (`events(region)`: an EventBridge client
    there): a rule forwarding ECR's replication events to the stack's bus. Without it the jobs of the
    clusters there that pull a replica wait for ever."""
    regions = sorted({c.region for c in clusters if c.region and c.region != stack_region})
    if not regions:
        return CheckResult(NAME, True, f"no registered cluster outside {stack_region}")
    missing, found = [], []
    for region in regions:
        rule = forwarding_rule(events(region), stack_region)
        if rule is None:
            missing.append(region)
        else:
            found.append(f"{region} (rule {rule})")
    if missing:
        names = ", ".join(c.name for c in clusters if c.region in missing)
        fixes = "; ".join(fix_for(region, stack_region) for region in missing)
        return CheckResult(NAME, False, f"no rule in {', '.join(missing)} forwards ECR's replication events to "
                           f"the default bus of {stack_region}: jobs of {names} that pull a replica wait for "
                           "ever", fixes)
    return CheckResult(NAME, True, f"forwarded to {stack_region} from {', '.join(found)}")
