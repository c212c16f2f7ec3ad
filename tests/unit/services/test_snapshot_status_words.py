"""`prewarm get snapshots`' status words and `.status.stale` (docs/cli.md, docs/job-spec.md "WarmSnapshot"),
and the nodes `describe snapshot` says booted from the current snapshot: by their boot record, not their
last hello."""

from __future__ import annotations

import pytest

from prewarm.domain import bakes as domain_bakes
from prewarm.domain.bakes import SnapshotState
from prewarm.domain.nodes import NodeBoot, RegisteredNode
from prewarm.domain.snapshots import WarmSnapshot
from prewarm.services import bakes
from prewarm_cli.snapshot_output import NODE_CLASS_LABEL, booted_from, status_word
from tests.support.bakes import D1, D2, REF, builder_reports, context, declare, manifest, push, state

BUSYBOX = "docker.io/library/busybox:1"


def test_a_rules_only_snapshot_before_any_push_is_pending_and_not_stale() -> None:
    ctx, _ec2, _classes = context()
    bakes.advance(ctx, "gpu", 1.0)
    assert status_word(state(ctx)) == "Pending" and state(ctx).resource_status()["stale"] is False


def test_an_images_only_snapshot_is_stale_until_baked_and_failed_when_its_first_bake_fails() -> None:
    declared = domain_bakes.with_declared(SnapshotState(), [BUSYBOX], [])
    assert status_word(declared) == "Baking" and declared.resource_status()["stale"] is True
    ctx, _ec2, _classes = context(rules=[], images=[BUSYBOX])
    bakes.advance(ctx, "gpu", 1.0)
    assert status_word(state(ctx)) == "Baking"
    builder_reports(ctx, D1, 2.0, ok=False, message=f"{BUSYBOX}: 403 Forbidden")
    assert status_word(state(ctx)) == "Failed" and state(ctx).resource_status()["stale"] is True


@pytest.mark.parametrize("earlier", [False, True], ids=["first-bake", "earlier-snapshot-current"])
def test_a_rule_driven_bake_that_failed_is_failed_whether_or_not_an_earlier_snapshot_is_current(
        earlier: bool) -> None:
    ctx, _ec2, _classes = context()
    if earlier:
        push(ctx, D1, 10.0)
        builder_reports(ctx, D1, 20.0)
        bakes.on_snapshot_event(ctx, "snap-1", True, "", 30.0)
        assert status_word(state(ctx)) == "Current"
    push(ctx, D2, 40.0)
    assert status_word(state(ctx)) == ("Stale" if earlier else "Baking")  # LAST BAKE shows it running
    builder_reports(ctx, D2, 50.0, ok=False, message=f"{REF}: 403 Forbidden")
    assert status_word(state(ctx)) == "Failed" and state(ctx).stale


def test_a_deleted_warm_snapshot_is_deleting() -> None:
    assert status_word(domain_bakes.deleted(SnapshotState(), 1.0)) == "Deleting"


def test_dropping_the_only_image_of_a_snapshot_never_baked_is_pending_again() -> None:
    ctx, _ec2, _classes = context(rules=[], images=[BUSYBOX])
    declare(ctx, rules=["ml"], images=[])
    assert status_word(state(ctx)) == "Pending"


def node(name: str, last_hello: float, boot_at: float | None, node_class: str = "gpu") -> RegisteredNode:
    return RegisteredNode(name=name, labels={NODE_CLASS_LABEL: node_class}, architecture="amd64", os="linux",
                          queue_url="", last_hello=last_hello,
                          boot=None if boot_at is None else NodeBoot(required=(), present=(), at=boot_at))


def test_nodes_booted_from_the_snapshot_are_those_whose_first_hello_came_after_its_publish() -> None:
    ctx, _ec2, _classes = context()
    push(ctx, D1, 10.0)
    builder_reports(ctx, D1, 20.0)
    bakes.on_snapshot_event(ctx, "snap-1", True, "", 100.0)
    nodes = [node("new", 150.0, 120.0), node("restarted-agent", 150.0, 50.0), node("no-boot-record", 150.0, None),
             node("other-class", 150.0, 120.0, node_class="cpu")]
    assert booted_from(WarmSnapshot.from_manifest(manifest()), state(ctx), nodes) == ["new"]
