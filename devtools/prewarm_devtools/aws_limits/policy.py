"""Who is calling, and whether a resource policy denies it: the part of IAM's evaluation that local
mode needs to refuse what AWS would.

`Principals` maps access key ids to principal ARNs (local mode gives each function role, the agents'
role and the operator a key of their own). `explicit_deny` evaluates a resource-based policy for one
request and answers the Deny statement that applies, if any.

Only explicit denies in resource-based policies are modelled. Identity policies are not: in one
account either the identity policy or the resource policy may allow, so an Allow statement decides
nothing here, and no principal is refused for lacking one.

    >>> policy = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
    ...     "Resource": "*", "Condition": {"ArnNotEquals": {"aws:PrincipalArn": ["arn:aws:iam::1:role/a"]}}}]}
    >>> bool(explicit_deny(policy, "sqs:SendMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:user/o"))
    True
    >>> explicit_deny(policy, "sqs:SendMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:role/a") is None
    True
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any


class PolicyError(Exception):
    """A policy uses something this evaluation does not implement (an operator, a key): extend it."""


class Principals:
    """Access key id → principal ARN. A key it does not know is moto's default caller, evaluated by nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arns: dict[str, str] = {}

    def add(self, access_key_id: str, arn: str) -> None:
        with self._lock:
            self._arns[access_key_id] = arn

    def remove(self, access_key_id: str) -> None:
        with self._lock:
            self._arns.pop(access_key_id, None)

    def arn(self, access_key_id: str | None) -> str | None:
        with self._lock:
            return self._arns.get(access_key_id or "")


def explicit_deny(policy: Mapping[str, Any], action: str, resource: str, principal_arn: str) -> dict[str, Any] | None:
    """The first Deny statement of `policy` that applies to `principal_arn` doing `action` on `resource`."""
    context = {"aws:principalarn": principal_arn, "aws:principalaccount": _account(principal_arn)}
    statements = policy.get("Statement", [])
    for statement in [statements] if isinstance(statements, Mapping) else statements:
        if statement.get("Effect") != "Deny":
            continue
        if not _matches_element(statement, "Action", action, _action_matches):
            continue
        if not _matches_element(statement, "Resource", resource, _arn_like):
            continue
        if not _matches_principal(statement, principal_arn):
            continue
        if _conditions_hold(statement.get("Condition", {}), context):
            return dict(statement)
    return None


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _matches_element(statement: Mapping[str, Any], name: str, value: str, match: Any) -> bool:
    """`Action`/`NotAction`, `Resource`/`NotResource`: a statement with neither matches every value."""
    if name in statement:
        return any(match(pattern, value) for pattern in _listed(statement[name]))
    if f"Not{name}" in statement:
        return not any(match(pattern, value) for pattern in _listed(statement[f"Not{name}"]))
    return True


def _matches_principal(statement: Mapping[str, Any], arn: str) -> bool:
    if "Principal" in statement:
        return _principal_in(statement["Principal"], arn)
    if "NotPrincipal" in statement:
        return not _principal_in(statement["NotPrincipal"], arn)
    return True


def _principal_in(principal: Any, arn: str) -> bool:
    """`"*"`, `{"AWS": ...}` with `*`, ARNs, or an account (its id or `:root`): every principal of it."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    for entry in _listed(principal.get("AWS")):
        if entry == "*" or entry == arn:
            return True
        account = entry if entry.isdigit() else _account(entry) if entry.endswith(":root") else ""
        if account and account == _account(arn):
            return True
    return False


def _account(arn: str) -> str:
    parts = arn.split(":")
    return parts[4] if len(parts) > 4 else ""


def _action_matches(pattern: str, action: str) -> bool:
    return _wildcard(pattern.lower()).fullmatch(action.lower()) is not None


def _string_like(pattern: str, value: str) -> bool:
    return _wildcard(pattern).fullmatch(value) is not None


def _arn_like(pattern: str, value: str) -> bool:
    """ArnLike and ArnEquals (IAM treats them alike): each of the six colon-separated parts matched on
    its own, `*` and `?` as wildcards within it."""
    if pattern == "*":
        return True
    wanted, got = pattern.split(":", 5), value.split(":", 5)
    return len(wanted) == len(got) == 6 and all(_string_like(w, g) for w, g in zip(wanted, got, strict=True))


@lru_cache(maxsize=1024)
def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(".".join(re.escape(p) for p in part.split("?")) for part in pattern.split("*")),
                      re.DOTALL)


_OPERATORS = {
    "StringEquals": lambda want, got: want == got,
    "StringLike": _string_like,
    "ArnEquals": _arn_like,
    "ArnLike": _arn_like,
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals",
            "ArnNotLike": "ArnLike"}


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    """Every operator and every key under it must hold (AND); the values listed for one key are ORed.

    A negated operator holds when the value matches none of the listed ones, and when the request has
    no such key; a positive one does not hold without the key unless it ends in `IfExists`.
    """
    for operator, keys in conditions.items():
        for key, values in keys.items():
            if not _condition_holds(operator, context.get(key.lower()), _listed(values)):
                return False
    return True


def _condition_holds(operator: str, value: str | None, wanted: Iterable[str]) -> bool:
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if base.startswith(("ForAnyValue:", "ForAllValues:")):
        # Only single-valued keys are in the context: ForAnyValue is the plain operator over one value,
        # ForAllValues holds for an empty set (no key) as IAM's does.
        qualifier, _, base = base.partition(":")
        if value is None:
            return qualifier == "ForAllValues"
    negated = base in _NEGATED
    match = _OPERATORS.get(_NEGATED.get(base, base))
    if match is None:
        raise PolicyError(f"condition operator {operator} is not evaluated locally (aws_limits/policy.py)")
    if value is None:
        return negated or if_exists
    hit = any(match(w, value) for w in wanted)
    return not hit if negated else hit
