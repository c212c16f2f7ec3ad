"""One request budget per registry, shared by every job and cluster of the stack, and what a pull costs.

ECR's request rates are quotas per account and Region ("Amazon ECR service quotas": BatchGetImage
2,000/s, GetDownloadUrlForLayer 3,000/s, GetAuthorizationToken 500/s), whichever repository, job or
cluster asks. A pull makes one manifest request and one blob request per layer and for its config
(ECR's GetDownloadUrlForLayer serves every blob), so it costs `2 + layers` requests of its registry's
budget. Pull starts are paced by a GCRA (a token bucket kept
as one number: the *theoretical arrival time* `tat`, when the budget spent so far is paid back): a
batch of pulls reserves its start times in one write, however many pulls it holds.

>>> budget = RegistryBudget(requests_per_second=10, burst_seconds=1.0)
>>> reserve_starts(None, now=100.0, costs=[budget.pull_seconds(3)] * 3, burst_seconds=budget.burst_seconds)
Reservation(starts=(100.0, 100.0, 100.5), tat=101.5)
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The default budget: 80 % of ECR's GetDownloadUrlForLayer quota (3,000/s per account and Region), the
# rest left to other users of the account (kubelets, CI). Manifest requests are counted in it too, so
# BatchGetImage (2,000/s) stays below its quota for any image of one layer or more.
ECR_LAYER_REQUESTS_PER_SECOND = 3000.0
DEFAULT_REQUESTS_PER_SECOND = 2400.0
# Starts allowed at once after an idle spell, in seconds of the budget: none by default. Tasks are held
# back by whole seconds (SQS DelaySeconds), so each second's starts already come at once: with no burst
# on top, no instant starts more than one second of the budget (ECR states its quotas as rates only).
DEFAULT_BURST_SECONDS = 0.0
# A job whose image's layers are unknown (another registry than ECR; or ECR could not say) is costed as
# an image of this many layers by default (`layersIfUnknown` per registry): large AI images have tens.
LAYERS_IF_UNKNOWN = 30

_ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
# How a registry's 429 reads in containerd's pull errors ("429 Too Many Requests", "toomanyrequests").
_THROTTLED = re.compile(r"\b429\b|toomanyrequests|too many requests|rate exceeded", re.IGNORECASE)


class BudgetConfigError(ValueError):
    """A registry budget setting is wrong; the message names the registry and the field."""


def budget_key(registry_host: str) -> str:
    """Whose quota a registry's requests count against: for ECR the account and Region (every host
    of that registry, FIPS or not), for any other registry its host.

    >>> budget_key("123456789012.dkr.ecr.us-west-2.amazonaws.com"), budget_key("ghcr.io")
    ('ecr:123456789012:us-west-2', 'ghcr.io')
    """
    host = registry_host.lower()
    match = _ECR_HOST.match(host.split(":", 1)[0])
    return f"ecr:{match['account']}:{match['region']}" if match else host


@dataclass(frozen=True)
class EcrImageId:
    """Where ECR's `BatchGetImage` finds an image's manifest: its registry (account), Region, repository
    and digest or tag."""

    registry_id: str
    region: str
    repository: str
    reference: str


def ecr_image_id(image: str) -> EcrImageId | None:
    """The ECR image `image` names, or None for an image of another registry (or no reference at all).

    >>> ecr_image_id("123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/model:v1")
    EcrImageId(registry_id='123456789012', region='us-west-2', repository='ml/model', reference='v1')
    """
    from prewarm.domain.images import InvalidImageReference, parse_image

    try:
        ref = parse_image(image)
    except InvalidImageReference:
        return None
    match = _ECR_HOST.match(ref.registry.lower().split(":", 1)[0])
    if match is None:
        return None
    return EcrImageId(match["account"], match["region"], ref.repository, ref.digest or ref.tag or "latest")


def assumed_layers_note(host: str, layers: int) -> str:
    """What a job's message says when its image's layer count is not known: what its pulls are costed at.

    >>> assumed_layers_note("ghcr.io", 30)
    "layer count assumed 30 for host ghcr.io in its registry's budget (REGISTRY_BUDGETS layersIfUnknown)"
    """
    return f"layer count assumed {layers} for host {host} in its registry's budget (REGISTRY_BUDGETS layersIfUnknown)"


def pull_requests(layers: int) -> int:
    """Requests one pull of an image of `layers` layers makes: its manifest, its config and each layer."""
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    return 2 + layers


@dataclass(frozen=True)
class RegistryBudget:
    """What pulls from one registry may use: `requests_per_second` (0: requests are not counted) and,
    optionally, `bytes_per_second`. Neither set: no budget, pulls start at once."""

    requests_per_second: float = DEFAULT_REQUESTS_PER_SECOND
    bytes_per_second: float | None = None
    burst_seconds: float = DEFAULT_BURST_SECONDS
    layers_if_unknown: int = LAYERS_IF_UNKNOWN

    def __post_init__(self) -> None:
        if self.layers_if_unknown < 0:
            raise BudgetConfigError(f"layersIfUnknown must be >= 0, got {self.layers_if_unknown}")
        if self.requests_per_second < 0:
            raise BudgetConfigError(f"requestsPerSecond must be >= 0, got {self.requests_per_second}")
        if self.bytes_per_second is not None and self.bytes_per_second <= 0:
            raise BudgetConfigError(f"bytesPerSecond must be > 0 when set, got {self.bytes_per_second}")
        if self.burst_seconds < 0:
            raise BudgetConfigError(f"burstSeconds must be >= 0, got {self.burst_seconds}")

    @property
    def enabled(self) -> bool:
        """Whether requests are counted: what the layer-count note and the ETA's request bound rest on
        (`paces` says whether pulls are paced at all)."""
        return self.requests_per_second > 0

    @property
    def paces(self) -> bool:
        """Whether pull starts are paced: by requests, bytes or both."""
        return self.enabled or self.bytes_per_second is not None

    def pull_requests(self, layers: int | None) -> int:
        """The requests one pull makes, an image of unknown layers counted as one of `layers_if_unknown`."""
        return pull_requests(self.layers_if_unknown if layers is None else layers)

    def pull_seconds(self, layers: int | None, size_bytes: int | None = None) -> float:
        """The share of the budget one pull takes, in seconds: its requests at the request rate (an image
        of unknown layers as one of `layers_if_unknown`) and its bytes at the byte rate, whichever is
        longer, each only when its rate is set. A pull of unknown size takes none of the byte rate: with
        a byte budget alone it costs 0 s (nothing to pace it by).

        >>> RegistryBudget(requests_per_second=0, bytes_per_second=1e6).pull_seconds(8, size_bytes=3_000_000)
        3.0
        """
        seconds = self.pull_requests(layers) / self.requests_per_second if self.enabled else 0.0
        if self.bytes_per_second is not None and size_bytes:
            seconds = max(seconds, size_bytes / self.bytes_per_second)
        return seconds


@dataclass(frozen=True)
class BudgetState:
    """A registry's budget as its last reservation left it: its theoretical arrival time `tat` (the budget
    is spent until then) and the rates that reservation was made at."""

    tat: float
    budget: RegistryBudget

    def fields(self) -> dict[str, float | None]:
        """The budget item's fields besides its key and version."""
        return {"tat": self.tat, "requests_per_second": self.budget.requests_per_second,
                "bytes_per_second": self.budget.bytes_per_second, "layers_if_unknown": self.budget.layers_if_unknown}

    @classmethod
    def of_item(cls, item: Mapping[str, object]) -> BudgetState:
        """From a budget item; one written before the rates were (by an older stack) reads as unpaced."""
        rate, byte_rate = item.get("requests_per_second"), item.get("bytes_per_second")
        layers = item.get("layers_if_unknown")
        return cls(float(str(item["tat"])), RegistryBudget(
            requests_per_second=float(str(rate)) if rate is not None else 0.0,
            bytes_per_second=float(str(byte_rate)) if byte_rate is not None else None,
            layers_if_unknown=int(str(layers)) if layers is not None else LAYERS_IF_UNKNOWN))


