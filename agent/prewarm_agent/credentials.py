"""Which credentials a pull tries, in order, and where they come from.

The order is the kubelet's union keyring: the task's pull secrets first (every matching entry, most
specific registry key first), then the node's own credential for ECR hosts (`ecr_registry_for`, the
ECR credential provider's host rule). A pull tries them in turn and moves on when the registry refuses
one; it goes anonymous only when no credential matches the image at all.

The node's credential fans in (`ECR_CREDENTIALS=shared`, the default): the copy `refresh_ecr_credentials`
keeps of each registry's token under `SECRET_PREFIX` is read first, so a whole fleet's first pull makes
no `ecr:GetAuthorizationToken` call of its own; the refresher's one call per registry and refresh period
serves every agent. A copy is kept until the refresher has had time to write the next one, plus a
jitter of each agent's own, so agents re-read about once per period and never all at once
(`copy_kept_until`). The agent's role asks ECR only when there is no usable copy, and is throttle-aware:
a `ThrottlingException` is retried after a backoff with full jitter, and a refusal that outlives the
tries pauses the role's asking for a jittered minute (`EcrTokens`). `role` asks the role first and reads
the copy only when ECR refuses; `copies` never asks ECR.

An ECR token carries the pull permissions of the principal that asked for it: the copy's, the refresher's
role (or the registry's `roleArn`); the agent's own, the agent's role. When the registry refuses the
first source's credential (401/403), the pull goes on with the other's (`Candidates.fallback`), asked for
only then, and names both principals: the refused one and the one it falls back to.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from botocore.exceptions import ClientError

from prewarm.adapters.ecr_auth import EcrTokenSource, RoleCredentials
from prewarm.adapters.secrets import RegistryCopy
from prewarm.domain.images import ImageRef
from prewarm.domain.kubernetes import format_time
from prewarm.domain.refresh import RegistryConfig, RegistryToken, refresh_due_at, registry_secret_name
from prewarm.domain.registries import EcrRegistry, Keyring, RegistryAuth, ecr_registry_for
from prewarm.services.ports import AgentCredentialsError, CredentialStoreError, RegistryTokenError, RegistryTokenSource
from prewarm_agent.settings import AgentSettings, EcrCredentials

log = logging.getLogger(__name__)

# The refresher rewrites a copy once its token is past half its lifetime, on its hourly schedule: the
# new copy is there at most this long after the old one's half-life.
COPY_REFRESH_GRACE_SECONDS = 3600.0
# Agents re-read a copy spread over this window after that, each at its own random point.
COPY_JITTER_SECONDS = 3600.0
# A copy that is missing, expired, unreadable, or already past its half-life plus the grace (the
# refresher is late) is looked for again after this, plus up to as much again of jitter.
COPY_RECHECK_SECONDS = 300.0
# A copy is never kept closer than this to its expiry.
COPY_EXPIRY_MARGIN_SECONDS = 600.0

# ECR's answers to a caller over its GetAuthorizationToken rate.
THROTTLE_CODES = frozenset({"ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded"})
# GetAuthorizationToken tries per token; between them a backoff with full jitter: random() times
# min(TOKEN_BACKOFF_CAP_SECONDS, TOKEN_BACKOFF_SECONDS * 2**(try - 1)).
TOKEN_TRIES = 4
TOKEN_BACKOFF_SECONDS = 1.0
TOKEN_BACKOFF_CAP_SECONDS = 16.0
# After a refusal (or a throttle that outlived the tries) the role is not asked again for this long,
# times a random factor between 0.5 and 1.5.
TOKEN_PAUSE_SECONDS = 60.0


class PullSecretSource(Protocol):
    """Reads docker config secrets (Secrets Manager ARNs) into a keyring (`AgentCredentials` does)."""

    def keyring(self, secret_ids: Sequence[str]) -> Keyring: ...


class RegistryTokens(Protocol):
    """Registry tokens of the agent's own identity; raises `RegistryTokenError`."""

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth: ...


class RegistryCopyReader(Protocol):
    """Reads the refresher's registry copies (`AgentCredentials` does): None when there is none,
    `AgentCredentialsError` when one is expired or unreadable."""

    def registry_copy(self, prefix: str, host: str) -> RegistryCopy | None: ...


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
class Fallback:
    """The node's other credential, asked for only when the registry refused those tried before it.

    `holder` names it before it is asked for; `get` answers the credential and its holder (with the
    principal once known), or raises `AgentCredentialsError`, `CredentialStoreError` or `RegistryTokenError`.
    """

    holder: str
    get: Callable[[], tuple[RegistryAuth, str]]


#: What `Fallback.get` raises when its source has nothing to give.
FALLBACK_ERRORS: tuple[type[Exception], ...] = (AgentCredentialsError, CredentialStoreError, RegistryTokenError)


