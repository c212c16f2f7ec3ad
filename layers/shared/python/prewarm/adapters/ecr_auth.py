"""Registry tokens from Amazon ECR and ECR Public, optionally as an assumed role (cross-account pulls).

`ecr:GetAuthorizationToken` answers a base64 `AWS:<password>` token valid for 12 hours;
`ecr-public:GetAuthorizationToken` the same, from us-east-1 only. Assumed-role sessions are cached per
role until shortly before they expire. The clock and the client factory are injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.domain.refresh import RegistryConfig, RegistryToken
from prewarm.domain.registries import InvalidCredentialsError, RegistryAuth
from prewarm.services.ports import RegistryTokenError

__all__ = ["ClientFactory", "EcrTokenSource", "RegistryTokenError", "RoleCredentials"]

SESSION_NAME = "prewarm-ecr-credentials"
# An assumed session is replaced this long before it expires, so no call runs on a dying one.
_SESSION_MARGIN_SECONDS = 300
_ROLE_SESSION_SECONDS = 3600


@dataclass(frozen=True, slots=True, repr=False)
class RoleCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_at: float
    #: The assumed role's session ARN (`AssumedRoleUser.Arn`), which a token asked for with these carries.
    principal: str | None = None

    def __repr__(self) -> str:
        return f"RoleCredentials(access_key_id={self.access_key_id!r}, expires_at={self.expires_at})"


ClientFactory = Callable[[str, str, RoleCredentials | None], Any]


def boto3_client(service: str, region: str, credentials: RoleCredentials | None) -> Any:
    """A boto3 client of `service` in `region`, as the given role or the function's own credentials."""
    import boto3

    if credentials is None:
        return boto3.client(service, region_name=region)
    return boto3.client(
        service, region_name=region, aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key, aws_session_token=credentials.session_token,
    )


class EcrTokenSource:
    """Gets a registry's token: `token(registry)` → `RegistryToken` for each of the registry's hosts."""

    def __init__(self, client_factory: ClientFactory | None = None, clock: Callable[[], float] = time.time, *,
                 identify_caller: bool = False) -> None:
        """`identify_caller`: name in each token (`issued_to`) the principal whose permissions it carries,
        asking STS once who this process is when it asks ECR as itself."""
        self._client_factory = client_factory or boto3_client
        self._identify_caller = identify_caller
        self._clock = clock
        self._sessions: dict[str, RoleCredentials] = {}
        self._callers: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def token(self, registry: RegistryConfig) -> RegistryToken:
        """A new token for `registry`; `RegistryTokenError` when AWS refuses or answers nonsense."""
        host = registry.host
        credentials = None
        if registry.role_arn:
            credentials = self.role_credentials(registry.role_arn, registry.token_region, host)
        issued_to = credentials.principal if credentials is not None else (
            self.caller(registry.token_region) if self._identify_caller else None)
        issued_at = self._clock()
        if registry.public:
            client = self._client_factory("ecr-public", registry.token_region, credentials)
            data = self._call(host, "ecr-public:GetAuthorizationToken", client.get_authorization_token)
            data = data.get("authorizationData") or {}
        else:
            client = self._client_factory("ecr", registry.token_region, credentials)
            answer = self._call(host, "ecr:GetAuthorizationToken", client.get_authorization_token,
                                registryIds=[registry.account])
            data = next(iter(answer.get("authorizationData") or ()), {})
        encoded, expires = data.get("authorizationToken"), data.get("expiresAt")
        if not isinstance(encoded, str) or not isinstance(expires, datetime):
            raise RegistryTokenError(host, "GetAuthorizationToken answered no authorizationToken or expiresAt")
        try:
            auth = RegistryAuth.from_basic_token(encoded, host)
        except InvalidCredentialsError as e:
            raise RegistryTokenError(host, str(e)) from e
        return RegistryToken.for_hosts(auth.username, auth.password, registry.hosts, issued_at=issued_at,
                                       expires_at=expires.timestamp(), issued_to=issued_to)

    def caller(self, region: str) -> str | None:
        """This process's own principal (`sts:GetCallerIdentity`, which needs no permission), asked once:
        whose permissions its tokens carry. None when STS does not answer: a token is not refused for it."""
        with self._lock:
            if region not in self._callers:
                try:
                    arn = self._client_factory("sts", region, None).get_caller_identity().get("Arn")
                except (ClientError, BotoCoreError):
                    return None
                self._callers[region] = arn if isinstance(arn, str) else None
            return self._callers[region]

    def role_credentials(self, role_arn: str, region: str, host: str) -> RoleCredentials:
        """The assumed role's credentials, cached until `_SESSION_MARGIN_SECONDS` before they expire."""
        with self._lock:
            cached = self._sessions.get(role_arn)
            if cached is not None and cached.expires_at - _SESSION_MARGIN_SECONDS > self._clock():
                return cached
            sts = self._client_factory("sts", region, None)
            answer = self._call(host, f"sts:AssumeRole {role_arn}", sts.assume_role, RoleArn=role_arn,
                                RoleSessionName=SESSION_NAME, DurationSeconds=_ROLE_SESSION_SECONDS)
            raw = answer["Credentials"]
            credentials = RoleCredentials(
                access_key_id=raw["AccessKeyId"], secret_access_key=raw["SecretAccessKey"],
                session_token=raw["SessionToken"], expires_at=raw["Expiration"].timestamp(),
                principal=(answer.get("AssumedRoleUser") or {}).get("Arn"),
            )
            self._sessions[role_arn] = credentials
            return credentials

    @staticmethod
    def _call(host: str, what: str, operation: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return operation(**kwargs)
        except ClientError as e:
            error = e.response.get("Error", {})
            raise RegistryTokenError(host, f"{what}: {error.get('Code', 'error')}: {error.get('Message', '')}") from e
        except BotoCoreError as e:
            raise RegistryTokenError(host, f"{what}: {e}") from e