@dataclass(frozen=True)
class Reservation:
    """Start times for a batch of pulls, in order, and the budget's new theoretical arrival time."""

    starts: tuple[float, ...]
    tat: float


def reserve_starts(tat: float | None, *, now: float, costs: Sequence[float], burst_seconds: float,
                   horizon: float | None = None) -> Reservation:
    """Start times for pulls costing `costs` seconds of budget each (GCRA): a pull starts once the budget
    spent before it, with its own share, is within `burst_seconds` of being paid back, so that no span of
    `w` seconds starts more than `burst_seconds + w` seconds of budget (a token bucket that holds
    `burst_seconds`). `tat`: the stored arrival time (None: never used). With `horizon`, only the pulls
    that start within `horizon` seconds of `now` are reserved (the first ones: `starts` is then shorter
    than `costs`); the rest take none of the budget.

    >>> reserve_starts(None, now=0.0, costs=[400.0] * 4, burst_seconds=0.0, horizon=900.0)
    Reservation(starts=(0.0, 400.0, 800.0), tat=1200.0)
    """
    at = now if tat is None else max(tat, now)
    starts: list[float] = []
    for cost in costs:
        if cost < 0:
            raise ValueError(f"a pull's cost must be >= 0 seconds, got {cost}")
        start = max(now, at + min(cost, burst_seconds) - burst_seconds)
        if horizon is not None and start - now > horizon:
            break
        starts.append(start)
        at += cost
    return Reservation(tuple(starts), at)