@dataclass(frozen=True)
class Candidates:
    """The credentials to try, and why some expected ones are missing (said in a failed pull's report).

    `holders`: whose permissions the node's credentials carry, by `credential_identity`, named when the
    registry refuses one; `fallback`: what to try when the registry refused every credential in `auths`.
    """

    auths: list[RegistryAuth | None]
    problems: list[str]
    holders: Mapping[str, str] = field(default_factory=dict)
    fallback: Fallback | None = None


def copy_kept_until(issued_at: float | None, expires_at: float | None, read_at: float, jitter: float) -> float:
    """Until when an agent keeps a registry copy read at `read_at`; `jitter` is the agent's draw in [0, 1).

    A copy is rewritten by the refresher within `COPY_REFRESH_GRACE_SECONDS` after its half-life, so it
    is kept until then, plus up to `COPY_JITTER_SECONDS`: each agent reads each copy about once, and the
    fleet's reads are spread over an hour. A copy read later than that (the refresher is late) or
    without its times is looked for again after `COPY_RECHECK_SECONDS` (jittered). Never past its expiry
    less `COPY_EXPIRY_MARGIN_SECONDS`, nor less than a minute (still never past the expiry).

    >>> copy_kept_until(0.0, 12 * 3600.0, read_at=60.0, jitter=0.5) / 3600
    7.5
    """
    recheck = read_at + COPY_RECHECK_SECONDS * (1 + jitter)
    if issued_at is None or expires_at is None or expires_at <= issued_at:
        until = recheck
    else:
        written_by = refresh_due_at(issued_at, expires_at) + COPY_REFRESH_GRACE_SECONDS
        until = written_by + COPY_JITTER_SECONDS * jitter if read_at < written_by else recheck
    if expires_at is not None:
        until = max(min(until, expires_at - COPY_EXPIRY_MARGIN_SECONDS), min(read_at + 60, expires_at))
    return until


def is_throttle(error: RegistryTokenError) -> bool:
    """Whether ECR refused for the caller's rate (the adapter chains botocore's error)."""
    cause = error.__cause__
    return isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in THROTTLE_CODES


