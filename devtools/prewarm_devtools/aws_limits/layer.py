"""What each service's limits share with the layer that holds them (`AwsLimits`): its quotas, its clock, its
counts and who calls. A Protocol, so a service names what it uses without importing the layer that builds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prewarm_devtools.aws_limits.counting import CapacityStats
from prewarm_devtools.aws_limits.policy import Principals
from prewarm_devtools.aws_limits.quotas import Quotas


class LayerState(Protocol):
    quotas: Quotas
    clock: Callable[[], float]
    stats: CapacityStats
    principals: Principals
