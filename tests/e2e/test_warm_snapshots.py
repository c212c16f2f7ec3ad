"""Issue #36, warm snapshots: a push re-bakes the data volume snapshot a Karpenter EC2NodeClass launches
from, and a node booted from it has every image before any pull.

A real local stack: moto's EC2 (instances, volumes, snapshots) with local mode playing the builders (a
private containerd each, standing for the data volume, and the agent in bake mode as the BuilderRole) and
the snapshots (a kept copy of that containerd's root, then `EBS Snapshot Notification` on the local event
bus); Karpenter's EC2NodeClass CRD in the embedded API; the functions on their event sources. A node that
boots from the snapshot joins with the startup taint and has it removed within 2 s of its agent's hello,
and its `PrewarmWarm` condition set, as the official kubernetes client reads its Node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes.client import CoreV1Api

from prewarm.domain.bakes import BakeStep, SnapshotState
from prewarm.domain.boot import CONDITION_TYPE, PRESENT_AT_BOOT
from prewarm.services.jobs import apply_manifest
from prewarm_cli.app import cli
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import TAINT, apply_planned, never_job, running_local_mode, tainted
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

NODE_CLASS = "gpu"
SUBNET = "subnet-0123456789abcdef0"
BAKE_SECONDS = 60
# Issue #36: a node booted from the snapshot loses its startup taint within 2 s of its agent's hello.
UNTAINT_WITHIN = 2.0


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "bake", nodes=1) as mode:
        assert mode.kube is not None
        mode.kube.seed_objects([node_class(NODE_CLASS)])
        yield mode


def node_class(name: str) -> dict[str, Any]:
    return {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name},
            "spec": {"amiFamily": "Bottlerocket", "role": "KarpenterNodeRole",
                     "blockDeviceMappings": [
                         {"deviceName": "/dev/xvda", "rootVolume": True, "ebs": {"volumeSize": "4Gi"}},
                         {"deviceName": "/dev/xvdb", "ebs": {"volumeSize": "20Gi", "volumeType": "gp3"}}]}}


def warm_snapshot(name: str, node_class_name: str, rule: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "WarmSnapshot", "metadata": {"name": name},
            "spec": {"nodeClass": {"ec2NodeClass": node_class_name}, "amiFamily": "Bottlerocket",
                     "rules": [rule], "keep": 2, "builder": {"subnetIds": [SUBNET], "imageId": ami()}, **spec}}


def rule(name: str, repository: str) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": name},
            "spec": {"repositories": [repository], "template": {"spec": {"selector": {
                "matchLabels": {"prewarm.dev/none": "none"}}}}}}


_AMI: list[str] = []


def ami() -> str:
    """An AMI moto knows (its EC2 ships a catalogue of public AMIs)."""
    return _AMI[0] if _AMI else "ami-12c6146b"


def state(local: LocalMode, name: str) -> SnapshotState:
    found = local.job_store().get_warm_snapshot(name)
    assert found is not None
    return SnapshotState.from_dict(found[1])


def snapshot_of(local: LocalMode, name: str) -> str | None:
    assert local.kube is not None
    body = local.kube.get_object("ec2nodeclasses.karpenter.k8s.aws", name)
    return next(((m.get("ebs") or {}).get("snapshotID") for m in body["spec"]["blockDeviceMappings"]
                 if m["deviceName"] == "/dev/xvdb"), None)


def bake_ended(local: LocalMode, name: str) -> SnapshotState:
    def ended() -> bool:
        s = state(local, name)
        return s.bake is not None and not s.bake.active

    wait_until(ended, BAKE_SECONDS, f"the bake of {name} ended")
    return state(local, name)


def warm_condition(local: LocalMode, name: str) -> dict[str, Any] | None:
    """The Node's `PrewarmWarm` condition as the official kubernetes client reads it (None: not set). The
    response is read as JSON: the client's models refuse a local node's `nodeInfo`, which has no osImage."""
    assert local.kube is not None
    with local.kube.api_client() as client:
        node = json.loads(CoreV1Api(client).read_node(name, _preload_content=False).data)
    return next((c for c in node["status"].get("conditions") or () if c["type"] == CONDITION_TYPE), None)


@pytest.mark.timed
def test_a_push_bakes_the_node_class_a_snapshot_new_nodes_boot_warm_from(local: LocalMode) -> None:
    store = local.job_store()
    subnet = local.aws.client("ec2").describe_subnets()["Subnets"][0]["SubnetId"]  # type: ignore[union-attr]
    for manifest in (rule("ml", "ml/*"), warm_snapshot("gpu", NODE_CLASS, "ml", builder={
            "subnetIds": [subnet], "imageId": ami()})):
        apply_manifest(store, manifest, now=time.time())

    first = local.push("ml/trainer", "v1", size_mb=2)
    done = bake_ended(local, "gpu")
    assert done.bake is not None and done.bake.step is BakeStep.SUCCEEDED, done.bake
    reference = f"{ecr_host()}/ml/trainer:v1"
    assert done.current is not None and done.current.digests == {reference: first.digest}
    assert snapshot_of(local, NODE_CLASS) == done.current.id
    assert [s.step for s in done.bake.steps] == [BakeStep.LAUNCHING, BakeStep.PULLING, BakeStep.SNAPSHOTTING,
                                                BakeStep.PUBLISHING, BakeStep.SUCCEEDED]
    assert not done.stale

    # A node Karpenter launches from the class, with the startup taint, for a pool a Never job keeps warm with
    # the pushed digest: its containerd starts from the snapshot, and CRI shows the image before its agent has
    # pulled anything (no content ingest ever began: 0 bytes pulled).
    apply_planned(local, never_job("trainer", first.reference, "gpu"))
    local.add_node("warm-1", labels={"pool": "gpu"}, taints=[dict(TAINT)], node_class=NODE_CLASS)
    node = local.nodes["warm-1"]
    assert node.image_present(first.reference)
    assert blobs(node.containerd.root_dir) == blobs(local.builders.snapshots[done.current.id])  # 0 bytes pulled
    # Its taint comes off within 2 s of its agent's hello (every required image was there at boot) ...
    assert node.agent.hello_at is not None  # the agent's start sends its hello
    wait_until(lambda: not tainted(local, "warm-1"), 10, "warm-1's startup taint removed")
    delay = time.time() - node.agent.hello_at
    print(f"\nhello -> startup taint removed: {delay:.3f} s (at most, polled every 10 ms)")
    assert delay < UNTAINT_WITHIN
    # ... and its Node carries PrewarmWarm=True, ImagesPresentAtBoot
    wait_until(lambda: warm_condition(local, "warm-1") is not None, 5, "warm-1's PrewarmWarm condition")
    condition = warm_condition(local, "warm-1")
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", PRESENT_AT_BOOT)
    wait_until(lambda: local.job_store().get_node("warm-1") is not None, 20, "warm-1's hello")
    shown = run("describe", "snapshot", "gpu")
    assert f"Snapshot:      {done.current.id}" in shown and "Nodes booted from it: warm-1" in shown, shown
    assert "Status:        Current" in shown and "Cost:          builder " in shown, shown
    assert "ok    warm snapshots: 1 of 1 node classes on their newest baked snapshot" in run("doctor", code=None)

    # A second push: Stale until the next bake replaces the snapshot.
    second = local.push("ml/trainer", "v1", size_mb=2)
    assert state(local, "gpu").stale
    row = next(line for line in run("get", "snapshots").splitlines() if line.startswith("gpu "))
    assert row.split()[-3] == "Stale", row
    wait_until(lambda: state(local, "gpu").current.digests == {reference: second.digest},  # type: ignore[union-attr]
               BAKE_SECONDS, "the second bake published")
    after = state(local, "gpu")
    assert snapshot_of(local, NODE_CLASS) == after.current.id != done.current.id  # type: ignore[union-attr]
    assert [s.id for s in after.snapshots] == [after.current.id, done.current.id]  # type: ignore[union-attr]

    # A failed bake (EBS fails the snapshot) leaves the node class where it was.
    local.builders.fail_snapshots = "the volume went away"
    try:
        local.push("ml/trainer", "v1", size_mb=2)
        failed = bake_ended(local, "gpu")
        wait_until(lambda: state(local, "gpu").bake.step is BakeStep.FAILED,  # type: ignore[union-attr]
                   BAKE_SECONDS, "the third bake failed")
    finally:
        local.builders.fail_snapshots = ""
    failed = state(local, "gpu")
    assert failed.bake is not None and "the volume went away" in failed.bake.reason
    assert snapshot_of(local, NODE_CLASS) == after.current.id  # type: ignore[union-attr]
    assert failed.stale


def run(*args: str, code: int | None = 0) -> str:
    result = CliRunner().invoke(cli, ["--local", *args], catch_exceptions=False)
    assert code is None or result.exit_code == code, result.output
    return result.output


def blobs(root: Path) -> set[str]:
    """The content blobs a containerd root holds: a node that pulled anything has blobs its snapshot lacks."""
    return {p.name for p in (root / "io.containerd.content.v1.content" / "blobs" / "sha256").iterdir()}


def test_a_node_class_that_does_not_exist_fails_the_bake_naming_it(local: LocalMode) -> None:
    store = local.job_store()
    subnet = local.aws.client("ec2").describe_subnets()["Subnets"][0]["SubnetId"]  # type: ignore[union-attr]
    for manifest in (rule("web", "web/*"), warm_snapshot("nowhere", "missing", "web", builder={
            "subnetIds": [subnet], "imageId": ami()})):
        apply_manifest(store, manifest, now=time.time())
    local.push("web/app", "v1", size_mb=1)
    done = bake_ended(local, "nowhere")
    assert done.bake is not None and done.bake.step is BakeStep.FAILED
    assert done.bake.reason == "EC2NodeClass missing does not exist"
    assert done.bake.instance_id == ""  # no builder was launched