class EcrTokens:
    """ECR tokens from the agent's own role, cached until half their lifetime has passed.

    Throttle-aware: one call at a time per registry (concurrent pulls share its outcome); a
    `ThrottlingException` is tried again, up to `TOKEN_TRIES` calls, after a backoff with full jitter;
    a refusal that remains pauses the asking for about `TOKEN_PAUSE_SECONDS` (jittered), during which
    `auth` raises at once without calling ECR. `wait` sleeps (the agent's clock, so a stop interrupts
    it); `random` draws the jitter.
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        clock: Callable[[], float],
        source: RegistryTokenSource | None = None,
        wait: Callable[[float], object] = time.sleep,
        random: Callable[[], float] = random.random,
    ) -> None:
        self._clock = clock
        self._wait = wait
        self._random = random
        self._clients_lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}
        self._session: Any = None
        self._source: RegistryTokenSource = source or EcrTokenSource(
            client_factory=self._client, clock=clock, identify_caller=True)
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()
        self._registry_locks: dict[tuple[str | None, str | None], threading.Lock] = {}
        self._cache: dict[tuple[str | None, str | None], tuple[str, str, float]] = {}
        self._paused: dict[tuple[str | None, str | None], tuple[float, str]] = {}
        self._issued_to: dict[tuple[str | None, str | None], str] = {}

    def _client(self, service: str, region: str, credentials: RoleCredentials | None) -> Any:
        # Task threads ask at the same time; boto3 sessions are not safe to build clients from concurrently.
        with self._clients_lock:
            key = (service, region)
            if key not in self._clients:
                import boto3
                from botocore.config import Config

                if self._session is None:
                    self._session = boto3.session.Session()
                # No retries of botocore's own: `auth` retries throttles, with jitter, and then pauses.
                self._clients[key] = self._session.client(
                    service, region_name=region, endpoint_url=self._endpoint_url,
                    config=Config(retries={"mode": "standard", "max_attempts": 1}),
                )
            return self._clients[key]

    def prepare(self, region: str) -> None:
        """Builds the ECR client for `region` now: built lazily, the first pulls of many agents in one
        process all pay for it at once (about 1.8 s for 20 agents, measured by benchmarks/e2e_latency.py)."""
        self._client("ecr", region, None)

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth:
        """The token for `registry` as credentials for `host`; raises `RegistryTokenError`."""
        key = (registry.account, registry.region)
        with self._lock:
            registry_lock = self._registry_locks.setdefault(key, threading.Lock())
        with registry_lock:
            now = self._clock()
            cached = self._cache.get(key)
            if cached is not None and now < cached[2]:
                return RegistryAuth(username=cached[0], password=cached[1], server=host)
            paused = self._paused.get(key)
            if paused is not None and now < paused[0]:
                raise RegistryTokenError(registry.host, f"{paused[1]}; not asking again before "
                                                        f"{format_time(paused[0])}")
            config = (
                RegistryConfig(public=True)
                if registry.public
                else RegistryConfig(account=registry.account, region=registry.region)
            )
            token = self._token(key, config)
            first = token.auths[0]
            self._cache[key] = (first.username, first.password, refresh_due_at(token.issued_at, token.expires_at))
            if token.issued_to:
                self._issued_to[key] = token.issued_to
        return RegistryAuth(username=first.username, password=first.password, server=host)

    def issued_to(self, registry: EcrRegistry) -> str | None:
        """The principal of the last token for `registry` (the agent's own), None when unknown."""
        return self._issued_to.get((registry.account, registry.region))

    def _token(self, key: tuple[str | None, str | None], config: RegistryConfig) -> RegistryToken:
        for attempt in range(1, TOKEN_TRIES + 1):
            try:
                token = self._source.token(config)
            except RegistryTokenError as e:
                if is_throttle(e) and attempt < TOKEN_TRIES:
                    delay = self._random() * min(TOKEN_BACKOFF_CAP_SECONDS, TOKEN_BACKOFF_SECONDS * 2 ** (attempt - 1))
                    log.info("ECR throttled the token request for %s (try %d of %d); asking again in %.1fs",
                             config.host, attempt, TOKEN_TRIES, delay)
                    self._wait(delay)
                    continue
                pause = TOKEN_PAUSE_SECONDS * (0.5 + self._random())
                self._paused[key] = (self._clock() + pause, e.reason)
                raise
            self._paused.pop(key, None)
            return token
        raise AssertionError("unreachable: the last try returns or raises")


class RegistryCopies:
    """The copies `refresh_ecr_credentials` keeps of each registry's token, `<prefix>/registry/<host>`,
    each kept as `copy_kept_until` says; so is a missing or unusable one, so that it is not looked
    for on every pull. `random` draws the jitter."""

    def __init__(
        self,
        reader: RegistryCopyReader,
        prefix: str,
        *,
        clock: Callable[[], float] = time.time,
        random: Callable[[], float] = random.random,
    ) -> None:
        self._reader = reader
        self.prefix = prefix
        self._clock = clock
        self._random = random
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, RegistryAuth | Exception]] = {}
        self._issued_to: dict[str, str] = {}

    def holder(self, registry: EcrRegistry) -> str:
        """Whose permissions the copy for `registry` carries, as a pull's messages name it."""
        who = self._issued_to.get(registry.host)
        return f"the shared credential {registry_secret_name(self.prefix, registry.host)}" + (
            f" (issued to {who})" if who else "")

    def auth(self, registry: EcrRegistry, host: str) -> RegistryAuth:
        """The copy's credentials for `registry`, as credentials for `host` (the image's, port included).

        Raises `AgentCredentialsError` naming the secret (never its value): `RegistryCopyError` when
        there is no copy or it holds nothing for the registry; the reader's error when it has expired or
        cannot be read (`CredentialStoreError` when Secrets Manager failed).
        """
        with self._lock:
            now = self._clock()
            kept = self._kept.get(registry.host)
            if kept is None or now >= kept[0]:
                kept = self._read(registry, now)
                self._kept[registry.host] = kept
        found = kept[1]
        if isinstance(found, Exception):
            raise found
        return RegistryAuth(username=found.username, password=found.password, server=host)

    def _read(self, registry: EcrRegistry, now: float) -> tuple[float, RegistryAuth | Exception]:
        name = registry_secret_name(self.prefix, registry.host)
        jitter = self._random()
        try:
            copy = self._reader.registry_copy(self.prefix, registry.host)
            if copy is None:
                raise RegistryCopyError(
                    f"no registry copy for {registry.host}: secret {name} does not exist; add the registry to "
                    "refresh_ecr_credentials' CredentialsConfig, or check SECRET_PREFIX"
                )
            for auth in copy.keyring.auths:
                if auth.server.removeprefix("https://").rstrip("/").lower() == registry.host:
                    if copy.issued_to:
                        self._issued_to[registry.host] = copy.issued_to
                    return copy_kept_until(copy.issued_at, copy.expires_at, now, jitter), auth
            raise RegistryCopyError(f"registry copy {name} holds no credentials for {registry.host}")
        except (AgentCredentialsError, CredentialStoreError) as e:
            until = copy_kept_until(None, None, now, jitter)
            log.info("registry copy %s not used until %s: %s", name, format_time(until), e)
            return until, e


