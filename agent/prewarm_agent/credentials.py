"""Which credentials a pull tries, in order, and where they come from.

The order is the kubelet's union keyring: the task's pull secrets first (every matching entry, most
specific registry key first), then the node's own credential for ECR hosts (`ecr_registry_for`, the
ECR credential provider's host rule). That is an ECR token from the agent's IAM role or, when ECR
refuses the role or the agent is told to use nothing else (`ECR_CREDENTIALS=copies`), the copy
`refresh_ecr_credentials` keeps of the registry's token under `SECRET_PREFIX`. A pull tries them in
turn and moves on when the registry refuses one; it goes anonymous only when no credential matches
the image at all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prewarm.adapters.ecr_auth import EcrTokenSource, RoleCredentials
from prewarm.domain.images import ImageRef
from prewarm.domain.refresh import RegistryConfig, refresh_due_at, registry_secret_name
from prewarm.domain.registries import EcrRegistry, Keyring, RegistryAuth, ecr_registry_for
from prewarm.services.ports import AgentCredentialsError, CredentialStoreError, RegistryTokenError, RegistryTokenSource
from prewarm_agent.settings import AgentSettings, EcrCredentials

log = logging.getLogger(__name__)


class PullSecretSource(Protocol):
    """Reads docker config secrets (Secrets Manager ARNs) into a keyring (`AgentCredentials` does)."""

    def keyring(self, secret_ids: Sequence[str]) -> Keyring: ...


class RegistryTokens(Protocol):
    """Registry tokens of the agent's own identity; raises `RegistryTokenError`."""

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth: ...


class RegistryCopyReader(Protocol):
    """Reads the refresher's registry copies (`AgentCredentials` does): None when there is none,
    `AgentCredentialsError` when one is expired or unreadable."""

    def registry_keyring(self, prefix: str, host: str) -> Keyring | None: ...


class AgentSecrets(PullSecretSource, RegistryCopyReader, Protocol):
    """Both readers in one (`AgentCredentials`)."""


class RegistryCopyError(AgentCredentialsError):
    """The refresher's copy of a registry's token is missing or holds nothing for the registry."""


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
        source: RegistryTokenSource | None = None,
    ) -> None:
        self._clock = clock
        self._clients_lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self._session: Any = None
        self._source: RegistryTokenSource = source or EcrTokenSource(client_factory=self._client, clock=clock)
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

    def prepare(self, region: str) -> None:
        """Builds the ECR client for `region` now: built lazily, the first pulls of many agents in one
        process all pay for it at once (about 1.8 s for 20 agents, measured by benchmarks/e2e_latency.py)."""
        self._client("ecr", region, None)

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


class RegistryCopies:
    """The copies `refresh_ecr_credentials` keeps of each registry's token, `<prefix>/registry/<host>`."""

    def __init__(self, reader: RegistryCopyReader, prefix: str) -> None:
        self._reader = reader
        self.prefix = prefix

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth:
        """The copy's credentials for `registry`, as credentials for `host` (the image's, port included).

        Raises `AgentCredentialsError` naming the secret (never its value): `RegistryCopyError` when
        there is no copy or it holds nothing for the registry; the reader's error when it has expired or
        cannot be read.
        """
        name = registry_secret_name(self.prefix, registry.host)
        keyring = self._reader.registry_keyring(self.prefix, registry.host)
        if keyring is None:
            raise RegistryCopyError(
                f"no registry copy for {registry.host}: secret {name} does not exist; add the registry to "
                "refresh_ecr_credentials' CredentialsConfig, or check SECRET_PREFIX"
            )
        for auth in keyring.auths:
            if auth.server.removeprefix("https://").rstrip("/").lower() == registry.host:
                return RegistryAuth(username=auth.username, password=auth.password, server=host)
        raise RegistryCopyError(f"registry copy {name} holds no credentials for {registry.host}")


class RegistryCredentials:
    """The credentials a task's pull tries (see the module docstring).

    `tokens` None means the role is never asked; `copies` None means there is no fallback.
    """

    def __init__(
        self, *, secrets: PullSecretSource, tokens: RegistryTokens | None, copies: RegistryCopies | None = None
    ) -> None:
        self._secrets = secrets
        self._tokens = tokens
        self._copies = copies

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
        if registry is not None:
            node_auth = self._node_auth(registry, image.registry, problems)
        for problem in problems:
            log.warning("credentials left out for %s: %s", image, problem, extra={"image": str(image)})
        return Candidates(credential_order(image.format(), keyring, node_auth), problems)

    def prepare(self, region: str) -> None:
        """Readies what the first pull from the node's own region needs (the ECR client)."""
        if isinstance(self._tokens, EcrTokens):
            self._tokens.prepare(region)

    def _node_auth(self, registry: EcrRegistry, host: str, problems: list[str]) -> RegistryAuth | None:
        """The role's token; the registry copy when there is no role or ECR refused it."""
        if self._tokens is not None:
            try:
                return self._tokens.auth(registry, host)
            except RegistryTokenError as e:
                problems.append(str(e))
        if self._copies is None:
            return None
        try:
            return self._copies.auth(registry, host)
        except (AgentCredentialsError, CredentialStoreError) as e:
            problems.append(str(e))
            return None


def registry_credentials(
    settings: AgentSettings,
    *,
    secrets: AgentSecrets,
    clock: Callable[[], float],
    token_source: RegistryTokenSource | None = None,
) -> RegistryCredentials:
    """The agent's credentials as `ECR_CREDENTIALS` and `SECRET_PREFIX` say; `token_source` replaces
    ECR's `GetAuthorizationToken` for the role's tokens (tests, local mode)."""
    copies = RegistryCopies(secrets, settings.secret_prefix) if settings.secret_prefix else None
    tokens = None
    if settings.ecr_credentials is EcrCredentials.ROLE:
        tokens = EcrTokens(endpoint_url=settings.aws_endpoint_url, clock=clock, source=token_source)
    return RegistryCredentials(secrets=secrets, tokens=tokens, copies=copies)
