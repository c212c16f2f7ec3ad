"""Registry credential refresh: its configuration, which namespaces it targets, and when a secret
needs a new token.

The kubelet's ecr-credential-provider caches a token for half its lifetime; a secret is refreshed on
the same rule, so a secret written here is never older than what the kubelet itself would use. The
token's `issuedAt` and `expiresAt` travel with each secret (annotations on Kubernetes secrets, JSON
fields in Secrets Manager), so the decision needs nothing but the secret and the clock.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from prewarm.domain.kubernetes import (
    LabelSelector,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    format_time,
    parse_time,
)
from prewarm.domain.registries import ECR_PUBLIC_HOST, InvalidCredentialsError, RegistryAuth, docker_config_auths
from prewarm.domain.validation import describe_validation_error

DEFAULT_SECRET_NAME: Final = "prewarm-ecr"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "prewarm"
EXPIRES_AT_ANNOTATION: Final = "prewarm.dev/expires-at"
ISSUED_AT_ANNOTATION: Final = "prewarm.dev/issued-at"
# Whose pull permissions the secret's tokens carry: the principal(s) that asked for them.
ISSUED_TO_ANNOTATION: Final = "prewarm.dev/issued-to"
DOCKER_CONFIG_JSON_TYPE: Final = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_JSON_KEY: Final = ".dockerconfigjson"
# ECR Public hands out tokens in us-east-1 only.
ECR_PUBLIC_TOKEN_REGION: Final = "us-east-1"

_ACCOUNT_RE: Final = re.compile(r"\d{12}")
_REGION_RE: Final = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")
_ROLE_ARN_RE: Final = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_HOST_RE: Final = re.compile(
    r"(?=.{1,253}(:|$))[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:\d{1,5})?"
)
_PATTERN_RE: Final = re.compile(r"[a-z0-9*?-]{1,63}")


class CredentialsConfigError(ValueError):
    """The credentials configuration is invalid; the message names each field at fault."""


# --- configuration --------------------------------------------------------------------------------


class _ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class RegistryConfig(_ConfigModel):
    """One registry to get tokens for: a private ECR registry (account and region) or ECR Public."""

    account: str | None = Field(default=None, description="12-digit AWS account of a private registry")
    region: str | None = Field(default=None, description="region of a private registry")
    role_arn: str | None = Field(default=None, description="role to assume for the token (cross-account pulls)")
    public: bool = Field(default=False, description="ECR Public (public.ecr.aws); no account or region")
    extra_hosts: tuple[str, ...] = Field(
        default=(), description="other registry hosts the same token works for, e.g. a pull-through cache alias"
    )

    @field_validator("account")
    @classmethod
    def _account_is_12_digits(cls, account: str | None) -> str | None:
        if account is not None and not _ACCOUNT_RE.fullmatch(account):
            raise ValueError(f"must be a 12-digit AWS account ID, got {account!r}")
        return account

    @field_validator("region")
    @classmethod
    def _region_is_a_region(cls, region: str | None) -> str | None:
        if region is not None and not _REGION_RE.fullmatch(region):
            raise ValueError(f"must be an AWS region such as 'us-east-1', got {region!r}")
        return region

    @field_validator("role_arn")
    @classmethod
    def _role_arn_is_a_role(cls, role_arn: str | None) -> str | None:
        if role_arn is not None and not _ROLE_ARN_RE.fullmatch(role_arn):
            raise ValueError(f"must be an IAM role ARN (arn:aws:iam::<account>:role/<name>), got {role_arn!r}")
        return role_arn

    @field_validator("extra_hosts")
    @classmethod
    def _hosts_are_hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for index, host in enumerate(hosts):
            if not _HOST_RE.fullmatch(host):
                raise ValueError(f"[{index}] must be a lower-case registry host or host:port, got {host!r}")
        return hosts

    @model_validator(mode="after")
    def _private_or_public(self) -> RegistryConfig:
        if self.public:
            if self.account is not None or self.region is not None:
                raise ValueError("a public registry (public: true) takes no account or region")
        elif self.account is None or self.region is None:
            missing = " and ".join(n for n, v in (("account", self.account), ("region", self.region)) if v is None)
            raise ValueError(f"{missing} required for a private registry (or set public: true for ECR Public)")
        return self

    @property
    def host(self) -> str:
        """The registry host the token is issued for."""
        if self.public:
            return ECR_PUBLIC_HOST
        region = self.region or ""
        domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
        return f"{self.account}.dkr.ecr.{region}.{domain}"

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host the token is written for: the registry first, then the extra hosts."""
        return (self.host, *self.extra_hosts)

    @property
    def token_region(self) -> str:
        return ECR_PUBLIC_TOKEN_REGION if self.public else (self.region or "")


