"""AWS's limits in front of moto, which enforces almost none of them.

On (`enable()`, or the `limits()` context manager), every DynamoDB, SQS and ECR request that moto
serves in this process, through `mock_aws` or a `ThreadedMotoServer`, is first held to what AWS
allows (`Quotas`: each number with its source): DynamoDB's item size, transaction size and
conflicts, per-partition capacity of the base table and each GSI; SQS's message and batch sizes and
queue name reuse; ECR's request rates per account and Region (GetAuthorizationToken, and the registry's
manifest and blob requests as BatchGetImage and GetDownloadUrlForLayer: 429 `TOOMANYREQUESTS`);
EventBridge Scheduler's schedule names, expressions and time zones. Refusals are the errors AWS answers.
EKS answers for the clusters the layer serves (`layer.eks.serve`: local mode's embedded API servers) with
their endpoints and CAs and the access-entry API moto lacks (`eks`); Lambda's Invoke runs a local stack's
handlers (`lambdas`).

Before any of that, IAM (`authorization`): a caller the layer knows by access key
(`layer.principals.add(key, arn, policies)`: local mode registers each function role and the agents'
role with their policies from `template.yaml`, and the operator without) is refused with its service's
AccessDenied unless an identity or resource policy allows the request and no explicit Deny applies
(`policy.evaluate`, for SQS, DynamoDB and its streams, Secrets Manager, ECR, STS, SSM and Scheduler). A caller
registered without policies is held to resource policies' explicit denies only; any other key is
moto's default caller and is not evaluated.

The layer also counts the capacity each DynamoDB partition key value consumed:

    >>> from prewarm_devtools import aws_limits
    >>> with aws_limits.limits() as layer:       # doctest: +SKIP
    ...     run_the_fleet()
    ...     hot = layer.stats.hottest_key()
    ...     print(hot.key, hot.writes, hot.wcu_per_s(), hot.peak_wcu_per_s)

And it keeps moto's memory flat as DynamoDB's: stream records go once every reader has them (24 h at
most) and a transaction rolls back the items it touched instead of copying whole tables.

Local mode's moto server turns it on (`MotoServer(limits=...)`); `PREWARM_AWS_LIMITS=off` turns it off
there. The pytest plugin `prewarm_devtools.pytest_plugins.aws_limits` turns it on for a test run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prewarm_devtools.aws_limits import patches
from prewarm_devtools.aws_limits.authorization import AccessDeniedError, Authorization
from prewarm_devtools.aws_limits.counting import CapacityKey, CapacityStats, KeyUsage, TokenBucket
from prewarm_devtools.aws_limits.dynamodb import DynamoDBLimits, item_size, read_units, write_units
from prewarm_devtools.aws_limits.ec2 import EC2State, pending_snapshots
from prewarm_devtools.aws_limits.ecr import ECRLimits
from prewarm_devtools.aws_limits.eks import EKSLimits
from prewarm_devtools.aws_limits.lambdas import LambdaFunctions
from prewarm_devtools.aws_limits.policy import Decision, PolicyError, Principals, evaluate, explicit_deny
from prewarm_devtools.aws_limits.quotas import Quotas
from prewarm_devtools.aws_limits.scheduler import SchedulerLimits
from prewarm_devtools.aws_limits.sqs import SQSLimits, message_size
from prewarm_devtools.aws_limits.tables import StreamReaders

__all__ = [
    "AccessDeniedError", "AwsLimits", "CapacityKey", "CapacityStats", "Decision", "KeyUsage", "PolicyError",
    "Principals", "Quotas", "TokenBucket", "active", "disable", "enable", "evaluate", "explicit_deny", "item_size",
    "limits", "message_size", "read_units", "stats", "wanted", "write_units",
]

OFF_VALUES = {"0", "off", "false", "no"}


class AwsLimits:
    """One layer: its quotas, its clock (for rates), its counts (`stats`) and its per-service state."""

    def __init__(self, quotas: Quotas | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas or Quotas()
        self.clock = clock
        self.stats = CapacityStats(clock)
        # Who calls, by access key: configuration rather than state, so a reset keeps it.
        self.principals = Principals()
        self.authorization = Authorization(self)
        self.dynamodb = DynamoDBLimits(self)
        self.sqs = SQSLimits(self)
        self.ecr = ECRLimits(self)
        self.eks = EKSLimits()
        self.ec2 = EC2State()
        self.lambdas = LambdaFunctions()
        self.scheduler = SchedulerLimits()
        self.streams = StreamReaders(clock, self.quotas.stream_retention_s, self.quotas.shard_iterator_s)

    def hold_snapshots(self, held: bool) -> None:
        """New snapshots start `pending` (`held`), for local mode's builders, which complete each once its copy
        is made (`ec2.finish_snapshot`). Its patch is put in place at the first hold only: a run that makes no
        snapshot does not import moto's EC2 (the import alone shifts the timing `benchmarks/capacity.py` models)."""
        if held:
            patches.install_late(*pending_snapshots(active))
        self.ec2.snapshots_pending = held

    def reset(self) -> None:
        """Forgets all state and counts, as moto forgets its resources on a reset."""
        self.dynamodb.reset()
        self.sqs.reset()
        self.ecr.reset()
        self.stats.reset()


_active: AwsLimits | None = None
_switch = threading.Lock()


def active() -> AwsLimits | None:
    """The layer in force, or None."""
    return _active


def enable(quotas: Quotas | None = None, *, clock: Callable[[], float] = time.monotonic) -> AwsLimits:
    """Puts a new layer in force for every moto request in this process and returns it."""
    global _active
    with _switch:
        patches.install(active)
        _active = AwsLimits(quotas, clock=clock)
        return _active


def disable() -> None:
    """Takes the layer out: moto answers as it does on its own."""
    global _active
    with _switch:
        _active = None
        patches.uninstall()


@contextmanager
def limits(quotas: Quotas | None = None, *, clock: Callable[[], float] = time.monotonic) -> Iterator[AwsLimits]:
    """A layer in force for the block; the one before it (or none) afterwards."""
    global _active
    before = _active
    layer = enable(quotas, clock=clock)
    try:
        yield layer
    finally:
        if before is None:
            disable()
        else:
            with _switch:
                _active = before


def stats() -> CapacityStats:
    """The counts of the layer in force."""
    if _active is None:
        raise RuntimeError("the AWS limits layer is off: enable() it first")
    return _active.stats


def wanted(default: bool = True) -> bool:
    """Whether `PREWARM_AWS_LIMITS` leaves the layer on (anything but 0/off/false/no), `default` if unset."""
    value = os.environ.get("PREWARM_AWS_LIMITS")
    return default if value is None else value.strip().lower() not in OFF_VALUES
