"""Keeping registry credentials fresh: pull secrets in the target namespaces and the agents' copies.

`refresh_credentials` runs on a schedule. It gets each registry's token only when something needs it,
writes the agents' Secrets Manager copy of each registry host, then for every target namespace creates
or refreshes the `kubernetes.io/dockerconfigjson` secret and adds it to the configured service
accounts. One namespace failing never stops the others; the report lists what happened to each.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prewarm.domain.refresh import (
    Action,
    CredentialsConfig,
    RegistryConfig,
    RegistryToken,
    decide,
    image_pull_secrets_with,
    pull_secret,
    select_namespaces,
    stored_token_is_fresh,
)
from prewarm.domain.retry import retry_on_conflict
from prewarm.services.clusters import on_each_cluster
from prewarm.services.ports import (
    ClusterConflictError,
    ClusterDirectory,
    ClusterError,
    CredentialsCluster,
    CredentialStore,
    CredentialStoreError,
    RegistryTokenError,
    RegistryTokenSource,
)

log = logging.getLogger(__name__)

# Writes that lose a race re-read and decide again this many times before the namespace fails.
_ATTEMPTS = 5


class Outcome(StrEnum):
    CREATED = "created"
    REFRESHED = "refreshed"
    FRESH = "skipped-fresh"
    FAILED = "failed"


@dataclass
class NamespaceResult:
    namespace: str
    outcome: Outcome
    reason: str = ""
    expires_at: float | None = None
    service_accounts_patched: list[str] = field(default_factory=list)
    service_accounts_missing: list[str] = field(default_factory=list)
    # The registered cluster the namespace is in ("" for the stack's own): each has its own secrets.
    cluster: str = ""


@dataclass
class RegistryResult:
    host: str
    outcome: Outcome
    reason: str = ""
    expires_at: float | None = None


@dataclass
class RefreshReport:
    """What one run did. Holds no token: safe to log and return."""

    registries: list[RegistryResult] = field(default_factory=list)
    namespaces: list[NamespaceResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _results(self) -> list[RegistryResult | NamespaceResult]:
        return [*self.registries, *self.namespaces]

    def count(self, *outcomes: Outcome) -> int:
        return sum(result.outcome in outcomes for result in self.namespaces)

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(r.outcome is Outcome.FAILED for r in self._results())

    def earliest_expiry(self) -> float | None:
        """The earliest expiry of every credential written or left in place."""
        times = [r.expires_at for r in self._results() if r.expires_at is not None]
        return min(times, default=None)

    def metrics(self, now: float) -> dict[str, float]:
        """Per-run metrics: namespaces updated, skipped and failed, and seconds to the earliest expiry."""
        values: dict[str, float] = {
            "NamespacesUpdated": self.count(Outcome.CREATED, Outcome.REFRESHED),
            "NamespacesSkipped": self.count(Outcome.FRESH),
            "NamespacesFailed": self.count(Outcome.FAILED),
        }
        if (earliest := self.earliest_expiry()) is not None:
            values["SecondsToEarliestExpiry"] = max(0.0, earliest - now)
        return values

    def describe(self) -> dict[str, Any]:
        return {
            "registries": [{"host": r.host, "outcome": r.outcome.value, "reason": r.reason} for r in self.registries],
            "namespaces": [
                {"namespace": n.namespace, "outcome": n.outcome.value, "reason": n.reason,
                 "service_accounts_patched": n.service_accounts_patched,
                 "service_accounts_missing": n.service_accounts_missing}
                for n in self.namespaces
            ],
            "errors": self.errors,
        }

    def raise_for_failures(self) -> None:
        """`CredentialRefreshError` listing every failed namespace and registry, when any failed."""
        if not self.failed:
            return
        parts = [f"namespace {n.namespace}: {n.reason}" for n in self.namespaces if n.outcome is Outcome.FAILED]
        parts += [f"registry {r.host}: {r.reason}" for r in self.registries if r.outcome is Outcome.FAILED]
        parts += self.errors
        raise CredentialRefreshError(parts)


class CredentialRefreshError(RuntimeError):
    """Some credentials could not be refreshed; lists each namespace or registry and why (no secrets)."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__(f"{len(failures)} credential refresh failure(s): " + "; ".join(failures))
        self.failures = failures


class _Tokens:
    """Each registry's token, got on first need and at most once per run; a failure is remembered
    so every namespace that needs the token reports it without asking AWS again."""

    def __init__(self, source: RegistryTokenSource) -> None:
        self._source = source
        self._got: dict[str, RegistryToken | RegistryTokenError] = {}
        self._lock = threading.Lock()  # clusters are refreshed side by side

    def get(self, registry: RegistryConfig) -> RegistryToken:
        with self._lock:
            if registry.host not in self._got:
                try:
                    self._got[registry.host] = self._source.token(registry)
                except RegistryTokenError as e:
                    self._got[registry.host] = e
            got = self._got[registry.host]
        if isinstance(got, RegistryTokenError):
            raise RegistryTokenError(got.host, got.reason)
        return got


