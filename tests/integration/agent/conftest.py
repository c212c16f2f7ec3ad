"""Fixtures for agent integration tests: moto's SQS and Secrets Manager, a private containerd, local
registries, and `agents`, which makes `AgentHarness`es (one agent in this process each)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from prewarm_agent.cri.client import CriImageClient
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.sam.aws import MotoServer, aws_environment
from tests.support.agent_harness import AgentHarness


@pytest.fixture(scope="module")
def aws() -> Iterator[MotoServer]:
    """moto on 127.0.0.1, with this process's boto3 pointed at it."""
    with MotoServer() as server, aws_environment(server.url):
        yield server


@pytest.fixture(scope="module")
def node_runtime(
    containerd: PrivateContainerd, registry: LocalRegistry, auth_registry: LocalRegistry
) -> PrivateContainerd:
    """The module's containerd, serving both local registries over plain http."""
    containerd.add_registry_mirror(registry.host, registry.url)
    containerd.add_registry_mirror(auth_registry.host, auth_registry.url)
    return containerd


@pytest.fixture(scope="module")
def cri(node_runtime: PrivateContainerd) -> Iterator[CriImageClient]:
    """A CRI client on the module's containerd, to look at what the agent did."""
    with node_runtime.cri_client() as client:
        yield client


@pytest.fixture
def agents(aws: MotoServer, node_runtime: PrivateContainerd) -> Iterator[Callable[..., AgentHarness]]:
    """Makes started agents (`agents(MAX_CONCURRENT_PULLS="1")`, settings as environment variables;
    `collaborators` go to `Agent`); all are stopped after the test."""
    made: list[AgentHarness] = []

    def make(node: str = "", start: bool = True, collaborators: Mapping[str, Any] | None = None,
             **env: str) -> AgentHarness:
        harness = AgentHarness(aws, node_runtime, env, node, collaborators)
        made.append(harness)
        return harness.start() if start else harness

    yield make
    for harness in made:
        harness.stop()
