"""What a node queue of this stack is: its attributes (the senders' policy among them) and its tags; and
what differs on a queue found with others.

Only the control plane creates node queues, with these (docs/architecture.md, "Who owns the node
queues"); a queue found with another policy, other attributes or without this stack's tags (made by
hand, by an agent of an older version, or under the roles of a stack since recreated) is set back to
them. Policies are compared as documents, not as text: SQS may hand back a policy with other spacing,
a one-element list as a string, or a number as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TAG_PREFIX = "prewarm:node-queue-prefix"
TAG_NODE = "prewarm:node"
# On queues of a registered cluster's nodes only (`prewarm.domain.clusters`): node names repeat across clusters.
TAG_CLUSTER = "prewarm:cluster"
# The attributes compared with the stack's: those it sets, and the policy even when it sets none.
POLICY = "Policy"
REDRIVE_POLICY = "RedrivePolicy"
# Every role ARN a deleted role leaves in a resource policy is replaced by the role's unique id, which
# starts with this ("IAM identifiers", "Unique identifiers"): such a principal names a role that is gone.
ROLE_ID_PREFIX = "AROA"


@dataclass(frozen=True)
class ProvidedQueue:
    """A node queue as the control plane left it: its URL, whether it was just created, and what of a
    queue found was set back to the stack's (attribute names, and `tags`)."""

    url: str
    created: bool = False
    repaired: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Created or repaired: messages sent to it before may never have reached this node's agent."""
        return self.created or bool(self.repaired)


def sender_policy(sender_arns: Sequence[str]) -> dict[str, Any] | None:
    """The queue policy that lets exactly `sender_arns` send (None: no policy, IAM alone decides)."""
    if not sender_arns:
        return None
    senders = list(sender_arns)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "OnlyPrewarmSends", "Effect": "Allow", "Principal": {"AWS": senders},
             "Action": "sqs:SendMessage", "Resource": "*"},
            # In one account an Allow only adds to IAM grants: the Deny makes the list exclusive.
            {"Sid": "NobodyElseSends", "Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
             "Resource": "*", "Condition": {"ArnNotEquals": {"aws:PrincipalArn": senders}}},
        ],
    }


def queue_attributes(*, visibility_seconds: int, dlq_arn: str = "", max_receive_count: int = 5,
                     sender_arns: Sequence[str] = ()) -> dict[str, str]:
    """The attributes a node queue is created with (CreateQueue's `Attributes`)."""
    attrs = {
        "VisibilityTimeout": str(visibility_seconds),
        "MessageRetentionPeriod": str(4 * 24 * 3600),
        "ReceiveMessageWaitTimeSeconds": "20",
        "DelaySeconds": "0",
        "SqsManagedSseEnabled": "true",
    }
    if dlq_arn:
        attrs[REDRIVE_POLICY] = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)})
    policy = sender_policy(sender_arns)
    if policy is not None:
        attrs[POLICY] = json.dumps(policy)
    return attrs


def queue_tags(prefix: str, node: str, cluster: str = "") -> dict[str, str]:
    """The tags that mark a queue as this stack's node queue (the sweep deletes only such queues)."""
    tags = {TAG_PREFIX: prefix, TAG_NODE: node[:256]}
    return {**tags, TAG_CLUSTER: cluster} if cluster else tags


def attribute_drift(actual: Mapping[str, str], expected: Mapping[str, str]) -> dict[str, str]:
    """The attributes to set for `actual` to be `expected` (name → value; "" removes a policy). A policy
    or redrive policy the stack does not set must not be there either."""
    out: dict[str, str] = {}
    for name in sorted({*expected, POLICY, REDRIVE_POLICY}):
        want, have = expected.get(name, ""), actual.get(name, "")
        if name in (POLICY, REDRIVE_POLICY):
            if _document(have) != _document(want):
                out[name] = want
        elif have != want:
            out[name] = want
    return out


def tags_differ(actual: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    """Whether any of the stack's tags is missing or has another value."""
    return any(actual.get(key) != value for key, value in expected.items())


def policy_principals(policy: str) -> set[str]:
    """Every AWS principal a queue policy names (its Principal elements and `aws:PrincipalArn` conditions)."""
    document = _parse(policy)
    found: set[str] = set()
    statements = document.get("Statement", []) if isinstance(document, dict) else []
    for statement in [statements] if isinstance(statements, dict) else statements:
        if not isinstance(statement, dict):
            continue
        principal = statement.get("Principal")
        if isinstance(principal, dict):
            found.update(_strings(principal.get("AWS")))
        for values in (statement.get("Condition") or {}).values():
            if isinstance(values, dict):
                for key, value in values.items():
                    if key.lower() == "aws:principalarn":
                        found.update(_strings(value))
    return found - {"*"}


def foreign_principals(policy: str, sender_arns: Iterable[str]) -> list[str]:
    """The principals a queue policy names that are not the stack's senders, sorted: roles of another
    stack, of a stack since recreated, or ids of deleted roles (`is_deleted_role`)."""
    return sorted(policy_principals(policy) - set(sender_arns))


def is_deleted_role(principal: str) -> bool:
    """Whether a policy's principal is a deleted role's unique id (IAM writes it where the ARN was)."""
    return principal.startswith(ROLE_ID_PREFIX) and ":" not in principal


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def _parse(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: differs from every policy the stack writes


def _document(text: str) -> Any:
    """A policy or redrive policy in one form: statements as a list, each value list sorted, every scalar
    as text, no `Id`."""
    return _canonical(_parse(text), top=True)


def _canonical(value: Any, *, top: bool = False) -> Any:
    if isinstance(value, dict):
        items = {k: _canonical(v) for k, v in value.items() if not (top and k == "Id")}
        if "Statement" in items and not isinstance(items["Statement"], list):
            items["Statement"] = [items["Statement"]]
        return items
    if isinstance(value, list):
        values = [_canonical(v) for v in value]
        if all(isinstance(v, str) for v in values):
            return sorted(values) if len(values) != 1 else values[0]
        return sorted(values, key=lambda v: json.dumps(v, sort_keys=True))
    return value if value is None else str(value)
