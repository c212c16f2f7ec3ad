"""Fakes for the credential refresher: an in-memory cluster with resourceVersions, tokens, a clock."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from moto import mock_aws

from prewarm.adapters.errors import ClusterConflictError, ClusterError
from prewarm.domain.refresh import CredentialsConfig, RegistryConfig, RegistryToken, RegistryTokenError, StoredToken

REGION = "us-east-1"
# 2026-01-01T00:00:00Z; ECR tokens live 12 hours.
T0 = 1_767_225_600.0
HOUR = 3600.0
PASSWORD = "eyJwYXlsb2FkIjoiU0VDUkVULVRPS0VOLWRvLW5vdC1sb2cifQ"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with mock_aws():
        yield


def config(**fields: Any) -> CredentialsConfig:
    doc: dict[str, Any] = {"registries": [{"account": "111122223333", "region": "us-east-1"}],
                           "namespaces": {"include": ["*"]}}
    doc.update(fields)
    return CredentialsConfig.model_validate(doc)


def namespace(name: str, phase: str = "Active", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}},
            "status": {"phase": phase}}


@dataclass
class FakeTokens:
    """A `TokenSource` that issues a 12-hour token at the clock's time, or fails for chosen hosts."""

    clock: Clock
    password: str = PASSWORD
    failing: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def token(self, registry: RegistryConfig) -> RegistryToken:
        self.calls.append(registry.host)
        if registry.host in self.failing:
            raise RegistryTokenError(registry.host, self.failing[registry.host])
        now = self.clock()
        return RegistryToken.for_hosts("AWS", self.password, registry.hosts, issued_at=now, expires_at=now + 12 * HOUR)


@dataclass
class FakeStore:
    """A `CredentialStore` in memory: host → (token metadata, token)."""

    saved: dict[str, RegistryToken] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)

    def read(self, host: str) -> StoredToken | None:
        token = self.saved.get(host)
        if token is None:
            return None
        return StoredToken(hosts=frozenset(token.hosts), issued_at=token.issued_at, expires_at=token.expires_at)

    def write(self, host: str, token: RegistryToken) -> str:
        self.saved[host] = token
        self.writes.append(host)
        return f"arn:aws:secretsmanager:{REGION}:123456789012:secret:prewarm/registry/{host}-AbCdEf"


@dataclass
class FakeCluster:
    """The refresher's cluster port over dicts, with resourceVersion checks as the API server does.

    `before_write(namespace, name)` runs between a read and the next write, to stage a race;
    `broken[namespace]` is raised by every call in that namespace.
    """

    namespaces: list[dict[str, Any]] = field(default_factory=list)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    service_accounts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    broken: dict[str, ClusterError] = field(default_factory=dict)
    before_write: Callable[[str, str], None] | None = None
    rv: int = 100
    selectors: list[str | None] = field(default_factory=list)
    writes: list[tuple[str, str, str]] = field(default_factory=list)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _check(self, ns: str) -> None:
        if ns in self.broken:
            raise self.broken[ns]

    def _hook(self, ns: str, name: str) -> None:
        if self.before_write is not None:
            self.before_write(ns, name)

    def add_namespace(self, name: str, phase: str = "Active", *, accounts: tuple[str, ...] = ("default",),
                      **labels: str) -> None:
        self.namespaces.append(namespace(name, phase, **labels))
        for account in accounts:
            self.service_accounts[(name, account)] = {
                "metadata": {"name": account, "namespace": name, "resourceVersion": self._next_rv()}}

    def list_namespaces(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.selectors.append(label_selector)
        return copy.deepcopy(self.namespaces)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check(namespace)
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found)

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check(namespace)
        name = body["metadata"]["name"]
        self._hook(namespace, name)
        if (namespace, name) in self.secrets:
            raise ClusterConflictError(f'secrets "{name}" already exists', status=409, reason="AlreadyExists")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[(namespace, name)] = stored
        self.writes.append(("create", namespace, name))
        return copy.deepcopy(stored)

    def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check(namespace)
        self._hook(namespace, name)
        current = self.secrets[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ClusterConflictError("the object has been modified", status=409, reason="Conflict")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[(namespace, name)] = stored
        self.writes.append(("replace", namespace, name))
        return copy.deepcopy(stored)

    def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check(namespace)
        return copy.deepcopy(self.service_accounts.get((namespace, name)))

    def patch_service_account(
        self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = True
    ) -> dict[str, Any]:
        self._check(namespace)
        self._hook(namespace, name)
        current = self.service_accounts[(namespace, name)]
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise ClusterConflictError("the object has been modified", status=409, reason="Conflict")
        # imagePullSecrets has no merge key: both patch types replace the list, as on a real server.
        updated = copy.deepcopy(current)
        for key, value in patch.items():
            if key != "metadata":
                updated[key] = copy.deepcopy(value)
        updated["metadata"]["resourceVersion"] = self._next_rv()
        self.service_accounts[(namespace, name)] = updated
        self.writes.append(("patch", namespace, name))
        return copy.deepcopy(updated)
