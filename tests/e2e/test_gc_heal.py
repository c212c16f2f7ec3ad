"""Issue #12, garbage-collection heal: an image a `Never` job put on a node disappears (as kubelet's image
garbage collection removes it: a CRI RemoveImage); the agent's next image check reports it, and the
control plane pulls it again, or, when the agent's disk guard says there is no room, marks the node
with why it did not. The job's counters do not move.

A real local stack: moto behind the AWS limits layer, the functions on their event sources, the
embedded Kubernetes API, the registry, and a private containerd and agent for the node. The agent
checks its images every 0.5 s here (IMAGE_CHECK_INTERVAL_SECONDS; 300 s by default).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

CHECK_INTERVAL = 0.5


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    state = tmp_path_factory.mktemp("heal") / "local.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREWARM_LOCAL_STATE", str(state))
        with LocalMode(nodes=1, agent_settings={"IMAGE_CHECK_INTERVAL_SECONDS": str(CHECK_INTERVAL)}) as mode:
            yield mode



def test_a_removed_image_is_pulled_again_and_with_no_room_the_node_says_why(local: LocalMode) -> None:
    assert local.aws is not None and local.stack is not None
    store = local.job_store()
    (name, node), = local.nodes.items()
    pushed = local.push("e2e/heal", "v1", size_mb=2)

    # Given a Never job whose image is on the node
    apply_manifest(store, {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "heal", "namespace": "default"},
        "spec": {"image": pushed.reference, "parallelism": 1, "selector": {"names": [name]},
                 "pullPolicy": {"backoffLimit": 1, "timeoutSeconds": 60}, "completionPolicy": {"type": "Never"}},
    }, now=time.time())

    def task() -> NodeTaskRecord:
        found = store.get_task("default/heal", name)
        assert found is not None
        return found

    wait_until(lambda: store.get_task("default/heal", name) is not None and task().phase is NodePhase.SUCCEEDED,
             60, "the first pull")
    first = task()
    assert node.image_present(pushed.reference)

    # When image garbage collection removes it
    with node.containerd.cri_client() as cri:
        cri.remove_image(pushed.reference)
    assert not node.image_present(pushed.reference)

    # Then the agent reports it, the control plane sends the task again and the node has it once more
    wait_until(lambda: node.image_present(pushed.reference), 30, "the image pulled again")
    wait_until(lambda: task().attempt > first.attempt, 10, "the second pull's Succeeded recorded")
    healed = task()
    assert healed.phase is NodePhase.SUCCEEDED and healed.round == first.round
    assert node.agent.metrics.sample("prewarm_agent_images_gone_total") == 1
    record = store.get_job("default/heal")
    assert record is not None and (record.counters.desired, record.counters.succeeded) == (1, 1)

    # When it is removed again while the disk guard says the node is short of space
    node.agent.runner.disk.threshold_percent = 0.001
    try:
        with node.containerd.cri_client() as cri:
            cri.remove_image(pushed.reference)

        # Then the node is marked with why, and nothing pulls it
        wait_until(lambda: "not pulled again: disk guard" in task().message, 30, "the node marked")
        marked = task()
        assert marked.message.startswith("image removed from the node at "), marked.message
        assert "imagefs" in marked.message and "threshold 0.001%" in marked.message, marked.message
        time.sleep(4 * CHECK_INTERVAL)
        assert not node.image_present(pushed.reference)
        assert node.agent.metrics.sample("prewarm_agent_images_gone_total") == 2
        assert task().phase is NodePhase.SUCCEEDED  # counted for the round; the next round pulls again
    finally:
        node.agent.runner.disk.threshold_percent = 85.0
