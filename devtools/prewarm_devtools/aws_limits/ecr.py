"""ECR's GetAuthorizationToken rate in front of moto's handler: 20 a second, bursts of 200; and, when
`token_lifetime_s` is set, the token's expiry as ECR gives it (that many seconds from now, 12 hours on
AWS) instead of moto's fixed 2015-01-01, which tests pin their clocks to."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from moto.core.exceptions import JsonRESTError

from prewarm_devtools.aws_limits.counting import TokenBucket

if TYPE_CHECKING:
    from prewarm_devtools.aws_limits import AwsLimits


class ECRLimits:
    def __init__(self, layer: AwsLimits) -> None:
        self.layer = layer
        self.quotas = layer.quotas
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        #: Seconds an authorization token lives from the moment it is handed out; None: moto's answer.
        self.token_lifetime_s: float | None = None
        self.wall_clock: Callable[[], float] = time.time

    def reset(self) -> None:
        with self._lock:
            self._buckets.clear()

    def guard(self, action: str, handler: Any, run: Callable[[], Any]) -> Any:
        if action == "get_authorization_token":
            now = self.layer.clock()
            where = (handler.current_account, handler.region)
            with self._lock:
                bucket = self._buckets.get(where)
                if bucket is None:
                    bucket = self._buckets[where] = TokenBucket(self.quotas.ecr_auth_per_s,
                                                                self.quotas.ecr_auth_burst, now)
                allowed = bucket.can_take(1, now)
                if allowed:
                    bucket.take(1, now)
            if not allowed:
                self.layer.stats.record_refusal("ThrottlingException")
                raise JsonRESTError("ThrottlingException", "Rate exceeded")
            lifetime = self.token_lifetime_s
            if lifetime is not None:
                answer = run()
                expires = datetime.fromtimestamp(self.wall_clock() + lifetime, tz=UTC)
                for data in answer.result.get("authorizationData", []):
                    data["expiresAt"] = expires
                return answer
        return run()
