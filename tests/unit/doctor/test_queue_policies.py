"""`prewarm doctor` names the node queues whose policy is not the stack's: roles of a stack since recreated
(deleted roles become unique ids in a policy), other principals, or no policy at all."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from prewarm.adapters.sqs import NodeQueues
from prewarm_cli.doctor.queue_policies import check_queue_policies, role_exists

REGION = "us-west-2"
SENDERS = ["arn:aws:iam::123456789012:role/stack-DispatchJobRole", "arn:aws:iam::123456789012:role/stack-SweepRole"]
SWEEP = "`aws lambda invoke ...`"


def policy(*principals: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": list(principals)}, "Action": "sqs:SendMessage", "Resource": "*"}]})


def test_queues_naming_old_or_foreign_roles_or_no_policy_are_named_with_the_roles_that_are_gone() -> None:
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        iam = boto3.client("iam", region_name=REGION)
        iam.create_role(RoleName="elsewhere", AssumeRolePolicyDocument="{}")
        status = sqs.create_queue(QueueName="pw-status")["QueueUrl"]
        queues = NodeQueues("pw", status, sender_arns=SENDERS, client=sqs)
        good = queues.ensure_queue("good")
        # Given queues made by a recreated stack (its deleted role now an id, its other role gone), by
        # someone naming a role that exists, and without a policy
        old = sqs.create_queue(QueueName="pw-old", Attributes={"Policy": policy(
            "AROAOLDSTACKROLE1234", "arn:aws:iam::123456789012:role/old-SweepRole")})["QueueUrl"]
        other = sqs.create_queue(QueueName="pw-other", Attributes={"Policy": policy(
            "arn:aws:iam::123456789012:role/elsewhere", *SENDERS)})["QueueUrl"]
        bare = sqs.create_queue(QueueName="pw-bare")["QueueUrl"]
        listed = {"pw-good": good, "pw-old": old, "pw-other": other, "pw-bare": bare}

        result = check_queue_policies(sqs, listed, SENDERS, exists=role_exists(iam), run_sweep=SWEEP)

        assert result.ok is False
        assert result.detail == (
            "2 queues (pw-old, pw-other) name principals that are not the stack's (AROAOLDSTACKROLE1234, "
            "arn:aws:iam::123456789012:role/elsewhere, arn:aws:iam::123456789012:role/old-SweepRole), of which "
            "roles that no longer exist: AROAOLDSTACKROLE1234, arn:aws:iam::123456789012:role/old-SweepRole; "
            "1 queue without a policy (pw-bare)")
        assert SWEEP in result.fix and "delete-queue" in result.fix
        # When the control plane has set them back (the sweep's repair), the check passes
        for url in (old, other, bare):
            sqs.tag_queue(QueueUrl=url, Tags={"prewarm:node-queue-prefix": "pw", "prewarm:node": "x"})
            assert queues.repair_queue(url)
        again = check_queue_policies(sqs, listed, SENDERS, exists=role_exists(iam), run_sweep=SWEEP)
        assert (again.ok, again.detail) == (True, "4 queues, each letting only the stack's roles send")
