"""Issue #36: an agent started on a node whose containerd already holds images says so in its first
hello, by digest (CRI `ListImages`, unfiltered: containerd 1.6 ignores the filter), and the control plane's
rule finds which of the node's required images were present at boot from that hello alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prewarm.domain.boot import boot_record
from prewarm.domain.messages import ALREADY_PRESENT, RequiredImage
from prewarm_agent.cri.client import CriImageClient
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.pytest_plugins.node import OciImageFactory
from tests.support.agent_harness import AgentHarness
from tests.support.waiting import eventually

pytestmark = [pytest.mark.node, pytest.mark.integration]

Agents = Callable[..., AgentHarness]


def test_a_hello_names_the_images_present_before_the_agent_started_by_digest(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given a node whose containerd holds an image (pulled by tag) before its agent starts, and another
    # image the control plane wants there that it lacks
    present = oci_image_factory.push(registry, "boot/present", "v1")
    absent = oci_image_factory.push(registry, "boot/absent", "v1")
    cri.pull_image(present.reference).result(timeout=30)

    # When the agent starts and says hello
    agent = agents()
    assert eventually(lambda: bool(agent.hellos()), 10)
    (hello,) = agent.hellos()

    # Then its hello lists the present image's repo digest, not the other's ...
    assert present.digest_reference in hello.images and absent.digest_reference not in hello.images
    # ... which is all the control plane needs to tell what was there at boot
    required = [RequiredImage(image=present.digest_reference, job="default/a"),
                RequiredImage(image=absent.digest_reference, job="default/b")]
    boot = boot_record(required, hello.images, at=0.0)
    assert boot.present == (present.digest_reference,) and not boot.all_present

    # And its task for the present image pulls nothing
    task = agent.task(present.digest_reference, image_pull_policy="IfNotPresent")
    agent.send(task)
    final = agent.final(task)
    assert final.message == ALREADY_PRESENT and final.bytes_done is None
    assert agent.metric("prewarm_agent_pull_calls_total") == 0
