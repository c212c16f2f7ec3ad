"""Issue #36, item 6: a bake's faults end with a clear status and the node class on its last good snapshot,
on a real local stack (moto's EC2 and ECR behind the AWS limits layer, builders as local containerds with
the agent in bake mode signing as the BuilderRole, snapshots' events on the local event bus).

- a builder refused by ECR (403: the repository's policy denies the builder's role);
- pushes during a bake coalesce (one bake at a time, the newest image set wins), while the running bake is
  interrupted between steps (its snapshot's event lost) and resumed by the sweep, once;
- a builder killed before its report fails its bake at the next sweep, and the next push bakes again.

Each warm snapshot here launches its builder from its EC2NodeClass's `amiSelectorTerms` and
`subnetSelectorTerms` (no `spec.builder`), as Karpenter launches the class's nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from prewarm.domain.bakes import BakeStep, SnapshotState
from prewarm.services.jobs import apply_manifest
from prewarm_cli.app import cli
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import running_local_mode
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

BAKE_SECONDS = 60
AMI = "ami-12c6146b"  # in moto's catalogue of public AMIs


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "bakefaults", nodes=1) as mode:
        yield mode


def declare(local: LocalMode, name: str) -> str:
    """An EC2NodeClass, a rule of repository `<name>/*` and a warm snapshot of both named `name`; returns the
    image reference a push of `<name>/app:v1` bakes."""
    assert local.kube is not None and local.aws is not None
    subnet = local.aws.client("ec2").describe_subnets()["Subnets"][0]["SubnetId"]
    local.kube.seed_objects([{
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name},
        "spec": {"amiFamily": "Bottlerocket", "role": "KarpenterNodeRole",
                 "amiSelectorTerms": [{"id": AMI}], "subnetSelectorTerms": [{"id": subnet}],
                 "blockDeviceMappings": [{"deviceName": "/dev/xvdb", "ebs": {"volumeSize": "20Gi"}}]}}])
    for manifest in (
        {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": name},
         "spec": {"repositories": [f"{name}/*"], "template": {"spec": {"selector": {
             "matchLabels": {"prewarm.dev/none": "none"}}}}}},
        {"apiVersion": "prewarm.dev/v1alpha1", "kind": "WarmSnapshot", "metadata": {"name": name},
         "spec": {"nodeClass": {"ec2NodeClass": name}, "amiFamily": "Bottlerocket", "rules": [name], "keep": 3}}):
        apply_manifest(local.job_store(), manifest, now=time.time())
    return f"{ecr_host()}/{name}/app:v1"


def state(local: LocalMode, name: str) -> SnapshotState:
    found = local.job_store().get_warm_snapshot(name)
    assert found is not None
    return SnapshotState.from_dict(found[1])


def bake_ended(local: LocalMode, name: str, number: int) -> SnapshotState:
    """The state once bake `number` of `name` ended and its builder was terminated."""
    def ended() -> bool:
        bake = state(local, name).bake
        return (bake is not None and bake.id == f"{name}-{number}" and not bake.active
                and (bake.builder_terminated or not bake.instance_id))

    wait_until(ended, BAKE_SECONDS, f"bake {number} of {name} ended")
    return state(local, name)


def snapshot_of(local: LocalMode, name: str) -> str | None:
    assert local.kube is not None
    body = local.kube.get_object("ec2nodeclasses.karpenter.k8s.aws", name)
    return next(((m.get("ebs") or {}).get("snapshotID") for m in body["spec"]["blockDeviceMappings"]
                 if m["deviceName"] == "/dev/xvdb"), None)


def baked_once(local: LocalMode, name: str) -> tuple[str, SnapshotState]:
    """A first good bake: the node class on its snapshot."""
    reference = declare(local, name)
    local.push(f"{name}/app", "v1", size_mb=1)
    good = bake_ended(local, name, 1)
    assert good.bake is not None and good.bake.step is BakeStep.SUCCEEDED, good.bake
    assert good.current is not None and snapshot_of(local, name) == good.current.id
    return reference, good


def describe(name: str) -> str:
    result = CliRunner().invoke(cli, ["--local", "describe", "snapshot", name], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_builder_refused_by_ecr_fails_its_bake_saying_so_and_the_node_class_stays(local: LocalMode) -> None:
    reference, good = baked_once(local, "denied")
    assert local.aws is not None and local.builders is not None
    builder_role = local.builders.identity.arn
    ecr = local.aws.client("ecr")
    deny = {"Version": "2012-10-17", "Statement": [
        {"Sid": "NoBuilders", "Effect": "Deny", "Principal": {"AWS": builder_role},
         "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]}]}
    ecr.set_repository_policy(repositoryName="denied/app", policyText=json.dumps(deny))
    try:
        local.push("denied/app", "v1", size_mb=1)
        failed = bake_ended(local, "denied", 2)
    finally:
        ecr.delete_repository_policy(repositoryName="denied/app")
    assert failed.bake is not None and failed.bake.step is BakeStep.FAILED
    assert failed.bake.reason.startswith("the builder failed: "), failed.bake.reason
    assert "403" in failed.bake.reason and reference in failed.bake.reason, failed.bake.reason
    assert failed.bake.builder_terminated and failed.current == good.current and failed.stale
    assert snapshot_of(local, "denied") == good.current.id  # type: ignore[union-attr]
    shown = describe("denied")
    assert f"Last bake:     denied-2, Failed: {failed.bake.reason}" in shown, shown
    assert f"Snapshot:      {good.current.id}" in shown, shown  # type: ignore[union-attr]


def test_pushes_during_an_interrupted_bake_coalesce_and_the_sweep_resumes_it_once(local: LocalMode) -> None:
    reference = declare(local, "burst")
    assert local.builders is not None
    local.builders.drop_events = True  # bake 1's snapshot completes, its event is lost: it stays Snapshotting
    try:
        first = local.push("burst/app", "v1", size_mb=1)
        wait_until(lambda: bool(state(local, "burst").bake and state(local, "burst").bake.snapshot_id  # type: ignore[union-attr]
                                and state(local, "burst").bake.snapshot_id in local.builders.snapshots),  # type: ignore[union-attr]
                   BAKE_SECONDS, "bake 1's snapshot made")
        second = local.push("burst/app", "v1", size_mb=1)
        third = local.push("burst/app", "v1", size_mb=1)
        during = state(local, "burst")
        assert during.bakes == 1 and during.bake is not None and during.bake.step is BakeStep.SNAPSHOTTING
        assert during.bake.images == {reference: first.digest} and during.images == {reference: third.digest}
    finally:
        local.builders.drop_events = False
    assert snapshot_of(local, "burst") is None  # not published before its snapshot is known complete

    swept = local.fire("bakes")["result"]["done"]
    assert f"burst: bake burst-1 resumed at its completed snapshot {during.bake.snapshot_id}" in swept, swept
    done = bake_ended(local, "burst", 2)
    assert done.bakes == 2 and done.bake is not None and done.bake.step is BakeStep.SUCCEEDED, done.bake
    assert done.bake.images == {reference: third.digest}  # the newest set; the second push's is never baked
    assert [s.digests for s in done.snapshots] == [{reference: third.digest}, {reference: first.digest}]
    assert second.digest not in {d for s in done.snapshots for d in s.digests.values()}
    assert snapshot_of(local, "burst") == done.snapshots[0].id
    # Resumed once: a second sweep finds nothing to do for it, and no builder is left.
    assert not [line for line in local.fire("bakes")["result"]["done"] if line.startswith("burst")]
    assert not [i for r in local.aws.client("ec2").describe_instances(Filters=[  # type: ignore[union-attr]
        {"Name": "tag:prewarm.dev/warm-snapshot", "Values": ["burst"]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])["Reservations"]
        for i in r["Instances"]]


def test_a_builder_killed_before_its_report_fails_the_bake_at_the_next_sweep_and_the_next_push_bakes(
        local: LocalMode) -> None:
    reference, good = baked_once(local, "killed")
    assert local.builders is not None and local.aws is not None
    local.builders.hold_agents = True  # the builder boots, its agent does not run: it cannot report first
    try:
        local.push("killed/app", "v1", size_mb=1)
        wait_until(lambda: bool(state(local, "killed").bake and state(local, "killed").bake.instance_id  # type: ignore[union-attr]
                                and state(local, "killed").bake.id == "killed-2"),  # type: ignore[union-attr]
                   BAKE_SECONDS, "bake 2's builder launched")
    finally:
        local.builders.hold_agents = False
    instance = state(local, "killed").bake.instance_id  # type: ignore[union-attr]
    local.aws.client("ec2").terminate_instances(InstanceIds=[instance])  # killed, as an operator or a reclaim

    # The next sweep fails it: this one, or the stack's own minute sweep if it came first (it runs meanwhile)
    swept = local.fire("bakes")["result"]["done"]
    failed = state(local, "killed")
    assert "killed: bake killed-2 failed: its builder is terminated" in swept or (
        failed.bake is not None and failed.bake.id == "killed-2" and not [line for line in swept
                                                                          if line.startswith("killed:")]), swept
    assert failed.bake is not None and failed.bake.step is BakeStep.FAILED
    assert failed.bake.reason == f"builder {instance} was terminated before it reported its images"
    assert failed.current == good.current and snapshot_of(local, "killed") == good.current.id  # type: ignore[union-attr]
    assert f"Last bake:     killed-2, Failed: {failed.bake.reason}" in describe("killed")

    latest = local.push("killed/app", "v1", size_mb=1)
    done = bake_ended(local, "killed", 3)
    assert done.bake is not None and done.bake.step is BakeStep.SUCCEEDED, done.bake
    assert done.current is not None and done.current.digests == {reference: latest.digest}
    assert snapshot_of(local, "killed") == done.current.id
