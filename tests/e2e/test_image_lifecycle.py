"""Issue 38, item 2: images leave when no one wants them, and only Prewarm's.

A real local stack (moto behind the AWS limits layer running template.yaml's functions on their event
sources, the embedded Kubernetes API, the registry that plays ECR, and a private containerd and agent per
node, on the containerd `PREWARM_CONTAINERD` selects: 2.1 by default, which pins). The stack's
ImageRemovalGraceSeconds is `GRACE` here (a day by default), and the agents look for removals due every
half second (REMOVAL_CHECK_INTERVAL_SECONDS; a minute by default).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prewarm.domain.jobs import PIN_ANNOTATION
from prewarm.domain.messages import NodePhase
from prewarm.domain.runtimes import ContainerRuntime
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.localnodes import LocalNode
from prewarm_devtools.node.images import RegistryPusher
from tests.support.cri_pods import CriPods, install_sandbox_image, missing_tools, runnable_image
from tests.support.local_mode import running_local_mode
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

GRACE = 8
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "lifecycle", nodes=2,
                            parameters={"ImageRemovalGraceSeconds": str(GRACE)},
                            agent_settings={"REMOVAL_CHECK_INTERVAL_SECONDS": "0.5"}) as mode:
        yield mode


def job(name: str, image: str, nodes: list[str], *, pin: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"image": image, "parallelism": len(nodes), "selector": {"names": nodes},
                 "pullPolicy": {"backoffLimit": 1, "timeoutSeconds": 60}, "completionPolicy": {"type": "Never"}},
    }
    if pin:
        doc["metadata"]["annotations"] = {PIN_ANNOTATION: "true"}
    return doc


def succeeded(local: LocalMode, key: str, nodes: list[str]) -> bool:
    store = local.job_store()
    tasks = [store.get_task(key, n) for n in nodes]
    return all(t is not None and t.phase is NodePhase.SUCCEEDED for t in tasks)


def pinned(node: LocalNode, image: str) -> bool | None:
    """What the node's CRI says of the image: pinned or not; None when it is not there."""
    with node.containerd.cri_client() as cri:
        status = cri.image_status(image)
    return None if status is None else status.pinned


def freed(local: LocalMode, node: str) -> int:
    """The bytes the node's removals freed, as the control plane recorded its footprint."""
    registered = local.job_store().get_node(node)
    return 0 if registered is None or registered.footprint is None else registered.footprint.freed_bytes


def deleted(local: LocalMode, key: str) -> float:
    """Waits until the job's items are gone (its releases were sent just before); returns when."""
    wait_until(lambda: local.job_store().get_job(key) is None, 30, f"{key} deleted")
    return time.time()


def registry_auth(local: LocalMode) -> tuple[str, str]:
    assert local.aws is not None
    token = local.aws.client("ecr").get_authorization_token()["authorizationData"][0]["authorizationToken"]
    user, _, password = base64.b64decode(token).decode().partition(":")
    return user, password


def test_deleting_a_pinned_job_unpins_its_image_on_every_node_no_other_job_pins_it(local: LocalMode) -> None:
    store = local.job_store()
    names = sorted(local.nodes)
    first, second = (local.nodes[n] for n in names)
    with first.containerd.cri_client() as cri:
        if not ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}").pins:
            pytest.skip("this containerd never reports an image pinned (1.7.10 and later do)")
    pushed = local.push("e2e/pinned", "v1", size_mb=2)

    # Given a pinned job of an image on both nodes, another pinned job of it on the second node, and an
    # unpinned job of it on both (which keeps the image, not its pin)
    apply_manifest(store, job("everywhere", pushed.reference, names, pin=True), now=time.time())
    apply_manifest(store, job("second-only", pushed.reference, names[1:], pin=True), now=time.time())
    apply_manifest(store, job("unpinned", pushed.reference, names), now=time.time())
    wait_until(lambda: all(succeeded(local, f"default/{j}", n) for j, n in (
        ("everywhere", names), ("second-only", names[1:]), ("unpinned", names))), 60, "the jobs pulled")
    assert pinned(first, pushed.reference) is True and pinned(second, pushed.reference) is True

    # When the first job is deleted (dispatch_job sees its stream record)
    request_deletion(store, "default", "everywhere", now=time.time())

    # Then the CRI of the first node reports the image unpinned, while the second keeps its pin
    wait_until(lambda: pinned(first, pushed.reference) is False, 30, "the image unpinned on the first node")
    assert pinned(second, pushed.reference) is True

    # When the second job is deleted too, the second node's pin goes
    request_deletion(store, "default", "second-only", now=time.time())
    wait_until(lambda: pinned(second, pushed.reference) is False, 30, "the image unpinned on the second node")
    # ... and past the grace period the image stays on both nodes: the unpinned job still wants it
    time.sleep(GRACE + 1)
    assert pinned(first, pushed.reference) is False and pinned(second, pushed.reference) is False