def refresh_credentials(
    config: CredentialsConfig,
    clusters: ClusterDirectory | None,
    tokens: RegistryTokenSource,
    store: CredentialStore,
    *,
    clock: Callable[[], float],
) -> RefreshReport:
    """Brings every registry credential named by `config` up to date; see the module docstring.

    `clusters` (those the stack serves) may be None only when the configuration names no namespaces.
    The namespaces of every cluster served get their pull secrets the same way, from the same tokens,
    side by side (`services.clusters`); a cluster that cannot be reached is an error of its own and the
    others go on. The stack's own cluster must be configured (`ClusterConfigError` when it is not).
    """
    report = RefreshReport()
    got = _Tokens(tokens)
    for registry in config.registries:
        for host in registry.hosts:
            report.registries.append(_refresh_agent_copy(store, got, registry, host, clock()))
    if config.namespaces is None:
        return report
    if clusters is None:
        raise ValueError("the configuration names namespaces but no cluster was given")
    clusters.api()  # the stack's own: without it, the run fails

    def one(name: str, api: CredentialsCluster) -> RefreshReport:
        part = RefreshReport()
        _refresh_cluster(api, name, got, config, clock, part)
        return part

    for run in on_each_cluster(clusters, one, clock=clock):
        if run.outcome is None:
            report.errors.append(f"cluster {run.name}: {run.error}")
            continue
        report.namespaces += run.outcome.namespaces
        report.errors += run.outcome.errors
    return report


def _refresh_cluster(cluster: CredentialsCluster, name: str, got: _Tokens, config: CredentialsConfig,
                     clock: Callable[[], float], report: RefreshReport) -> None:
    assert config.namespaces is not None
    where = f" of cluster {name}" if name else ""
    selector = config.namespaces.label_selector
    query = selector.to_query() if selector is not None else ""
    try:
        listed = cluster.list_namespaces(query or None)
    except ClusterError as e:
        report.errors.append(f"cannot list namespaces{where}: {e}")
        return
    for namespace in select_namespaces(listed, config.namespaces):
        try:
            result = _refresh_namespace(cluster, got, config, namespace, clock)
        except (ClusterError, RegistryTokenError) as e:
            result = NamespaceResult(namespace, Outcome.FAILED, str(e))
        result.cluster = name
        if result.outcome is Outcome.FAILED:
            log.warning("namespace %s%s: pull secret not refreshed: %s", namespace, where, result.reason)
        report.namespaces.append(result)


def _refresh_agent_copy(
    store: CredentialStore, got: _Tokens, registry: RegistryConfig, host: str, now: float
) -> RegistryResult:
    try:
        stored = store.read(host)
        if stored is not None and stored_token_is_fresh(stored, registry.hosts, now):
            return RegistryResult(host, Outcome.FRESH, expires_at=stored.expires_at)
        token = got.get(registry)
        store.write(host, token)
    except (RegistryTokenError, CredentialStoreError) as e:
        log.warning("registry %s: agent credentials not refreshed: %s", host, e)
        return RegistryResult(host, Outcome.FAILED, str(e))
    return RegistryResult(host, Outcome.CREATED if stored is None else Outcome.REFRESHED, expires_at=token.expires_at)


def _refresh_namespace(
    cluster: CredentialsCluster, got: _Tokens, config: CredentialsConfig, namespace: str,
    clock: Callable[[], float],
) -> NamespaceResult:
    name = config.secret_name
    hosts = [host for registry in config.registries for host in registry.hosts]

    def write_secret() -> NamespaceResult:
        secret = cluster.get_secret(namespace, name)
        decision = decide(secret, hosts, clock())
        if decision.action is Action.REFUSE:
            return NamespaceResult(namespace, Outcome.FAILED, decision.reason)
        if decision.action is Action.KEEP:
            return NamespaceResult(namespace, Outcome.FRESH, decision.reason, expires_at=decision.expires_at)
        tokens = [got.get(registry) for registry in config.registries]
        body = pull_secret(name, namespace, tokens, secret)
        try:
            if secret is None:
                cluster.create_secret(namespace, body)
            else:
                cluster.replace_secret(namespace, name, body)
        except ClusterConflictError:
            log.info("namespace %s: secret %s changed while being written; reading it again", namespace, name)
            raise
        outcome = Outcome.CREATED if decision.action is Action.CREATE else Outcome.REFRESHED
        return NamespaceResult(namespace, outcome, decision.reason,
                               expires_at=min(token.expires_at for token in tokens))

    try:
        result = retry_on_conflict(write_secret, conflict=ClusterConflictError, attempts=_ATTEMPTS)
    except ClusterConflictError:
        return NamespaceResult(namespace, Outcome.FAILED, f"secret {name} kept changing during {_ATTEMPTS} attempts")
    if result.outcome is Outcome.FAILED:
        return result
    try:
        _add_to_service_accounts(cluster, config, namespace, result)
    except ClusterError as e:
        wrote = "" if result.outcome is Outcome.FRESH else f"secret {result.outcome.value}, but "
        return NamespaceResult(namespace, Outcome.FAILED, f"{wrote}service account not updated: {e}",
                               expires_at=result.expires_at)
    return result


def _add_to_service_accounts(
    cluster: CredentialsCluster, config: CredentialsConfig, namespace: str, result: NamespaceResult
) -> None:
    """Adds the secret to each service account's imagePullSecrets, keeping every existing entry.

    The list has no patch merge key (it is atomic), so a strategic merge patch would replace it: the
    whole list is sent instead, guarded by the resourceVersion read, and re-read on a conflict.
    """
    for account in config.service_accounts:

        def add_secret(account: str = account) -> None:
            found = cluster.get_service_account(namespace, account)
            if found is None:
                result.service_accounts_missing.append(account)
                return
            wanted = image_pull_secrets_with(found, config.secret_name)
            if wanted is None:
                return
            patch = {"metadata": {"resourceVersion": (found.get("metadata") or {}).get("resourceVersion")},
                     "imagePullSecrets": wanted}
            cluster.patch_service_account(namespace, account, patch, strategic=False)
            result.service_accounts_patched.append(account)

        retry_on_conflict(
            add_secret, conflict=ClusterConflictError, attempts=_ATTEMPTS,
            exhausted=functools.partial(ClusterConflictError, f"service account {namespace}/{account} kept changing "
                                        f"during {_ATTEMPTS} attempts"),
        )
