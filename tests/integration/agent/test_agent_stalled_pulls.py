"""A pull containerd cancels itself, when no byte arrives for its `image_pull_progress_timeout` (1.7 and
later; on 2.1 and later through the transfer service also during a long unpack, containerd#13909): the agent tells
it from a cancel of its own, says why in containerd's words, and retries; the retry finishes the pull."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from prewarm_agent.cri.client import STALLED_HINT
from prewarm_devtools.node.containerd import PrivateContainerd, PullSettings, selected_version
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.node.throttle import ThrottlingProxy
from prewarm_devtools.pytest_plugins.node import OciImageFactory, node_tools_missing
from tests.support.agent_harness import AgentHarness

pytestmark = [pytest.mark.node, pytest.mark.integration]

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def node_runtime(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry) -> Iterator[PrivateContainerd]:
    """This module's containerd gives up on a pull after 2 s without a byte (the default is 5 minutes)."""
    reason = node_tools_missing()
    if reason is not None:
        pytest.skip(reason)
    if selected_version() == "1.6":
        pytest.skip("containerd 1.6 has no image_pull_progress_timeout")
    with PrivateContainerd(tmp_path_factory.mktemp("stall"), pull=PullSettings(progress_timeout="2s")) as instance:
        instance.add_registry_mirror(registry.host, registry.url)
        yield instance
    instance.remove_data()


def test_a_pull_containerd_cancels_for_no_progress_is_retried_and_finishes(
    agents: Callable[..., AgentHarness], node_runtime: PrivateContainerd, registry: LocalRegistry,
    throttled_registry: ThrottlingProxy, oci_image_factory: OciImageFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    # Given an 8 MiB layer whose download stops after 2 MiB
    node_runtime.add_registry_mirror(throttled_registry.host, throttled_registry.url)
    image = oci_image_factory.push(registry, "stall/layer", size_mb=8).with_host(throttled_registry.host)
    agent = agents()
    task = agent.task(image.reference, backoff_limit=2)
    throttled_registry.set_rate(4 * MIB)
    with caplog.at_level(logging.INFO):
        agent.send(task)
        assert throttled_registry.wait_for(lambda proxy: proxy.bytes_to_client > 2 * MIB, timeout=20)
        throttled_registry.set_rate(0)

        # When containerd gives up on it, and the link is back before the retry
        agent.wait_for(task, lambda reports: any(r.attempt == 2 for r in reports), timeout=30)
        throttled_registry.set_rate(None)
        final = agent.final(task)

    # Then the first attempt failed with containerd's words and why, not as a cancel, and the second pulled
    assert final.phase == "Succeeded" and final.attempt == 2, final
    failed = [r.getMessage() for r in caplog.records if "attempt 1 of 3 failed" in r.getMessage()]
    assert len(failed) == 1, caplog.text
    assert f'failed to pull and unpack image "{image.reference}": context canceled ({STALLED_HINT})' in failed[0]
