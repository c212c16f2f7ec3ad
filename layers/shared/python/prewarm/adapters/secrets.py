"""Registry credentials in AWS Secrets Manager, where node agents read them.

Layout under the stack's secret prefix:

- `<prefix>/pull-secrets/<namespace>/<name>`: a job's `pullSecrets`, mirrored from the cluster as a
  docker config (`{"auths": {...}}`) by `SecretsManagerMirror`; deleted once no job names them.
- `<prefix>/registry/<host>`: a registry's token for agents without pull rights of their own,
  `{"auths": {...}, "issuedAt": ..., "expiresAt": ..., "issuedTo": <principal ARN>}`, written by
  `SecretsManagerCredentialStore`; the token carries `issuedTo`'s pull permissions.

`AgentCredentials` is the agents' reader. This module imports no Kubernetes code: the mirror gets the
cluster adapter handed in. No secret value ever reaches a log line or an exception message.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.domain.kubernetes import format_time, parse_time
from prewarm.domain.refresh import (
    RegistryToken,
    StoredToken,
    registry_secret_document,
    registry_secret_name,
    stored_token,
)
from prewarm.domain.registries import InvalidCredentialsError, Keyring, docker_config_auths
from prewarm.domain.retry import retry_on_conflict
from prewarm.services.ports import AgentCredentialsError, ClusterError, CredentialStoreError, PullSecretError

__all__ = [
    "AgentCredentials",
    "AgentCredentialsError",
    "ConfigParameterError",
    "RegistryCopy",
    "SecretStoreError",
    "SecretStoreRetryableError",
    "SecretsManagerCredentialStore",
    "SecretsManagerMirror",
    "pull_secret_mirror_name",
    "read_config_parameter",
]

TAG_NAMESPACE = "prewarm:namespace"
TAG_SECRET = "prewarm:secret"
TAG_CLUSTER = "prewarm:cluster"
TAG_MIRRORED_AT = "prewarm:mirrored-at"
TAG_REGISTRY = "prewarm:registry"
# A mirror this recent is never cleaned up: a job planned while the sweep ran may just have claimed it.
CLEANUP_MIN_AGE_SECONDS = 900

_DOCKER_CONFIG_JSON = ("kubernetes.io/dockerconfigjson", ".dockerconfigjson")
_DOCKERCFG = ("kubernetes.io/dockercfg", ".dockercfg")
# At DEBUG botocore logs request parameters and response bodies: the secret values this module moves.
_botocore = logging.getLogger("botocore")
_botocore.setLevel(max(logging.INFO, _botocore.getEffectiveLevel()))

_RETRYABLE = {"ThrottlingException", "InternalServiceError", "InternalFailure", "ServiceUnavailable",
              "RequestTimeout", "RequestTimeoutException"}


class SecretStoreError(CredentialStoreError):
    """A Secrets Manager call failed for good (permissions, a malformed name or value)."""


class SecretStoreRetryableError(SecretStoreError):
    """Throttling or a transient Secrets Manager failure: the same call may succeed later."""


class ConfigParameterError(RuntimeError):
    """The SSM parameter holding the credentials configuration cannot be read."""


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _store_error(e: ClientError | BotoCoreError, what: str) -> SecretStoreError:
    if isinstance(e, BotoCoreError):
        return SecretStoreRetryableError(f"{what}: {e}")
    code = _code(e)
    cls = SecretStoreRetryableError if code in _RETRYABLE else SecretStoreError
    return cls(f"{what}: {code}: {e.response.get('Error', {}).get('Message', '')}")


def _is_marked_deleted(e: ClientError) -> bool:
    return _code(e) == "InvalidRequestException" and "delet" in str(e.response.get("Error", {}).get("Message", ""))


def _secretsmanager_client() -> Any:
    import boto3

    return boto3.client("secretsmanager")


class _Secrets:
    """Create-or-update of one secret, writing a new version only when the value changed."""

    def __init__(self, client: Any) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _secretsmanager_client()
        return self._client

    def read(self, secret_id: str) -> tuple[str, str] | None:
        """(ARN, value) of the current version, or None when there is no such secret."""
        try:
            answer = self.client.get_secret_value(SecretId=secret_id)
        except ClientError as e:
            if _code(e) == "ResourceNotFoundException":
                return None
            if _is_marked_deleted(e):
                return None
            raise _store_error(e, f"read secret {secret_id}") from e
        except BotoCoreError as e:
            raise _store_error(e, f"read secret {secret_id}") from e
        return str(answer["ARN"]), str(answer.get("SecretString") or "")

    def put(self, name: str, value: str, tags: Mapping[str, str], *, description: str) -> tuple[str, bool]:
        """(ARN, whether a new version was written); tags are set on every call."""
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        return retry_on_conflict(
            lambda: self._put_once(name, value, tag_list, description=description),
            conflict=_SecretChanged, attempts=3,
            exhausted=lambda: SecretStoreRetryableError(
                f"secret {name} kept changing between read and write; try again"),
        )

    def _put_once(self, name: str, value: str, tag_list: list[dict[str, str]], *, description: str) -> tuple[str, bool]:
        try:
            current = self.client.get_secret_value(SecretId=name)
        except ClientError as e:
            if _code(e) == "ResourceNotFoundException":
                try:
                    created = self.client.create_secret(Name=name, SecretString=value, Tags=tag_list,
                                                        Description=description)
                except ClientError as create_error:
                    if _code(create_error) == "ResourceExistsException":
                        raise _SecretChanged from create_error  # created meanwhile: read it again
                    raise _store_error(create_error, f"create secret {name}") from create_error
                return str(created["ARN"]), True
            if not _is_marked_deleted(e):
                raise _store_error(e, f"read secret {name}") from e
            # Deleted with a recovery window (by hand): restore it rather than fail until it is gone.
            self._call(self.client.restore_secret, f"restore secret {name}", SecretId=name)
            raise _SecretChanged from e
        except BotoCoreError as e:
            raise _store_error(e, f"read secret {name}") from e
        arn = str(current["ARN"])
        changed = current.get("SecretString") != value
        if changed:
            self._call(self.client.put_secret_value, f"write secret {name}", SecretId=arn, SecretString=value)
        self._call(self.client.tag_resource, f"tag secret {name}", SecretId=arn, Tags=tag_list)
        return arn, changed

    @staticmethod
    def _call(operation: Callable[..., Any], what: str, **kwargs: Any) -> Any:
        try:
            return operation(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise _store_error(e, what) from e


class _SecretChanged(Exception):
    """The secret was created, or restored, between the read and the write: read it again."""


# --- pullSecrets mirroring -----------------------------------------------------------------------


class SecretReader(Protocol):
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...


def pull_secret_mirror_name(prefix: str, namespace: str, name: str, cluster: str = "") -> str:
    """The Secrets Manager name of a mirrored pull secret; a registered cluster's under `@<cluster>/`
    (Secrets Manager names take no `:`, and no namespace starts with `@`)."""
    where = f"@{cluster}/{namespace}" if cluster else namespace
    return f"{prefix}/pull-secrets/{where}/{name}"


def docker_config_of(secret: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The docker config (`{"auths": ...}`) of an image pull secret; a legacy `.dockercfg` is converted.

    `PullSecretError` names the secret and what is wrong with it, never its contents.
    """
    where = f"pull secret {namespace}/{name}"
    kind = secret.get("type")
    data = secret.get("data") or {}
    if kind == _DOCKER_CONFIG_JSON[0]:
        key = _DOCKER_CONFIG_JSON[1]
    elif kind == _DOCKERCFG[0]:
        key = _DOCKERCFG[1]
    else:
        raise PullSecretError(
            f"{where} has type {kind!r}; image pull secrets need type {_DOCKER_CONFIG_JSON[0]!r} "
            f"(or the legacy {_DOCKERCFG[0]!r})"
        )
    encoded = data.get(key)
    if not isinstance(encoded, str) or not encoded:
        raise PullSecretError(f"{where} has no data key {key!r}")
    # Parse errors are not chained below: JSONDecodeError carries the whole document (`.doc`).
    try:
        document = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        raise PullSecretError(f"{where}: data {key!r} is not base64 of a JSON document") from None
    if not isinstance(document, dict):
        raise PullSecretError(f"{where}: data {key!r} is not a JSON object")
    config = document if key == _DOCKER_CONFIG_JSON[1] else {"auths": document}
    try:
        docker_config_auths(config)
    except InvalidCredentialsError as e:
        raise PullSecretError(f"{where}: {e}") from None
    return config


