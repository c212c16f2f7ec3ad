"""ECR in front of moto: the request rates of GetAuthorizationToken, and of the registry's manifest
(BatchGetImage) and blob (GetDownloadUrlForLayer) requests, per account and Region, a 429
`TOOMANYREQUESTS` past them (`Quotas`); with
`token_lifetime_s` set, the token's expiry as ECR gives it (that many seconds from now, 12 hours on
AWS) instead of moto's fixed 2015-01-01, which tests pin their clocks to; and, with `issues_tokens`,
tokens of their own, each bound to the principal that asked for it.

A token carries its principal's permissions: the registry that plays ECR (`node/ecr_front.py`) asks
`registry_refusal` about each request made with one, and a pull is authorized as ECR authorizes it,
as that principal doing `ecr:BatchGetImage` (a manifest) or `ecr:GetDownloadUrlForLayer` (a blob) on
the repository ("Amazon ECR private registry authentication", "Private repository policies", ECR User
Guide). moto's own token is one fixed string per account, and so a key to every repository.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from moto.core.exceptions import JsonRESTError

from prewarm_devtools.aws_limits.counting import TokenBucket
from prewarm_devtools.aws_limits.policy import Decision, evaluate
from prewarm_devtools.aws_limits.sqs import access_key_id

if TYPE_CHECKING:
    from prewarm_devtools.aws_limits.layer import LayerState

#: The caller a request signed with a key the layer does not know is, for moto (sts:GetCallerIdentity).
MOTO_DEFAULT_CALLER = "arn:aws:iam::{account}:user/moto"

# The Registry HTTP API's paths (distribution spec) and the ECR action each method on them is
# authorized as (ECR API Reference: BatchGetImage, GetDownloadUrlForLayer, InitiateLayerUpload, ...).
_PATH = re.compile(r"^/v2/(?P<name>.+?)/(?P<kind>manifests|blobs/uploads|blobs|tags/list)(?:/(?P<rest>.*))?$")
_ACTIONS = {
    ("manifests", "GET"): "ecr:BatchGetImage", ("manifests", "HEAD"): "ecr:BatchGetImage",
    ("manifests", "PUT"): "ecr:PutImage", ("manifests", "DELETE"): "ecr:BatchDeleteImage",
    ("blobs", "GET"): "ecr:GetDownloadUrlForLayer", ("blobs", "HEAD"): "ecr:GetDownloadUrlForLayer",
    ("blobs/uploads", "POST"): "ecr:InitiateLayerUpload", ("blobs/uploads", "PATCH"): "ecr:UploadLayerPart",
    ("blobs/uploads", "PUT"): "ecr:CompleteLayerUpload", ("blobs/uploads", "GET"): "ecr:UploadLayerPart",
    ("tags/list", "GET"): "ecr:ListImages",
}


@dataclass(frozen=True)
class RegistryRefusal:
    """What the registry answers a refused request: the status and ECR's `{"errors": [...]}` body."""

    status: int
    message: str
    code: str = "DENIED"
    #: Seconds for a `Retry-After` header (a 429's), None for none.
    retry_after: int | None = None

    def body(self) -> bytes:
        return json.dumps({"errors": [{"code": self.code, "message": self.message}]}).encode()


# ECR's answers: no or an unknown token, 401 with a Basic challenge; an expired one, 403
# ("Your authorization token has expired. Reauthenticate and try again."); a denied action, 403 with
# IAM's AccessDenied text.
NOT_AUTHORIZED = RegistryRefusal(401, "Not Authorized")
TOKEN_EXPIRED = RegistryRefusal(403, "Your authorization token has expired. Reauthenticate and try again.")
# Past a rate quota: 429 with the distribution spec's code, as Docker shows it ("toomanyrequests: Rate
# exceeded", ECR User Guide, "Troubleshooting": HTTP 429 Too Many Requests or ThrottleException).
RATE_EXCEEDED = "Rate exceeded"
_RATED = {"ecr:BatchGetImage": "ecr_manifest_per_s", "ecr:GetDownloadUrlForLayer": "ecr_layer_per_s"}


@dataclass(frozen=True)
class IssuedToken:
    """A token `GetAuthorizationToken` handed out: for whom (`principal`; its policies decide what it may
    pull), for which registry, and until when (None: moto's 2015 expiry, which nothing enforces)."""

    principal: str
    registry_id: str
    expires_at: float | None


def registry_request(method: str, path: str) -> tuple[str, str] | None:
    """The ECR action and repository a registry request is authorized as; None for `/v2/` (the token
    only). Raises `ValueError` for a path ECR does not serve (`_catalog`)."""
    path = path.split("?", 1)[0]
    if path.rstrip("/") == "/v2":
        return None
    match = _PATH.match(path)
    action = _ACTIONS.get((match["kind"], method.upper())) if match else None
    if match is None or action is None:
        raise ValueError(f"{method} {path} is not a registry request ECR serves")
    return action, match["name"]


def basic_password(authorization: str | None) -> str | None:
    """The password of a Basic `Authorization` header for user `AWS`, None for anything else."""
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return password if user == "AWS" and password else None