# SendMessage's DelaySeconds: "Valid values: 0 to 900" (15 minutes).
MAX_SEND_DELAY_SECONDS = 900


def send_delay(seconds_to_start: float) -> int:
    """The whole seconds a task is held back for a start `seconds_to_start` from its reservation: rounded
    down (a start less than a second away goes at once), at most SQS's 900 (the pacing reserves no start
    further away: `reserve_starts`' horizon).

    >>> send_delay(0.4), send_delay(1.0), send_delay(2.9999999999), send_delay(5000)
    (0, 1, 3, 900)
    """
    return min(MAX_SEND_DELAY_SECONDS, max(0, math.floor(seconds_to_start + 1e-6)))


@dataclass(frozen=True)
class RegistryBudgets:
    """The stack's budgets: `default` for every registry, `overrides` per budget key (`budget_key`)."""

    default: RegistryBudget = RegistryBudget()
    overrides: Mapping[str, RegistryBudget] | None = None

    def of(self, key: str) -> RegistryBudget:
        return (self.overrides or {}).get(key, self.default)

    @classmethod
    def parse(cls, default: RegistryBudget, overrides: Mapping[str, object]) -> RegistryBudgets:
        """From the template's JSON: `{"<registry host>": {"requestsPerSecond": 20, "bytesPerSecond": ...,
        "layersIfUnknown": 12}}`; a host is keyed as `budget_key` keys it. A field left out is `default`'s;
        `bytesPerSecond` 0 (or null) turns the byte budget off for that host, as `requestsPerSecond` 0
        does the request budget."""
        parsed: dict[str, RegistryBudget] = {}
        for host, value in overrides.items():
            if not isinstance(value, Mapping):
                raise BudgetConfigError(f"registry budget of {host}: expected an object, got {value!r}")
            unknown = set(value) - {"requestsPerSecond", "bytesPerSecond", "burstSeconds", "layersIfUnknown"}
            if unknown:
                raise BudgetConfigError(f"registry budget of {host}: unknown field(s) {', '.join(sorted(unknown))}")
            try:
                parsed[budget_key(host)] = RegistryBudget(
                    requests_per_second=float(value.get("requestsPerSecond", default.requests_per_second)),
                    bytes_per_second=_byte_rate(value, default.bytes_per_second),
                    burst_seconds=float(value.get("burstSeconds", default.burst_seconds)),
                    layers_if_unknown=_whole(value.get("layersIfUnknown", default.layers_if_unknown)),
                )
            except (TypeError, ValueError) as e:
                raise BudgetConfigError(f"registry budget of {host}: {e}") from e
        return cls(default, parsed)


def _byte_rate(value: Mapping[str, Any], default: float | None) -> float | None:
    """A host's `bytesPerSecond`: left out, the default's; 0 or null, none (as REGISTRY_BYTES_PER_SECOND 0)."""
    if "bytesPerSecond" not in value:
        return default
    rate = value["bytesPerSecond"]
    return None if rate is None else float(rate) or None


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BudgetConfigError(f"layersIfUnknown must be a whole number, got {value!r}")
    return value


# Starts the message of a Pulling report while the pull waits out a registry's 429: `watch` counts
# such nodes as throttled.
THROTTLED_MESSAGE = "throttled by the registry"


def is_throttled_report(message: str) -> bool:
    """Whether a node's last report says its pull waits out a registry's 429."""
    return message.startswith(THROTTLED_MESSAGE)


def is_throttled(error: str) -> bool:
    """Whether a pull error is the registry's 429 (`TOOMANYREQUESTS`): not the node's failure."""
    return bool(_THROTTLED.search(error))


# A throttled pull waits 1 s doubling to 30 s, each wait drawn between half and all of it, so nodes
# throttled together do not come back together.
THROTTLE_BACKOFF_INITIAL_SECONDS = 1.0
THROTTLE_BACKOFF_MAX_SECONDS = 30.0


def throttle_backoff(throttles: int, rng: random.Random | None = None) -> float:
    """The wait after the `throttles`-th 429 in a row of one pull."""
    if throttles < 1:
        raise ValueError(f"throttles start at 1, got {throttles}")
    ceiling = min(THROTTLE_BACKOFF_MAX_SECONDS, THROTTLE_BACKOFF_INITIAL_SECONDS * 2 ** (throttles - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)
