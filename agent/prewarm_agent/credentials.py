"""Which credentials a pull tries, in order, and where they come from.

The order is the kubelet's union keyring: the task's pull secrets first (every matching entry, most
specific registry key first), then the node's own credentials, here an ECR token from the agent's
IAM role for ECR hosts (`ecr_registry_for`, the ECR credential provider's host rule). A pull tries
them in turn and moves on when the registry refuses one; it goes anonymous only when no credential
matches the image at all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prewarm.adapters.ecr_auth import EcrTokenSource, RoleCredentials
from prewarm.adapters.secrets import AgentCredentialsError
from prewarm.domain.credentials import EcrRegistry, Keyring, RegistryAuth, ecr_registry_for
from prewarm.domain.images import ImageRef
from prewarm.domain.refresh import (
    CredentialStoreError,
    RegistryConfig,
    RegistryToken,
    RegistryTokenError,
    refresh_due_at,
)

log = logging.getLogger(__name__)


class PullSecretSource(Protocol):
    """Reads docker config secrets (Secrets Manager ARNs) into a keyring (`AgentCredentials` does)."""

    def keyring(self, secret_ids: Sequence[str]) -> Keyring: ...


class TokenSource(Protocol):
    """Issues ECR tokens (`EcrTokenSource` does)."""

    def token(self, registry: RegistryConfig) -> RegistryToken: ...


class RegistryTokens(Protocol):
    """Registry tokens of the agent's own identity."""

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth: ...


def credential_identity(auth: RegistryAuth | None) -> str:
    """A stable name for a credential that does not reveal it: equal for the same user and password."""
    if auth is None:
        return "anonymous"
    digest = hashlib.sha256(f"{auth.username}\0{auth.password}".encode()).hexdigest()[:16]
    return f"{auth.username}#{digest}"


def credential_order(image: str, secrets: Keyring, node_auth: RegistryAuth | None) -> list[RegistryAuth | None]:
    """Credentials to try for `image`: pull-secret matches, then the node's; `[None]` (anonymous) if none.

    The same user and password found twice is tried once.
    """
    found = [*secrets.lookup(image), *([node_auth] if node_auth is not None else [])]
    unique: dict[str, RegistryAuth] = {}
    for auth in found:
        unique.setdefault(credential_identity(auth), auth)
    return list(unique.values()) or [None]


@dataclass(frozen=True)
class Candidates:
    """The credentials to try, and why some expected ones are missing (said in a failed pull's report)."""

    auths: list[RegistryAuth | None]
    problems: list[str]


class EcrTokens:
    """ECR tokens from the agent's own role, cached until half their lifetime has passed."""

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        clock: Callable[[], float],
        source: TokenSource | None = None,
    ) -> None:
        self._clock = clock
        self._clients_lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self._session: Any = None
        self._source: TokenSource = source or EcrTokenSource(client_factory=self._client, clock=clock)
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()
        self._cache: dict[tuple[str | None, str | None], tuple[str, str, float]] = {}

    def _client(self, service: str, region: str, credentials: RoleCredentials | None) -> Any:
        # Task threads ask at the same time; boto3 sessions are not safe to build clients from concurrently.
        with self._clients_lock:
            key = (service, region)
            if key not in self._clients:
                import boto3

                if self._session is None:
                    self._session = boto3.session.Session()
                self._clients[key] = self._session.client(service, region_name=region, endpoint_url=self._endpoint_url)
            return self._clients[key]

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth:
        """The token for `registry` as credentials for `host`; raises `RegistryTokenError`."""
        key = (registry.account, registry.region)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and now < cached[2]:
            return RegistryAuth(username=cached[0], password=cached[1], server=host)
        config = (
            RegistryConfig(public=True)
            if registry.public
            else RegistryConfig(account=registry.account, region=registry.region)
        )
        token = self._source.token(config)
        first = token.auths[0]
        due = refresh_due_at(token.issued_at, token.expires_at)
        with self._lock:
            self._cache[key] = (first.username, first.password, due)
        return RegistryAuth(username=first.username, password=first.password, server=host)


class RegistryCredentials:
    """The credentials a task's pull tries (see the module docstring)."""

    def __init__(self, *, secrets: PullSecretSource, tokens: RegistryTokens | None) -> None:
        self._secrets = secrets
        self._tokens = tokens

    def candidates(self, image: ImageRef, pull_secret_arns: Sequence[str]) -> Candidates:
        """Credentials for `image`; an unreadable secret or token is left out and named in `problems`."""
        problems: list[str] = []
        rings = []
        for arn in dict.fromkeys(pull_secret_arns):
            try:
                rings.append(self._secrets.keyring([arn]))
            except (AgentCredentialsError, CredentialStoreError) as e:
                problems.append(str(e))
        keyring = rings[0].merge(*rings[1:]) if rings else Keyring()
        node_auth = None
        registry = ecr_registry_for(image.registry)
        if registry is not None and self._tokens is not None:
            try:
                node_auth = self._tokens.auth(registry, image.registry)
            except RegistryTokenError as e:
                problems.append(str(e))
        for problem in problems:
            log.warning("credentials left out for %s: %s", image, problem, extra={"image": str(image)})
        return Candidates(credential_order(image.format(), keyring, node_auth), problems)