class SecretsManagerMirror:
    """`PullSecretMirror` on Secrets Manager: a job's pullSecrets copied where its nodes' agents can read them.

    The secrets are read from `cluster` (the stack's own) or, given `registered`, from a registered cluster
    by name; given `readers` instead, every cluster's reader (the stack's own under "") is asked for when a
    secret is read, not before, so a mirror built for the sweep's cleanup builds no Kubernetes client.
    """

    def __init__(self, prefix: str, cluster: SecretReader | None = None, client: Any = None,
                 clock: Callable[[], float] = time.time,
                 registered: Callable[[str], SecretReader | None] | None = None,
                 readers: Callable[[str], SecretReader | None] | None = None) -> None:
        self.prefix = prefix
        self._cluster = cluster
        self._registered = registered
        self._readers = readers
        self._secrets = _Secrets(client)
        self._clock = clock

    def mirror(self, namespace: str, names: list[str], cluster: str = "") -> list[str]:
        """The ARNs of the mirrors of `names` in `namespace` of `cluster` (the stack's own, or a registered
        one: read there, mirrored under its own name), created or updated as needed.

        A missing, unreadable or malformed secret raises `PullSecretError` (the job fails with it);
        a transient cluster or Secrets Manager failure raises its retryable error instead.
        """
        arns = []
        for name in dict.fromkeys(names):
            config = docker_config_of(self._read(namespace, name, cluster), namespace, name)
            value = json.dumps(config, sort_keys=True, separators=(",", ":"))
            tags = {TAG_NAMESPACE: namespace, TAG_SECRET: name, TAG_MIRRORED_AT: str(int(self._clock()))}
            if cluster:
                tags[TAG_CLUSTER] = cluster
            try:
                arn, _ = self._secrets.put(
                    pull_secret_mirror_name(self.prefix, namespace, name, cluster), value, tags,
                    description=f"prewarm mirror of image pull secret {namespace}/{name}",
                )
            except SecretStoreRetryableError:
                raise
            except SecretStoreError as e:
                raise PullSecretError(f"pull secret {namespace}/{name} cannot be mirrored for the agents: {e}") from e
            arns.append(arn)
        return arns

    def _read(self, namespace: str, name: str, cluster: str) -> dict[str, Any]:
        if self._readers is not None:
            reader = self._readers(cluster)
        else:
            reader = self._cluster if not cluster else self._registered(cluster) if self._registered else None
        if reader is None:
            where = f"cluster {cluster!r} is not reachable" if cluster else (
                "no Kubernetes API is configured (set CLUSTER_NAME, or KUBE_API_ENDPOINT)")
            raise PullSecretError(f"pull secret {namespace}/{name} cannot be read: {where}")
        try:
            secret = reader.get_secret(namespace, name)
        except ClusterError as e:
            if e.retryable:
                raise
            raise PullSecretError(f"pull secret {namespace}/{name} cannot be read: {e}") from e
        if secret is None:
            raise PullSecretError(f"pull secret {namespace}/{name} not found: create it in namespace {namespace} "
                                  "or remove it from the job's pullSecrets")
        return secret

    def cleanup(self, referenced: set[tuple[str, str]], *, min_age_seconds: float = CLEANUP_MIN_AGE_SECONDS
                ) -> list[str]:
        """Deletes (without recovery) the mirrors of pull secrets no job names any more; returns their names.
        `referenced` holds (namespace, name), the namespace scoped by its cluster (`<cluster>:<namespace>`)
        for a registered cluster's.

        Mirrors written in the last `min_age_seconds` are kept. Every deletion is tried; failures are
        raised together at the end as `SecretStoreError`.
        """
        base = f"{self.prefix}/pull-secrets/"
        now = self._clock()
        deleted: list[str] = []
        failed: list[str] = []
        for entry in self._list(base):
            name = str(entry.get("Name", ""))
            rest, cluster = name.removeprefix(base), ""
            if rest.startswith("@"):
                cluster, _, rest = rest[1:].partition("/")
            namespace, _, secret = rest.partition("/")
            if not name.startswith(base) or not namespace or not secret or "/" in secret:
                continue  # not a mirror this stack wrote
            named = (f"{cluster}:{namespace}" if cluster else namespace, secret) in referenced
            if named or now - _last_mirrored(entry) < min_age_seconds:
                continue
            try:
                self._secrets.client.delete_secret(SecretId=entry["ARN"], ForceDeleteWithoutRecovery=True)
            except ClientError as e:
                if _code(e) != "ResourceNotFoundException":
                    failed.append(f"{name} ({_code(e)})")
                    continue
            except BotoCoreError as e:
                failed.append(f"{name} ({e})")
                continue
            deleted.append(name)
        if failed:
            raise SecretStoreError(f"could not delete unused pull secret mirrors: {', '.join(failed)}")
        return deleted

    def _list(self, base: str) -> Iterable[dict[str, Any]]:
        try:
            pages = self._secrets.client.get_paginator("list_secrets").paginate(
                Filters=[{"Key": "name", "Values": [base]}]
            )
            for page in pages:
                yield from page.get("SecretList") or ()
        except (ClientError, BotoCoreError) as e:
            raise _store_error(e, f"list secrets under {base}") from e


