"""Fakes for the credential refresher: registry tokens, a credential store in memory, a configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.refresh import CredentialsConfig, RegistryConfig, RegistryToken, StoredToken
from prewarm.services.credentials import RefreshReport
from prewarm.services.ports import RegistryTokenError
from tests.support.clock import HOUR

REGION = "us-east-1"
PASSWORD = "eyJwYXlsb2FkIjoiU0VDUkVULVRPS0VOLWRvLW5vdC1sb2cifQ"


def config(**fields: Any) -> CredentialsConfig:
    doc: dict[str, Any] = {"registries": [{"account": "111122223333", "region": "us-east-1"}],
                           "namespaces": {"include": ["*"]}}
    doc.update(fields)
    return CredentialsConfig.model_validate(doc)


def outcomes(report: RefreshReport) -> dict[str, str]:
    """namespace → what the run did there (`created`, `skipped-fresh`, ...)."""
    return {n.namespace: n.outcome.value for n in report.namespaces}


@dataclass
class FakeTokens:
    """A `TokenSource` that issues a 12-hour token at the clock's time, or fails for chosen hosts."""

    clock: Callable[[], float]
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
class FakeCredentialStore:
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
