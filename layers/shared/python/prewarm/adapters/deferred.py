"""Adapters built on first use, not when a use case is bound to them: a function pays for an adapter's
imports and clients only when its work needs it.

`DeferredSecretMirror` is the pull secret mirror as the table stream and the sweep are given it: every
plan is handed one, but only a job that names `pullSecrets` builds the Secrets Manager mirror (and
imports its module); the sweep's cleanup builds it on its first run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class SecretMirror(Protocol):
    """`PullSecretMirror` and `PullSecretCleanup` in one (`prewarm.adapters.secrets.SecretsManagerMirror`)."""

    def mirror(self, namespace: str, names: list[str], cluster: str = ...) -> list[str]: ...
    def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]: ...


class DeferredSecretMirror:
    """A `SecretMirror` whose mirror `build()` makes on first use, once."""

    def __init__(self, build: Callable[[], SecretMirror]) -> None:
        self._build = build
        self._built: SecretMirror | None = None
        self._lock = threading.Lock()

    def mirror(self, namespace: str, names: list[str], cluster: str = "") -> list[str]:
        return self._mirror().mirror(namespace, names, cluster)

    def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]:
        return self._mirror().cleanup(referenced)

    def _mirror(self) -> SecretMirror:
        with self._lock:
            if self._built is None:
                self._built = self._build()
            return self._built
