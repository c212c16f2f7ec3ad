"""The composition root: builds each adapter once per process from the settings, on first use.

Handlers ask for what they need; nothing is built at import time, so a function pays only for the
clients it uses (the Kubernetes client alone costs ~120 ms of imports). `reset()` forgets them all,
for tests that change the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from prewarm.settings import settings

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.ecr import EcrImages
    from prewarm.adapters.ecr_auth import EcrTokenSource
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.secrets import SecretsManagerCredentialStore, SecretsManagerMirror
    from prewarm.adapters.sqs import NodeQueues
    from prewarm.domain.refresh import CredentialsConfig
    from prewarm.services.ports import PullSecretMirror


@lru_cache(maxsize=1)
def store() -> DynamoJobStore:
    from prewarm.adapters.dynamodb import DynamoJobStore

    return DynamoJobStore(settings().table_name)


@lru_cache(maxsize=1)
def queues() -> NodeQueues:
    from prewarm.adapters.sqs import NodeQueues

    s = settings()
    return NodeQueues(
        s.node_queue_prefix, s.status_queue_url, dlq_arn=s.node_dlq_arn,
        visibility_seconds=s.node_queue_visibility_seconds, sender_arns=s.node_queue_sender_arns,
    )


@lru_cache(maxsize=1)
def cluster() -> KubeCluster:
    from prewarm.adapters.kube import KubeCluster

    return KubeCluster.from_settings(settings())


def cluster_or_none() -> KubeCluster | None:
    """The cluster, or None when no Kubernetes access is configured (a hello then speaks for its node)."""
    from prewarm.services.ports import ClusterConfigError

    try:
        return cluster()
    except ClusterConfigError:
        return None


class _LazySecretMirror:
    """Builds the Secrets Manager mirror on the first job that names pullSecrets, not before."""

    def mirror(self, namespace: str, names: list[str]) -> list[str]:
        return _secret_mirror().mirror(namespace, names)

    def cleanup(self, referenced: set[tuple[str, str]]) -> list[str]:
        return _secret_mirror().cleanup(referenced)


def secret_mirror() -> PullSecretMirror:
    """Where jobs' pullSecrets are mirrored for the agents (Secrets Manager under the stack prefix)."""
    return _LazySecretMirror()


@lru_cache(maxsize=1)
def _secret_mirror() -> SecretsManagerMirror:
    from prewarm.adapters.secrets import SecretsManagerMirror

    # Cleanup needs no cluster; mirroring reads secrets through it and says so when it is missing.
    return SecretsManagerMirror(settings().secret_prefix, cluster_or_none())


@lru_cache(maxsize=1)
def registry_tokens() -> EcrTokenSource:
    """ECR and ECR Public tokens; kept for the process so assumed-role sessions are reused."""
    from prewarm.adapters.ecr_auth import EcrTokenSource

    return EcrTokenSource()


@lru_cache(maxsize=1)
def credential_store() -> SecretsManagerCredentialStore:
    """The agents' registry credentials in Secrets Manager, under the stack's secret prefix."""
    from prewarm.adapters.secrets import SecretsManagerCredentialStore

    return SecretsManagerCredentialStore(settings().secret_prefix)


def credentials_config(env: Mapping[str, str] = os.environ) -> CredentialsConfig | None:
    """The refresher's configuration, read on every call so a changed parameter applies at once.

    `CREDENTIALS_CONFIG_PARAMETER` (an SSM parameter) wins over `CREDENTIALS_CONFIG` (JSON); None when
    both are empty: there is nothing to refresh.
    """
    from prewarm.domain.refresh import CredentialsConfig

    if parameter := env.get("CREDENTIALS_CONFIG_PARAMETER", "").strip():
        from prewarm.adapters.secrets import read_config_parameter

        return CredentialsConfig.parse(read_config_parameter(parameter), f"CREDENTIALS_CONFIG_PARAMETER {parameter}")
    if text := env.get("CREDENTIALS_CONFIG", "").strip():
        return CredentialsConfig.parse(text, "CREDENTIALS_CONFIG")
    return None


@lru_cache(maxsize=1)
def images() -> EcrImages:
    from prewarm.adapters.ecr import EcrImages

    return EcrImages()


def reset() -> None:
    for built in (store, queues, cluster, images, _secret_mirror, registry_tokens, credential_store, settings):
        built.cache_clear()