class RegistryCredentials:
    """The credentials a task's pull tries (see the module docstring).

    `tokens` None means the role is never asked; `copies` None means there is no copy to read;
    `copies_first` reads the copy before asking the role (else only when the role is refused).
    """

    def __init__(
        self, *, secrets: PullSecretSource, tokens: RegistryTokens | None, copies: RegistryCopies | None = None,
        copies_first: bool = False,
    ) -> None:
        self._secrets = secrets
        self._tokens = tokens
        self._copies = copies
        self._copies_first = copies_first

    def candidates(self, image: ImageRef, pull_secret_arns: Sequence[str], *, shared: bool = True) -> Candidates:
        """Credentials for `image`; an unreadable secret or token is left out and named in `problems`.

        `shared` False (a `pullSecretsOnly` task): the task's secrets only, never the node's credential,
        and no anonymous try when none matches (`auths` is then empty).
        """
        problems: list[str] = []
        rings = []
        for arn in dict.fromkeys(pull_secret_arns):
            try:
                rings.append(self._secrets.keyring([arn]))
            except (AgentCredentialsError, CredentialStoreError) as e:
                problems.append(str(e))
        keyring = rings[0].merge(*rings[1:]) if rings else Keyring()
        node_auth: RegistryAuth | None = None
        holders: dict[str, str] = {}
        fallback: Fallback | None = None
        registry = ecr_registry_for(image.registry)
        if registry is not None and shared:
            node_auth, holders, fallback = self._node_credential(registry, image.registry, problems)
        for problem in problems:
            log.warning("credentials left out for %s: %s", image, problem, extra={"image": str(image)})
        if not shared:
            return Candidates([a for a in credential_order(image.format(), keyring, None) if a is not None], problems)
        return Candidates(credential_order(image.format(), keyring, node_auth), problems, holders, fallback)

    def prepare(self, region: str) -> None:
        """Readies what the first pull from the node's own region needs (the ECR client)."""
        if isinstance(self._tokens, EcrTokens):
            self._tokens.prepare(region)

    def _node_credential(self, registry: EcrRegistry, host: str, problems: list[str]
                         ) -> tuple[RegistryAuth | None, dict[str, str], Fallback | None]:
        """The node's credential, whose it is, and the other source as the fallback: the copy then the
        role (`copies_first`), else the role then the copy.

        When one source fails and the other serves, the failure is not a problem of the pull (the copy's
        is logged when it is read); when both fail, both are named.
        """
        copy_errors: tuple[type[Exception], ...] = (AgentCredentialsError, CredentialStoreError)
        sources: list[tuple[RegistryTokens | RegistryCopies, tuple[type[Exception], ...]]] = [
            (source, errors) for source, errors in ((self._copies, copy_errors), (self._tokens, (RegistryTokenError,)))
            if source is not None
        ]
        if not self._copies_first:
            sources.reverse()
        found: list[str] = []
        for index, (source, errors) in enumerate(sources):
            try:
                auth = source.auth(registry, host)
            except errors as e:
                found.append(str(e))
                continue
            fallback = None
            if index + 1 < len(sources):
                other = sources[index + 1][0]

                def get(other: RegistryTokens | RegistryCopies = other) -> tuple[RegistryAuth, str]:
                    return other.auth(registry, host), self._holder(other, registry)

                fallback = Fallback(self._holder(other, registry), get)
            return auth, {credential_identity(auth): self._holder(source, registry)}, fallback
        problems.extend(found)
        return None, {}, None

    def _holder(self, source: RegistryTokens | RegistryCopies, registry: EcrRegistry) -> str:
        if isinstance(source, RegistryCopies):
            return source.holder(registry)
        who = source.issued_to(registry) if isinstance(source, EcrTokens) else None
        return "the agent's own role" + (f" ({who})" if who else "")


def registry_credentials(
    settings: AgentSettings,
    *,
    secrets: AgentSecrets,
    clock: Callable[[], float],
    token_source: RegistryTokenSource | None = None,
    wait: Callable[[float], object] = time.sleep,
    random: Callable[[], float] = random.random,
) -> RegistryCredentials:
    """The agent's credentials as `ECR_CREDENTIALS` and `SECRET_PREFIX` say; `token_source` replaces
    ECR's `GetAuthorizationToken` for the role's tokens (tests, local mode); `wait` and `random` are the
    backoff's sleep and the jitter's draw."""
    copies = (
        RegistryCopies(secrets, settings.secret_prefix, clock=clock, random=random) if settings.secret_prefix else None
    )
    tokens = None
    if settings.ecr_credentials is not EcrCredentials.COPIES:
        tokens = EcrTokens(endpoint_url=settings.aws_endpoint_url, clock=clock, source=token_source, wait=wait,
                           random=random)
    return RegistryCredentials(secrets=secrets, tokens=tokens, copies=copies,
                               copies_first=settings.ecr_credentials is EcrCredentials.SHARED)