def _last_mirrored(entry: Mapping[str, Any]) -> float:
    """When a job last claimed the mirror: its tag, else when Secrets Manager last saw it change."""
    tags = {t.get("Key"): t.get("Value") for t in entry.get("Tags") or ()}
    if str(tags.get(TAG_MIRRORED_AT, "")).isdigit():
        return float(tags[TAG_MIRRORED_AT])
    times = [d.timestamp() for d in (entry.get("CreatedDate"), entry.get("LastChangedDate")) if d is not None]
    return max(times, default=0.0)


# --- registry credentials for the agents -----------------------------------------------------------


class SecretsManagerCredentialStore:
    """Where `refresh_ecr_credentials` keeps each registry host's token for the agents."""

    def __init__(self, prefix: str, client: Any = None) -> None:
        self.prefix = prefix
        self._secrets = _Secrets(client)

    def read(self, host: str) -> StoredToken | None:
        """The stored token's hosts and lifetime, or None when there is none or it is unreadable."""
        found = self._secrets.read(registry_secret_name(self.prefix, host))
        if found is None:
            return None
        try:
            document = json.loads(found[1])
        except ValueError:
            return None
        return stored_token(document) if isinstance(document, dict) else None

    def write(self, host: str, token: RegistryToken) -> str:
        """Stores `token` for `host`; returns the secret's ARN."""
        value = json.dumps(registry_secret_document(token), sort_keys=True, separators=(",", ":"))
        arn, _ = self._secrets.put(registry_secret_name(self.prefix, host), value, {TAG_REGISTRY: host},
                                   description=f"prewarm registry credentials for {host}")
        return arn


