"""`prewarm doctor` checks that every Region with a registered cluster other than the stack's forwards ECR's
replication events (sent in the destination Region) to the stack's bus: without that rule the jobs of the
clusters there that pull a replica wait for ever (before: nothing said so until a job was seen waiting)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from prewarm.domain.clusters import RegisteredCluster
from prewarm_cli.doctor.replication import check_replication_events, forwards_replication

STACK, ELSEWHERE, ACCOUNT = "us-west-2", "eu-west-1", "123456789012"
STACK_BUS = f"arn:aws:events:{STACK}:{ACCOUNT}:event-bus/default"
CLUSTERS = [RegisteredCluster("home", region=STACK), RegisteredCluster("eu", endpoint="https://eu.example",
                                                                         region=ELSEWHERE)]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_DEFAULT_REGION": STACK, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield lambda region: boto3.client("events", region_name=region)


def forward(events: Any, *, pattern: dict[str, Any] | None = None, target: str = STACK_BUS,
            state: str = "ENABLED") -> None:
    client = events(ELSEWHERE)
    client.put_rule(Name="fwd", State=state, EventPattern=json.dumps(
        pattern or {"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]}))
    client.put_targets(Rule="fwd", Targets=[{"Id": "bus", "Arn": target,
                                             "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/forwarding"}])


def check(events: Any) -> Any:
    return check_replication_events(CLUSTERS, stack_region=STACK, events=events)


def test_a_region_with_a_cluster_and_no_forwarding_rule_fails_with_the_commands_that_fix_it(events: Any) -> None:
    result = check(events)
    assert result.failed
    assert result.detail == (f"no rule in {ELSEWHERE} forwards ECR's replication events to the default bus of "
                             f"{STACK}: jobs of eu that pull a replica wait for ever")
    assert f"aws events put-rule --region {ELSEWHERE}" in result.fix
    assert f"Arn=arn:aws:events:{STACK}:ACCOUNT:event-bus/default" in result.fix


def test_a_rule_forwarding_ecr_s_replication_events_to_the_stack_s_bus_passes(events: Any) -> None:
    forward(events)
    result = check(events)
    assert result.ok and result.detail == f"forwarded to {STACK} from {ELSEWHERE} (rule fwd)"


@pytest.mark.parametrize(("pattern", "target", "state"), [
    ({"source": ["aws.ecr"], "detail-type": ["ECR Image Action"]}, STACK_BUS, "ENABLED"),
    ({"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"]}, STACK_BUS, "DISABLED"),
    ({"source": ["aws.ecr"]}, f"arn:aws:events:{ELSEWHERE}:{ACCOUNT}:event-bus/other", "ENABLED"),
], ids=["other-events", "disabled", "other-bus"])
def test_a_rule_that_does_not_forward_them_to_the_stack_s_bus_fails(events: Any, pattern: dict[str, Any],
                                                                    target: str, state: str) -> None:
    forward(events, pattern=pattern, target=target, state=state)
    assert check(events).failed


def test_no_cluster_outside_the_stack_s_region_reads_nothing() -> None:
    def never(region: str) -> Any:
        raise AssertionError(f"asked {region}")

    result = check_replication_events(CLUSTERS[:1], stack_region=STACK, events=never)
    assert result.ok and result.detail == f"no registered cluster outside {STACK}"


def test_a_pattern_forwards_replications_unless_it_filters_them_out() -> None:
    assert forwards_replication({"source": ["aws.ecr"]})
    assert forwards_replication({"source": ["aws.ecr"], "detail-type": ["ECR Replication Action"],
                                 "detail": {"action-type": ["REPLICATE"], "result": ["SUCCESS"]}})
    assert not forwards_replication({"source": ["aws.s3"]})
    assert not forwards_replication({"source": ["aws.ecr"], "detail": {"result": ["FAILURE"]}})
