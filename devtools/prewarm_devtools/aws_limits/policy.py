"""Who is calling, and whether IAM would let it: the evaluation of one account's policies that local
mode needs to refuse what AWS would.

`Principals` maps access key ids to principal ARNs (local mode gives each function role, the agents'
role and the operator a key of their own) and principal ARNs to their identity-based policies (the
roles of `template.yaml`). `evaluate` decides one request as IAM does within one account ("Policy
evaluation for requests within a single account", IAM User Guide): an explicit Deny in the identity
or the resource-based policy refuses; otherwise an Allow in either grants, and nothing is an implicit
deny. A resource-based policy grants by itself only to the principal it names (its ARN, or `*`); one
that names an account delegates to that account's identity policies ("AWS account principals", IAM
User Guide). A principal whose identity policies are unknown (`None`: moto's default caller, the
operator) is held to resource policies' explicit denies only.

Condition keys: `aws:PrincipalArn` and `aws:PrincipalAccount` always, and what the request brings
(`context`): SQS's tag keys `aws:RequestTag/<key>`, `aws:TagKeys` (multi-valued, for `ForAllValues:` /
`ForAnyValue:`) and `aws:ResourceTag/<key>`. A key the request does not carry is absent, as in IAM: a
positive operator on it does not hold. Not modelled: permissions boundaries, session policies, SCPs and
RCPs; an operator not listed below raises `PolicyError` rather than passing.

    >>> policy = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
    ...     "Resource": "*", "Condition": {"ArnNotEquals": {"aws:PrincipalArn": ["arn:aws:iam::1:role/a"]}}}]}
    >>> bool(explicit_deny(policy, "sqs:SendMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:user/o"))
    True
    >>> explicit_deny(policy, "sqs:SendMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:role/a") is None
    True
    >>> grants = [{"Statement": [{"Effect": "Allow", "Action": "sqs:Receive*", "Resource": "arn:aws:sqs:*:1:q"}]}]
    >>> evaluate("sqs:ReceiveMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:role/a", identity=grants).allowed
    True
    >>> evaluate("sqs:DeleteMessage", "arn:aws:sqs:us-west-2:1:q", "arn:aws:iam::1:role/a", identity=grants).reason
    'because no identity-based policy allows the sqs:DeleteMessage action'
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


class PolicyError(Exception):
    """A policy uses something this evaluation does not implement (an operator, a key): extend it."""


Policy = Mapping[str, Any]


class Principals:
    """Access key id → principal ARN, and principal ARN → its identity-based policies.

    A key it does not know is moto's default caller, evaluated by nothing; a principal whose policies
    it was not given (`policies` None) is held to resource policies' explicit denies only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arns: dict[str, str] = {}
        self._policies: dict[str, tuple[Policy, ...]] = {}

    def add(self, access_key_id: str, arn: str, policies: Sequence[Policy] | None = None) -> None:
        """`access_key_id` signs as `arn`; with `policies`, those are all the identity policies `arn` has."""
        with self._lock:
            self._arns[access_key_id] = arn
            if policies is not None:
                self._policies[arn] = tuple(policies)

    def remove(self, access_key_id: str) -> None:
        with self._lock:
            arn = self._arns.pop(access_key_id, None)
            if arn is not None and arn not in self._arns.values():
                self._policies.pop(arn, None)

    def known(self) -> set[str]:
        """Every principal ARN some key signs as."""
        with self._lock:
            return set(self._arns.values())

    def arn(self, access_key_id: str | None) -> str | None:
        with self._lock:
            return self._arns.get(access_key_id or "")

    def policies(self, arn: str) -> tuple[Policy, ...] | None:
        """The identity policies of `arn`, or None when they are not known (not evaluated)."""
        with self._lock:
            return self._policies.get(arn)


@dataclass(frozen=True)
class Decision:
    """IAM's answer to one request: allowed, or refused for `reason`, in the words of AWS's AccessDenied
    messages ("... because no identity-based policy allows the X action", "... with an explicit deny in
    a resource-based policy")."""

    allowed: bool
    reason: str = ""
    #: Refused by a Deny statement, not for want of an Allow (IAM's `explicitDeny` / `implicitDeny`).
    explicit: bool = False

    def message(self, principal_arn: str, action: str, resource: str) -> str:
        return f"User: {principal_arn} is not authorized to perform: {action} on resource: {resource} {self.reason}"


ALLOWED = Decision(True)


ContextValue = str | tuple[str, ...]


