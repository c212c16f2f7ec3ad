"""The crash and fault suites run with DynamoDB's transaction conflicts on: besides the window in which
each transaction holds its items (always on), the limits layer refuses `CONFLICT_RATE` of the writes on
items that transactions write, single writes with `TransactionConflictException` and transactions with
`TransactionConflict`, as another writer's transaction in flight would. The refusals are drawn from the
items and their tries, so a scenario run again (each crash point's run) meets the same ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prewarm_devtools import aws_limits as layers

# One write in five on those items: enough that every scenario meets some (the writers without their
# retries failed six of the nine crash scenarios at this rate), few enough that retries get through.
CONFLICT_RATE = 0.2


@pytest.fixture(autouse=True)
def _transaction_conflicts(aws_limits: layers.AwsLimits | None) -> Iterator[None]:
    if aws_limits is None:  # PREWARM_AWS_LIMITS=off
        yield
        return
    aws_limits.dynamodb.inject_conflicts(CONFLICT_RATE, seed=26)
    try:
        yield
    finally:
        aws_limits.dynamodb.inject_conflicts(0)