class NamespaceTargets(_ConfigModel):
    """The namespaces that get the pull secret: names matching `include` (`*` and `?` wildcards) and
    not `exclude`, whose labels match `labelSelector` when one is given."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    label_selector: LabelSelector | None = None

    @field_validator("include", "exclude")
    @classmethod
    def _patterns_are_namespace_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for index, pattern in enumerate(patterns):
            if not _PATTERN_RE.fullmatch(pattern):
                raise ValueError(
                    f"[{index}] {pattern!r} is not a namespace pattern: lower-case letters, digits, '-', "
                    "and the wildcards '*' and '?', at most 63 characters"
                )
        return patterns

    @field_validator("include")
    @classmethod
    def _include_something(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        if not patterns:
            raise ValueError('selects no namespace: give patterns such as ["*"], or leave "namespaces" out '
                             "to write no pull secrets")
        return patterns

    def matches(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """Whether the namespace `name` with `labels` is a target."""
        if not any(_wildcard(p).fullmatch(name) for p in self.include):
            return False
        if any(_wildcard(p).fullmatch(name) for p in self.exclude):
            return False
        return self.label_selector is None or self.label_selector.matches(labels)


class CredentialsConfig(_ConfigModel):
    """What `refresh_ecr_credentials` keeps fresh. Without `namespaces` only the agents' Secrets
    Manager credentials are written."""

    registries: tuple[RegistryConfig, ...]
    namespaces: NamespaceTargets | None = None
    secret_name: str = DEFAULT_SECRET_NAME
    service_accounts: tuple[str, ...] = ("default",)

    @field_validator("registries")
    @classmethod
    def _some_registry(cls, registries: tuple[RegistryConfig, ...]) -> tuple[RegistryConfig, ...]:
        if not registries:
            raise ValueError("give at least one registry ({\"account\": ..., \"region\": ...} or {\"public\": true})")
        return registries

    @field_validator("namespaces", mode="before")
    @classmethod
    def _list_means_include(cls, value: Any) -> Any:
        # `"namespaces": ["team-*"]` is short for `{"include": ["team-*"]}`.
        return {"include": value} if isinstance(value, list) else value

    @field_validator("secret_name")
    @classmethod
    def _secret_name_is_a_name(cls, name: str) -> str:
        if problem := dns1123_subdomain_problem(name):
            raise ValueError(problem)
        return name

    @field_validator("service_accounts")
    @classmethod
    def _service_accounts_are_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for index, name in enumerate(names):
            if problem := dns1123_subdomain_problem(name):
                raise ValueError(f"[{index}] {problem}")
        return names

    @model_validator(mode="after")
    def _hosts_are_unique(self) -> CredentialsConfig:
        seen: dict[str, int] = {}
        for index, registry in enumerate(self.registries):
            for host in registry.hosts:
                if host in seen:
                    raise ValueError(
                        f"registries[{index}]: host {host!r} is already given by registries[{seen[host]}]"
                    )
                seen[host] = index
        return self

    @classmethod
    def parse(cls, text: str, source: str) -> CredentialsConfig:
        """The configuration in JSON `text`; `CredentialsConfigError` names `source` and each bad field."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as e:
            problems = describe_validation_error(
                e, subject="", problem=lambda err: _problem(err["loc"], err["type"], err["msg"]), skip=_follows)
            raise CredentialsConfigError(f"{source}: {problems}") from None


def _follows(error: Any, errors: Sequence[Any]) -> bool:
    # A list whose item failed is also reported as too short; the item's error says it all.
    loc = tuple(error["loc"])
    return bool(error["type"] == "too_short" and any(
        len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
    ))


_INDEX_PREFIX: Final = re.compile(r"\[(\d+)\] ")


def _problem(loc: Sequence[int | str], kind: str, message: str) -> str:
    message = message.removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = "unknown field"
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    # Validators of a list name the bad item as "[i] ..." so the path can point at it.
    if index := _INDEX_PREFIX.match(message):
        path += f"[{index.group(1)}]"
        message = message[index.end():]
    return f"{path}: {message}" if path else message