class ECRLimits:
    def __init__(self, layer: LayerState) -> None:
        self.layer = layer
        self.quotas = layer.quotas
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], TokenBucket] = {}
        #: Requests refused past a rate quota, by ECR action, since the last reset.
        self.throttled: dict[str, int] = {}
        #: Seconds an authorization token lives from the moment it is handed out; None: moto's answer.
        self.token_lifetime_s: float | None = None
        #: Hand out tokens of the layer's own, bound to their caller (`registry_refusal` checks them),
        #: instead of moto's one fixed token per account.
        self.issues_tokens = False
        self.wall_clock: Callable[[], float] = time.time
        self._tokens: dict[str, IssuedToken] = {}

    def reset(self) -> None:
        # Issued tokens stay: a registry and its clients outlive a reset of the counts (each test's), and
        # a token is only ever found by its random password.
        with self._lock:
            self._buckets.clear()
            self.throttled = {}

    def take(self, api: str, account: str, region: str, rate: float, burst: float) -> bool:
        """One request of `api` against its quota in `account` and `region`; False when past it."""
        now = self.layer.clock()
        with self._lock:
            bucket = self._buckets.get((api, account, region))
            if bucket is None:
                bucket = self._buckets[(api, account, region)] = TokenBucket(rate, burst, now)
            if not bucket.can_take(1, now):
                self.throttled[api] = self.throttled.get(api, 0) + 1
                return False
            bucket.take(1, now)
            return True

    def guard(self, action: str, handler: Any, run: Callable[[], Any]) -> Any:
        if action != "get_authorization_token":
            return run()
        if not self.take("ecr:GetAuthorizationToken", handler.current_account, handler.region,
                         self.quotas.ecr_auth_per_s, self.quotas.ecr_auth_burst):
            self.layer.stats.record_refusal("ThrottlingException")
            raise JsonRESTError("ThrottlingException", "Rate exceeded")
        if self.token_lifetime_s is None and not self.issues_tokens:
            return run()
        answer = run()
        expires = None if self.token_lifetime_s is None else self.wall_clock() + self.token_lifetime_s
        principal = (self.layer.principals.arn(access_key_id(handler.headers))
                     or MOTO_DEFAULT_CALLER.format(account=handler.current_account))
        for data in answer.result.get("authorizationData", []):
            if expires is not None:
                data["expiresAt"] = datetime.fromtimestamp(expires, tz=UTC)
            if self.issues_tokens:
                registry_id = data["proxyEndpoint"].removeprefix("https://").split(".", 1)[0]
                data["authorizationToken"] = self._issue(IssuedToken(principal, registry_id, expires))
        return answer

    def _issue(self, token: IssuedToken) -> str:
        password = secrets.token_urlsafe(48)
        now = self.wall_clock()
        with self._lock:
            for old in [p for p, t in self._tokens.items() if t.expires_at is not None and t.expires_at <= now]:
                del self._tokens[old]
            self._tokens[password] = token
        return base64.b64encode(f"AWS:{password}".encode()).decode()

    def issued_to(self, principal: str) -> int:
        """How many of the tokens held now were issued to `principal`."""
        with self._lock:
            return sum(token.principal == principal for token in self._tokens.values())

    def holder(self, password: str) -> IssuedToken | None:
        """Whom the token with `password` was issued to, None for a token this layer did not issue."""
        with self._lock:
            return self._tokens.get(password)

    def registry_refusal(self, authorization: str | None, method: str, path: str, *, account: str,
                         region: str) -> RegistryRefusal | None:
        """Why the registry of `account` in `region` refuses a request with this `Authorization` header,
        or None to serve it: as ECR, the token must be one it issued for that registry and unexpired, and
        its principal's policies (with the repository's own) must allow the request's action."""
        password = basic_password(authorization)
        token = self.holder(password) if password is not None else None
        if token is None or token.registry_id != account:
            return NOT_AUTHORIZED
        if token.expires_at is not None and token.expires_at <= self.wall_clock():
            return TOKEN_EXPIRED
        try:
            request = registry_request(method, path)
        except ValueError as e:
            return RegistryRefusal(404, str(e), code="UNSUPPORTED")
        if request is None:
            return None
        action, repository = request
        arn = f"arn:aws:ecr:{region}:{account}:repository/{repository}"
        decision: Decision = evaluate(action, arn, token.principal, identity=self.layer.principals.policies(
            token.principal), resource_policy=_repository_policy(account, region, repository))
        if decision.allowed:
            return self.rate_refusal(action, account, region)
        self.layer.stats.record_refusal("DENIED")
        return RegistryRefusal(403, decision.message(token.principal, action, arn))


    def rate_refusal(self, action: str, account: str, region: str) -> RegistryRefusal | None:
        """The 429 for a registry request of `action` past its quota in `account` and `region`, else None."""
        quota = _RATED.get(action)
        if quota is None:
            return None
        rate = float(getattr(self.quotas, quota))
        if self.take(action, account, region, rate, max(1.0, rate)):
            return None
        self.layer.stats.record_refusal("TOOMANYREQUESTS")
        return RegistryRefusal(429, RATE_EXCEEDED, code="TOOMANYREQUESTS", retry_after=self.quotas.ecr_retry_after_s)


def _repository_policy(account: str, region: str, name: str) -> dict[str, Any] | None:
    """The repository's own policy in moto's ECR (SetRepositoryPolicy), None when it has none."""
    from moto.ecr.models import ecr_backends

    repository = ecr_backends[account][region].repositories.get(name)
    policy = getattr(repository, "policy", None)
    return json.loads(policy) if policy else None


def moto_token_door(account: str) -> Callable[[str | None, str, str], RegistryRefusal | None]:
    """With the layer off, what the registry of `account` admits: moto's one fixed token of the account,
    which carries no principal and so pulls everything."""
    fixed = f"{account}-auth-token"

    def refusal(authorization: str | None, method: str, path: str) -> RegistryRefusal | None:
        return None if basic_password(authorization) == fixed else NOT_AUTHORIZED

    return refusal