@dataclass(frozen=True, slots=True)
class _Cached:
    keyring: Keyring
    read_at: float
    expires_at: float | None
    issued_at: float | None = None
    issued_to: str | None = None


@dataclass(frozen=True, slots=True)
class RegistryCopy:
    """A registry copy as the agents read it: its credentials, its token's times and principal (None when
    absent)."""

    secret_id: str
    keyring: Keyring
    issued_at: float | None
    expires_at: float | None
    issued_to: str | None = None


class AgentCredentials:
    """The agents' reader: secret ARNs (or names) → a `Keyring`, cached for `max_age_seconds`.

    Registry credential secrets carry `expiresAt`; one past it raises `AgentCredentialsError`.
    """

    def __init__(self, client: Any = None, clock: Callable[[], float] = time.time,
                 max_age_seconds: float = 300) -> None:
        self._secrets = _Secrets(client)
        self._clock = clock
        self._max_age = max_age_seconds
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def keyring(self, secret_ids: Iterable[str]) -> Keyring:
        """One keyring of all the secrets, in order, as the kubelet merges a pod's pull secrets."""
        rings = [self._keyring_of(secret_id) for secret_id in secret_ids]
        return rings[0].merge(*rings[1:]) if rings else Keyring()

    def registry_keyring(self, prefix: str, host: str) -> Keyring | None:
        """The refresher's credentials for registry `host`, or None when it stores none for it."""
        copy = self.registry_copy(prefix, host)
        return copy.keyring if copy is not None else None

    def registry_copy(self, prefix: str, host: str) -> RegistryCopy | None:
        """The refresher's credentials for registry `host` with their token's times, or None when it
        stores none for it. Raises `AgentCredentialsError` when the copy expired or cannot be read."""
        secret_id = registry_secret_name(prefix, host)
        try:
            cached = self._read(secret_id)
        except _MissingSecretError:
            return None
        return RegistryCopy(secret_id, cached.keyring, cached.issued_at, cached.expires_at, cached.issued_to)

    def _keyring_of(self, secret_id: str) -> Keyring:
        return self._read(secret_id).keyring

    def _read(self, secret_id: str) -> _Cached:
        now = self._clock()
        with self._lock:
            cached = self._cache.get(secret_id)
        if cached is not None and now - cached.read_at < self._max_age and (
            cached.expires_at is None or now < cached.expires_at
        ):
            return cached
        try:
            found = self._secrets.read(secret_id)
        except SecretStoreRetryableError:
            raise
        except SecretStoreError as e:
            raise AgentCredentialsError(f"secret {secret_id} cannot be read: {e}") from e
        if found is None:
            raise _MissingSecretError(f"secret {secret_id} does not exist (or is being deleted)")
        try:
            document = json.loads(found[1])
            keyring = Keyring.from_docker_config(document)
        except (ValueError, InvalidCredentialsError) as e:
            reason = str(e) if isinstance(e, InvalidCredentialsError) else "it is not JSON"
            raise AgentCredentialsError(f"secret {secret_id} holds no usable docker config: {reason}") from None
        expires_at = parse_time(document.get("expiresAt")) if isinstance(document, dict) else None
        if expires_at is not None and expires_at <= now:
            raise AgentCredentialsError(
                f"secret {secret_id} expired at {format_time(expires_at)}; check that refresh_ecr_credentials runs"
            )
        issued_at = parse_time(document.get("issuedAt")) if isinstance(document, dict) else None
        issued_to = document.get("issuedTo") if isinstance(document, dict) else None
        entry = _Cached(keyring=keyring, read_at=now, expires_at=expires_at, issued_at=issued_at,
                        issued_to=issued_to if isinstance(issued_to, str) else None)
        with self._lock:
            self._cache[secret_id] = entry
        return entry


class _MissingSecretError(AgentCredentialsError):
    pass


# --- configuration in SSM Parameter Store ------------------------------------------------------------


def read_config_parameter(name: str, client: Any = None) -> str:
    """The (decrypted) value of SSM parameter `name`; `ConfigParameterError` names it when unreadable."""
    if client is None:
        import boto3

        client = boto3.client("ssm")
    try:
        return str(client.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
    except ClientError as e:
        raise ConfigParameterError(
            f"CREDENTIALS_CONFIG_PARAMETER {name!r} cannot be read: {_code(e)}: "
            f"{e.response.get('Error', {}).get('Message', '')}"
        ) from e
    except BotoCoreError as e:
        raise ConfigParameterError(f"CREDENTIALS_CONFIG_PARAMETER {name!r} cannot be read: {e}") from e