def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def select_namespaces(namespaces: Iterable[Mapping[str, Any]], targets: NamespaceTargets) -> list[str]:
    """The names of the target namespaces among the API's namespace objects, sorted.

    A namespace being deleted (phase `Terminating`) is left out: the API refuses new content in it.
    """
    chosen = []
    for namespace in namespaces:
        metadata = namespace.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name or dns1123_label_problem(name):
            continue
        if (namespace.get("status") or {}).get("phase") == "Terminating":
            continue
        if targets.matches(name, metadata.get("labels")):
            chosen.append(name)
    return sorted(chosen)


# --- tokens and timing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegistryToken:
    """A registry token and its lifetime (epoch seconds), as credentials for each of the registry's hosts.

    The repr shows hosts and times only: `RegistryAuth` hides the password.
    """

    auths: tuple[RegistryAuth, ...]
    issued_at: float
    expires_at: float
    #: The principal that asked for the token (`sts:GetCallerIdentity`'s ARN), whose pull permissions it
    #: carries; None when unknown.
    issued_to: str | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(auth.server for auth in self.auths)

    @classmethod
    def for_hosts(cls, username: str, password: str, hosts: Sequence[str], *, issued_at: float,
                  expires_at: float, issued_to: str | None = None) -> RegistryToken:
        auths = tuple(RegistryAuth(username=username, password=password, server=host) for host in hosts)
        return cls(auths=auths, issued_at=issued_at, expires_at=expires_at, issued_to=issued_to)


def refresh_due_at(issued_at: float, expires_at: float) -> float:
    """When a token issued at `issued_at` and valid until `expires_at` is due for refresh: half-life."""
    return issued_at + (expires_at - issued_at) / 2


def is_fresh(issued_at: float, expires_at: float, now: float) -> bool:
    """Whether a token is still within the first half of its lifetime."""
    return expires_at > issued_at and issued_at <= now < refresh_due_at(issued_at, expires_at)


def docker_config(tokens: Iterable[RegistryToken]) -> dict[str, dict[str, dict[str, str]]]:
    """The `{"auths": {host: {username, password, auth}}}` document of the tokens."""
    return {
        "auths": {
            auth.server: {"username": auth.username, "password": auth.password, "auth": auth.auth}
            for token in tokens
            for auth in token.auths
        }
    }


# --- the Kubernetes pull secret -------------------------------------------------------------------