def evaluate(action: str, resource: str, principal_arn: str, *, identity: Sequence[Policy] | None,
             resource_policy: Policy | None = None, context: Mapping[str, ContextValue] | None = None) -> Decision:
    """Whether `principal_arn` may do `action` on `resource` (an ARN, or `*` for an action without a
    resource type), given its identity policies (None: unknown), the resource's own policy and the
    request's condition keys (`context`, e.g. `aws:RequestTag/team`; names are case-insensitive)."""
    keys = {k.lower(): v for k, v in (context or {}).items()}
    for policy in identity or ():
        if _first(policy, "Deny", action, resource, principal_arn, resource_based=False, keys=keys) is not None:
            return Decision(False, "with an explicit deny in an identity-based policy", explicit=True)
    if resource_policy and _first(resource_policy, "Deny", action, resource, principal_arn, resource_based=True,
                                  keys=keys) is not None:
        return Decision(False, "with an explicit deny in a resource-based policy", explicit=True)
    if identity is None:
        return ALLOWED
    if any(_first(policy, "Allow", action, resource, principal_arn, resource_based=False, keys=keys) is not None
           for policy in identity):
        return ALLOWED
    if resource_policy and _first(resource_policy, "Allow", action, resource, principal_arn,
                                  resource_based=True, keys=keys) is not None:
        return ALLOWED
    return Decision(False, f"because no identity-based policy allows the {action} action")


def explicit_deny(policy: Policy, action: str, resource: str, principal_arn: str) -> dict[str, Any] | None:
    """The first Deny statement of resource-based `policy` that applies to `principal_arn` doing `action` on
    `resource`."""
    return _first(policy, "Deny", action, resource, principal_arn, resource_based=True)


def _first(policy: Policy, effect: str, action: str, resource: str, principal_arn: str, *,
           resource_based: bool, keys: Mapping[str, ContextValue] | None = None) -> dict[str, Any] | None:
    """The first statement of `effect` in `policy` that applies to the request. In a resource-based
    policy, an Allow applies only to a principal it names itself or with `*`: naming its account
    grants nothing by itself, it lets the account's identity policies decide."""
    context: dict[str, ContextValue] = {**(keys or {}), "aws:principalarn": principal_arn,
                                        "aws:principalaccount": _account(principal_arn)}
    statements = policy.get("Statement", [])
    for statement in [statements] if isinstance(statements, Mapping) else statements:
        if statement.get("Effect") != effect:
            continue
        if not _matches_element(statement, "Action", action, _action_matches):
            continue
        if not _matches_element(statement, "Resource", resource, _arn_like):
            continue
        if resource_based and not _matches_principal(statement, principal_arn, by_account=effect == "Deny"):
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


def _matches_principal(statement: Mapping[str, Any], arn: str, *, by_account: bool = True) -> bool:
    if "Principal" in statement:
        return _principal_in(statement["Principal"], arn, by_account=by_account)
    if "NotPrincipal" in statement:
        return not _principal_in(statement["NotPrincipal"], arn, by_account=True)
    return True


def _principal_in(principal: Any, arn: str, *, by_account: bool) -> bool:
    """`"*"`, `{"AWS": ...}` with `*` or ARNs, or (`by_account`) an account, its id or `:root`: every
    principal of it."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    for entry in _listed(principal.get("AWS")):
        if entry == "*" or entry == arn:
            return True
        account = entry if entry.isdigit() else _account(entry) if entry.endswith(":root") else ""
        if by_account and account and account == _account(arn):
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


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, ContextValue]) -> bool:
    """Every operator and every key under it must hold (AND); the values listed for one key are ORed.

    A negated operator holds when the value matches none of the listed ones, and when the request has
    no such key; a positive one does not hold without the key unless it ends in `IfExists`.
    """
    for operator, keys in conditions.items():
        for key, values in keys.items():
            if not _condition_holds(operator, context.get(key.lower()), _listed(values)):
                return False
    return True


def _condition_holds(operator: str, value: ContextValue | None, wanted: Iterable[str]) -> bool:
    """Set operators ("Multivalued context keys", IAM User Guide): `ForAllValues:` holds when every value
    of the request's set matches (so for an empty or absent set), `ForAnyValue:` when one does."""
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    qualifier = ""
    if base.startswith(("ForAnyValue:", "ForAllValues:")):
        qualifier, _, base = base.partition(":")
    negated = base in _NEGATED
    match = _OPERATORS.get(_NEGATED.get(base, base))
    if match is None:
        raise PolicyError(f"condition operator {operator} is not evaluated locally (aws_limits/policy.py)")
    wanted = list(wanted)
    values = () if value is None else (value,) if isinstance(value, str) else value

    def holds(one: str) -> bool:
        hit = any(match(w, one) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(holds(v) for v in values)
    if qualifier == "ForAnyValue":
        return any(holds(v) for v in values)
    if not values:
        return negated or if_exists
    return any(holds(v) for v in values)