def test_a_superseded_digest_is_removed_after_the_grace_period_with_its_freed_bytes_reported(
    local: LocalMode,
) -> None:
    store = local.job_store()
    name = sorted(local.nodes)[0]
    node = local.nodes[name]
    # Given a rule that keeps no earlier digest of a tag warm, and a push of the tag pulled on the node
    apply_manifest(store, {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule",
                           "metadata": {"name": "rolling"},
                           "spec": {"repositories": ["e2e/rolling"], "keepDigests": 0,
                                    "template": {"spec": {"selector": {"names": [name]}}}}}, now=time.time())
    before = freed(local, name)
    old = local.push("e2e/rolling", "v1", size_mb=2)
    old_job = next(r.key for r in store.list_jobs() if r.image == old.reference)
    wait_until(lambda: succeeded(local, old_job, [name]), 60, "the first digest pulled")

    # When the tag is pushed again, with another digest
    pushed_at = time.time()
    new = local.push("e2e/rolling", "v1", size_mb=2)
    new_job = next(r.key for r in store.list_jobs() if r.image == new.reference)

    # Then the old digest's job is retired at once (its release sent), its image stays for the grace period
    deleted(local, old_job)
    assert node.image_present(old.reference)
    wait_until(lambda: succeeded(local, new_job, [name]), 60, "the new digest pulled")
    # ... and then it is removed, not before the grace period from the push that superseded it
    wait_until(lambda: not node.image_present(old.reference), GRACE + 30, "the old digest removed")
    assert time.time() - pushed_at >= GRACE
    assert node.image_present(new.reference)
    # ... and its bytes freed reach the control plane (the node's footprint; `prewarm describe node` shows it)
    wait_until(lambda: freed(local, name) - before >= 2 * MIB, 30, "the freed bytes reported")


@pytest.mark.skipif(bool(missing_tools()), reason=missing_tools() or "ok")
def test_an_image_a_running_container_uses_is_never_removed(local: LocalMode, tmp_path: Path) -> None:
    store = local.job_store()
    name = sorted(local.nodes)[1]
    node = local.nodes[name]
    auth = registry_auth(local)
    assert local.registry is not None
    pusher = RegistryPusher(local.registry.url, auth=auth)
    install_sandbox_image(node.containerd, pusher, ecr_host(), auth)

    # Given an image Prewarm pulled for a job, which a running container on the node uses
    pusher.push_image("e2e/inuse", "v1", runnable_image())
    reference = f"{ecr_host()}/e2e/inuse:v1"
    apply_manifest(store, job("in-use", reference, [name]), now=time.time())
    wait_until(lambda: succeeded(local, "default/in-use", [name]), 60, "the image pulled")
    pods = CriPods(node.containerd.socket_path, tmp_path)
    try:
        sandbox, _ = pods.run(reference)

        # When its job is deleted and the grace period passes, several removal passes over
        request_deletion(store, "default", "in-use", now=time.time())
        deleted(local, "default/in-use")
        time.sleep(GRACE + 3)

        # Then the image is still there: CRI ListContainers shows a container using it
        assert node.image_present(reference)

        # When the pod goes, the image is removed at the next pass
        before = freed(local, name)
        pods.remove(sandbox)
        wait_until(lambda: not node.image_present(reference), 30, "the image removed once no container uses it")
        wait_until(lambda: freed(local, name) > before, 30, "the freed bytes reported")
    finally:
        pods.close()


def test_a_jobs_new_image_releases_the_earlier_one_unpinned_then_removed_after_the_grace(local: LocalMode) -> None:
    store = local.job_store()
    name = sorted(local.nodes)[0]
    node = local.nodes[name]
    with node.containerd.cri_client() as cri:
        pins = ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}").pins
    # Given a pinned job whose image v1 was pulled (and pinned) on the node
    v1, v2 = local.push("e2e/changing", "v1", size_mb=2), local.push("e2e/changing", "v2", size_mb=2)
    apply_manifest(store, job("changing", v1.reference, [name], pin=True), now=time.time())
    wait_until(lambda: succeeded(local, "default/changing", [name]), 60, "v1 pulled")
    assert not pins or pinned(node, v1.reference) is True

    # When the job is applied again with v2
    applied_at = time.time()
    apply_manifest(store, job("changing", v2.reference, [name], pin=True), now=applied_at)

    # Then v2 is pulled (and pinned), v1 unpinned at the new round's plan, and removed after the grace period
    def v2_pulled() -> bool:
        task = store.get_task("default/changing", name)
        return task is not None and task.round == 1 and task.phase is NodePhase.SUCCEEDED

    wait_until(v2_pulled, 60, "v2 pulled")
    if pins:
        assert pinned(node, v2.reference) is True
        wait_until(lambda: pinned(node, v1.reference) is not True, 30, "v1 unpinned")
    wait_until(lambda: not node.image_present(v1.reference), GRACE + 30, "v1 removed")
    assert time.time() - applied_at >= GRACE
    assert node.image_present(v2.reference)