class Action(StrEnum):
    CREATE = "create"
    REFRESH = "refresh"
    KEEP = "keep"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one namespace's pull secret, and why. `expires_at` is the kept token's expiry."""

    action: Action
    reason: str
    expires_at: float | None = None


def decide(secret: Mapping[str, Any] | None, hosts: Iterable[str], now: float) -> Decision:
    """Whether the pull secret `secret` (the API object, or None) must be created, refreshed, kept or
    left alone because prewarm does not manage it. `hosts` are the registries it must hold."""
    if secret is None:
        return Decision(Action.CREATE, "secret does not exist")
    metadata = secret.get("metadata") or {}
    name = metadata.get("name", "")
    if (metadata.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
        return Decision(
            Action.REFUSE,
            f"secret {name!r} exists and is not managed by prewarm (label {MANAGED_BY_LABEL}={MANAGED_BY} is "
            "missing); delete it or choose another secretName",
        )
    if secret.get("type") != DOCKER_CONFIG_JSON_TYPE:
        return Decision(
            Action.REFUSE,
            f"secret {name!r} has type {secret.get('type')!r}, not {DOCKER_CONFIG_JSON_TYPE!r}, and a secret's "
            "type cannot change; delete it so it is created again",
        )
    annotations = metadata.get("annotations") or {}
    issued_at = parse_time(annotations.get(ISSUED_AT_ANNOTATION))
    expires_at = parse_time(annotations.get(EXPIRES_AT_ANNOTATION))
    if issued_at is None or expires_at is None:
        return Decision(Action.REFRESH, f"annotations {ISSUED_AT_ANNOTATION} and {EXPIRES_AT_ANNOTATION} are "
                                        "missing or not RFC 3339 times")
    held = _secret_hosts(secret)
    if held is None:
        return Decision(Action.REFRESH, f"data {DOCKER_CONFIG_JSON_KEY} is not a valid docker config")
    wanted = set(hosts)
    if held != wanted:
        return Decision(Action.REFRESH, "registries changed: " + _host_change(held, wanted))
    if not is_fresh(issued_at, expires_at, now):
        return Decision(Action.REFRESH, f"token is past half its lifetime (issued {format_time(issued_at)}, "
                                        f"expires {format_time(expires_at)})")
    return Decision(Action.KEEP, f"fresh until {format_time(refresh_due_at(issued_at, expires_at))}", expires_at)


def _host_change(held: set[str], wanted: set[str]) -> str:
    parts = []
    if added := sorted(wanted - held):
        parts.append("adds " + ", ".join(added))
    if removed := sorted(held - wanted):
        parts.append("drops " + ", ".join(removed))
    return "; ".join(parts)


def _secret_hosts(secret: Mapping[str, Any]) -> set[str] | None:
    encoded = (secret.get("data") or {}).get(DOCKER_CONFIG_JSON_KEY)
    if not isinstance(encoded, str):
        return None
    try:
        document = json.loads(base64.b64decode(encoded, validate=True))
        return {auth.server for auth in docker_config_auths(document)}
    except (binascii.Error, ValueError, InvalidCredentialsError):
        return None


def pull_secret(
    name: str, namespace: str, tokens: Sequence[RegistryToken], existing: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The `kubernetes.io/dockerconfigjson` secret holding `tokens`, labelled as prewarm's.

    Given the `existing` secret, its other labels and annotations are kept and its resourceVersion is
    carried, so the replace fails with a conflict if the secret changed since it was read.
    """
    if not tokens:
        raise ValueError("a pull secret needs at least one registry token")
    metadata = (existing or {}).get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY}
    annotations = {
        **(metadata.get("annotations") or {}),
        ISSUED_AT_ANNOTATION: format_time(min(t.issued_at for t in tokens)),
        EXPIRES_AT_ANNOTATION: format_time(min(t.expires_at for t in tokens)),
    }
    annotations.pop(ISSUED_TO_ANNOTATION, None)
    if issued_to := ",".join(dict.fromkeys(t.issued_to for t in tokens if t.issued_to)):
        annotations[ISSUED_TO_ANNOTATION] = issued_to
    new_metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels,
                                    "annotations": annotations}
    if metadata.get("resourceVersion"):
        new_metadata["resourceVersion"] = metadata["resourceVersion"]
    document = json.dumps(docker_config(tokens), sort_keys=True, separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": new_metadata,
        "type": DOCKER_CONFIG_JSON_TYPE,
        "data": {DOCKER_CONFIG_JSON_KEY: base64.b64encode(document.encode()).decode("ascii")},
    }


def image_pull_secrets_with(service_account: Mapping[str, Any], secret_name: str) -> list[dict[str, str]] | None:
    """The service account's `imagePullSecrets` with `secret_name` appended, or None when it is there."""
    current = [dict(ref) for ref in service_account.get("imagePullSecrets") or () if isinstance(ref, Mapping)]
    if any(ref.get("name") == secret_name for ref in current):
        return None
    return [*current, {"name": secret_name}]


# --- the agents' copy in Secrets Manager ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredToken:
    """What a registry credential secret says about its token: the hosts and lifetime, never the token."""

    hosts: frozenset[str]
    issued_at: float
    expires_at: float


def registry_secret_name(prefix: str, host: str) -> str:
    """The Secrets Manager name of a registry's agent credentials; `:` (a port) becomes `_`."""
    return f"{prefix}/registry/{host.replace(':', '_')}"


def registry_secret_document(token: RegistryToken) -> dict[str, Any]:
    """The JSON stored for the agents: the docker config plus `issuedAt` and `expiresAt` (RFC 3339), and
    `issuedTo` (the token's principal) when known."""
    return {**docker_config([token]), "issuedAt": format_time(token.issued_at),
            "expiresAt": format_time(token.expires_at), **({"issuedTo": token.issued_to} if token.issued_to else {})}


def stored_token(document: Mapping[str, Any]) -> StoredToken | None:
    """The token metadata of a registry credential document, or None when it is not one."""
    issued_at, expires_at = parse_time(document.get("issuedAt")), parse_time(document.get("expiresAt"))
    if issued_at is None or expires_at is None:
        return None
    try:
        hosts = frozenset(auth.server for auth in docker_config_auths({"auths": document.get("auths")}))
    except InvalidCredentialsError:
        return None
    return StoredToken(hosts=hosts, issued_at=issued_at, expires_at=expires_at)


def stored_token_is_fresh(stored: StoredToken | None, hosts: Iterable[str], now: float) -> bool:
    """Whether a stored registry credential covers exactly `hosts` and is within half its lifetime."""
    return stored is not None and stored.hosts == frozenset(hosts) and is_fresh(
        stored.issued_at, stored.expires_at, now
    )
