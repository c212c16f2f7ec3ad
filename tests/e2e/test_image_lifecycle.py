"""Issue 38, item 2: images leave when no one wants them, and only Prewarm's.

A real local stack (moto behind the AWS limits layer running template.yaml's functions on their event
sources, the embedded Kubernetes API, the registry, and a private containerd and agent per node, on the
containerd `PREWARM_CONTAINERD` selects: 2.1 by default, which pins).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from prewarm.domain.jobs import PIN_ANNOTATION
from prewarm.domain.messages import NodePhase
from prewarm.domain.runtimes import ContainerRuntime
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.localnodes import LocalNode
from tests.support.local_mode import running_local_mode
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "lifecycle", nodes=2) as mode:
        yield mode


def pinned_job(name: str, image: str, nodes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": "default", "annotations": {PIN_ANNOTATION: "true"}},
        "spec": {"image": image, "parallelism": len(nodes), "selector": {"names": nodes},
                 "pullPolicy": {"backoffLimit": 1, "timeoutSeconds": 60}, "completionPolicy": {"type": "Never"}},
    }


def pinned(node: LocalNode, image: str) -> bool | None:
    """What the node's CRI says of the image: pinned or not; None when it is not there."""
    with node.containerd.cri_client() as cri:
        status = cri.image_status(image)
    return None if status is None else status.pinned


def pins_work(node: LocalNode) -> bool:
    with node.containerd.cri_client() as cri:
        return ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}").pins


def test_deleting_a_pinned_job_unpins_its_image_on_every_node_no_other_job_pins_it(local: LocalMode) -> None:
    store = local.job_store()
    names = sorted(local.nodes)
    first, second = (local.nodes[n] for n in names)
    if not pins_work(first):
        pytest.skip("this containerd never reports an image pinned (1.7.10 and later do)")
    pushed = local.push("e2e/pinned", "v1", size_mb=2)

    # Given a pinned job of an image on both nodes, and another pinned job of it on the second node
    apply_manifest(store, pinned_job("everywhere", pushed.reference, names), now=time.time())
    apply_manifest(store, pinned_job("second-only", pushed.reference, names[1:]), now=time.time())

    def succeeded(job: str, nodes: list[str]) -> bool:
        tasks = [store.get_task(f"default/{job}", n) for n in nodes]
        return all(t is not None and t.phase is NodePhase.SUCCEEDED for t in tasks)

    wait_until(lambda: succeeded("everywhere", names) and succeeded("second-only", names[1:]), 60, "both jobs pulled")
    assert pinned(first, pushed.reference) is True and pinned(second, pushed.reference) is True

    # When the first job is deleted (dispatch_job sees its stream record)
    request_deletion(store, "default", "everywhere", now=time.time())

    # Then the CRI of the first node reports the image unpinned, while the second keeps its pin
    wait_until(lambda: pinned(first, pushed.reference) is False, 30, "the image unpinned on the first node")
    assert pinned(second, pushed.reference) is True

    # When the second job is deleted too, the second node's pin goes
    request_deletion(store, "default", "second-only", now=time.time())
    wait_until(lambda: pinned(second, pushed.reference) is False, 30, "the image unpinned on the second node")
    # ... and the image stays on both nodes: unpinned, kubelet's garbage collection may take it
    assert pinned(first, pushed.reference) is False
