"""Pytest fixtures for the embedded Kubernetes API server.

Register with `pytest_plugins = ["prewarm_devtools.pytest_plugins.kubeapi"]`. Every server binds
127.0.0.1 on a free port and is stopped (watches ended, connections closed) by its fixture.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING

import pytest

from prewarm_devtools.kubeapi.auth import Identity
from prewarm_devtools.kubeapi.server import KubeApiServer

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api


@pytest.fixture
def kube_api() -> Iterator[KubeApiServer]:
    """A fresh API server for one test: the four default namespaces, nothing else."""
    with KubeApiServer() as api:
        yield api


@pytest.fixture(scope="module")
def kube_api_module() -> Iterator[KubeApiServer]:
    """An API server shared by the tests of a module (seed it once, in a module fixture)."""
    with KubeApiServer() as api:
        yield api


@pytest.fixture
def kube_client(kube_api: KubeApiServer) -> Iterator[ApiClient]:
    """A `kubernetes.client.ApiClient` for `kube_api` as its admin (system:masters), closed after the test."""
    with kube_api.api_client() as client:
        yield client


@pytest.fixture
def core_v1(kube_client: ApiClient) -> CoreV1Api:
    """A typed `CoreV1Api` on `kube_api`."""
    from kubernetes.client import CoreV1Api

    return CoreV1Api(kube_client)


@pytest.fixture
def kube_client_as(kube_api: KubeApiServer) -> Iterator[Callable[[Identity], ApiClient]]:
    """A factory of `ApiClient`s for `kube_api` acting as a given identity (RBAC applies), each with
    a token of its own; all are closed after the test.

    `client = kube_client_as(Identity("alice", ("dev",)))`
    """
    with ExitStack() as clients:

        def client_for(identity: Identity) -> ApiClient:
            token = f"test-{secrets.token_urlsafe(16)}"
            kube_api.add_identity(token, identity)
            client: ApiClient = clients.enter_context(kube_api.api_client(token))
            return client

        yield client_for
