"""`prewarm doctor`'s check of the node queues' policies: every node queue's policy lets exactly the
stack's senders (`NodeQueueSenderArns`) send.

A queue whose policy names other principals was made by hand, by an agent of a version that made its own
queue, or by a stack since recreated: a deleted role's ARN is replaced in the policy by its unique id
(`AROA...`), and every send of the new stack's roles is then denied. The sweep sets such queues back to the
stack's policy (each queue once in ten runs); this check names them now.

It reads, as you: `sqs:ListQueues` under the node queue prefix (the stack's own cluster and each registered
one), `sqs:GetQueueAttributes` (`Policy`) of each queue, and `iam:GetRole` of each role a policy names that
is not the stack's (refused: the role is reported as not the stack's, without saying whether it exists).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prewarm.domain.node_queues import POLICY, foreign_principals, is_deleted_role
from prewarm_cli.doctor.checks import CheckResult, _fail, _ok, skipped
from prewarm_cli.output import listed

NAME = "node queue policies"
# Queues read at once: 5,000 queues take a few seconds.
READERS = 16


def role_exists(iam: Any) -> Callable[[str], bool | None]:
    """Whether the role of an ARN exists (`iam:GetRole`); None when IAM does not say (refused, or not a role)."""

    def exists(arn: str) -> bool | None:
        if ":role/" not in arn:
            return None
        try:
            iam.get_role(RoleName=arn.rsplit("/", 1)[1])
        except Exception as e:  # noqa: BLE001 - botocore's errors: only NoSuchEntity says the role is gone
            code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
            return False if code == "NoSuchEntity" else None
        return True

    return exists


def queue_policy(sqs: Any, url: str) -> str:
    """A queue's policy ("" when it has none)."""
    answer = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[POLICY])
    return str(answer.get("Attributes", {}).get(POLICY, ""))


def check_queue_policies(sqs: Any, queues: Mapping[str, str], sender_arns: Sequence[str], *,
                         exists: Callable[[str], bool | None], run_sweep: str) -> CheckResult:
    """Names the node queues (name → URL) whose policy names principals other than `sender_arns`, and
    among those the roles that no longer exist."""
    if not sender_arns:
        return skipped(NAME, "the stack names no senders (NodeQueueSenderArns): IAM alone decides who sends")
    if not queues:
        return _ok(NAME, "no node queue yet")
    names = sorted(queues)
    with ThreadPoolExecutor(max_workers=min(READERS, len(names))) as pool:
        policies = dict(zip(names, pool.map(lambda n: queue_policy(sqs, queues[n]), names), strict=True))
    foreign = {n: foreign_principals(p, sender_arns) for n, p in policies.items()}
    foreign = {n: found for n, found in foreign.items() if found}
    unset = sorted(n for n, p in policies.items() if not p)
    if not foreign and not unset:
        return _ok(NAME, f"{len(names)} queues, each letting only the stack's roles send")
    gone = _deleted(set().union(*foreign.values()) if foreign else set(), exists)
    problems = []
    if foreign:
        named = sorted({p for found in foreign.values() for p in found})
        problems.append(f"{len(foreign)} queue{'s' if len(foreign) > 1 else ''} ({listed(sorted(foreign))}) name "
                        f"principals that are not the stack's ({listed(named)})"
                        + (f", of which roles that no longer exist: {listed(sorted(gone))}" if gone else ""))
    if unset:
        problems.append(f"{len(unset)} queue{'s' if len(unset) > 1 else ''} without a policy ({listed(unset)})")
    first = queues[sorted(foreign)[0] if foreign else unset[0]]
    return _fail(NAME, "; ".join(problems),
                 f"run the sweep ({run_sweep}) until it has set each back to the stack's policy (each queue once "
                 f"in ten runs), or delete them (`aws sqs delete-queue --queue-url {first}`): the node's next "
                 "hello makes its queue again")


def _deleted(principals: Iterable[str], exists: Callable[[str], bool | None]) -> set[str]:
    """The principals that are deleted roles: a role's unique id in a policy, or a role IAM says is gone."""
    return {p for p in principals if is_deleted_role(p) or exists(p) is False}
