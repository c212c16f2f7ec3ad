"""Warm snapshots' bakes: each event moves one warm snapshot's recorded state one step (domain.bakes) and
makes the AWS calls that step asks for. Nothing waits: the builder's report, EBS's snapshot event and the
sweep each carry a bake on. Every step can run twice (a redelivered event, a resumed bake) and change
nothing the second time: instances are launched with the bake's id as client token, a snapshot is found
again by its bake tag, and a late event for a step passed is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from prewarm.domain import bakes
from prewarm.domain.bakes import BakeStep, SnapshotState
from prewarm.domain.builders import bake_document, builder_user_data
from prewarm.domain.launch_sources import (
    LaunchSourceError,
    builder_instance_type,
    builder_source,
    needs_node_class,
)
from prewarm.domain.messages import Baked
from prewarm.domain.push import ImagePush
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.snapshots import MAX_TIME_BUDGET_SECONDS, WarmSnapshot
from prewarm.services.ports import StoreConflictError, WarmSnapshotItems
from prewarm.services.snapshot_ports import BakeError, Builders, NodeClasses, NodeClassMissingError

log = logging.getLogger(__name__)

# The EC2 states of a builder that will not report (instance lifecycle: stopping and shutting-down end there).
_BUILDER_ENDED = ("stopping", "stopped", "shutting-down", "terminated")


@dataclass(frozen=True)
class BakeSettings:
    """What every bake of the stack shares: where builders report and what they run."""

    status_queue_url: str
    region: str
    agent_image: str


@dataclass(frozen=True)
class BakeContext:
    store: WarmSnapshotItems
    builders: Builders
    node_classes: NodeClasses
    settings: BakeSettings


def apply_warm_snapshot(store: WarmSnapshotItems, declared: WarmSnapshot) -> str:
    """Records the declaration; its state (bakes, snapshots) is kept, and bakes again if it was being
    deleted (`delete_warm_snapshot`). Returns kubectl's word for it."""
    word = store.put_warm_snapshot(declared.name, declared.to_manifest(), declared.spec_hash())
    before = store.get_warm_snapshot(declared.name)
    if before is None or SnapshotState.from_dict(before[1]).deleted_at is None:
        return word
    _update(store, declared.name, lambda _declared, state: bakes.undeleted(state))
    return "configured"


def delete_warm_snapshot(store: WarmSnapshotItems, name: str, now: float) -> bool:
    """Its WarmSnapshot resource is gone: the record is marked deleted, which fails a running bake and owes
    Fast Snapshot Restore disabled on its snapshots (the bakes' stream and sweep do it: only they may call
    EC2), and goes once nothing is owed; each call (every sync) takes it a step on. The snapshots are kept:
    the node class may boot from them. Returns whether the record is gone."""

    def change(declared: WarmSnapshot, state: SnapshotState) -> SnapshotState:
        return bakes.deleted(_declared(declared, state), now)

    after = _update(store, name, change)
    if after is not None and not after.deletion_done:
        return False
    store.delete_warm_snapshot(name)
    return True


def _declared(declared: WarmSnapshot, state: SnapshotState) -> SnapshotState:
    """The state against the spec as it is now: its image set, and the FSR it owes disabling."""
    spec = declared.spec
    zones = spec.fast_snapshot_restore.availability_zones if spec.fast_snapshot_restore is not None else []
    return bakes.with_fsr_declared(bakes.with_declared(state, spec.images, spec.rules), zones)


def _update(store: WarmSnapshotItems, name: str,
            change: Callable[[WarmSnapshot, SnapshotState], SnapshotState]) -> SnapshotState | None:
    """Applies `change` to the recorded state, re-read and again on a conflicting write."""

    def attempt() -> SnapshotState | None:
        found = store.get_warm_snapshot(name)
        if found is None:
            return None
        manifest, data, version = found
        declared, before = WarmSnapshot.from_manifest(manifest), SnapshotState.from_dict(data)
        after = change(declared, before)
        if after != before:
            store.save_snapshot_state(name, after.to_dict(), version)
        return after

    return retry_on_conflict(attempt, conflict=StoreConflictError, attempts=5)


def _start_if_owed(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, now: float) -> SnapshotState:
    """Starts a bake when one is owed, checking the node class first: a bad class fails the bake at once."""
    if not bakes.next_bake_owed(state):
        return state
    state = bakes.start(state, declared.name, now)
    assert state.bake is not None
    spec = declared.spec
    try:
        ctx.node_classes.current_snapshot(spec.node_class.kind, spec.node_class.name, spec.data_volume.device_name)
        if not ctx.settings.agent_image:
            raise BakeError("the stack has no BuilderAgentImage: builders have no agent to run")
    except BakeError as e:
        return bakes.fail(state, state.bake.id, str(e), now)
    return _launch(ctx, declared, state, now)


def _launch(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, now: float) -> SnapshotState:
    bake = state.bake
    assert bake is not None
    spec, settings = declared.spec, ctx.settings
    document = bake_document(bake.id, declared.name, sorted(bake.images), settings.status_queue_url, settings.region)
    user_data = builder_user_data(spec.ami_family, settings.agent_image, document, spec.data_volume.device_name)
    try:
        node_class = (ctx.node_classes.launch_source(spec.node_class.kind, spec.node_class.name, spec.ami_family)
                      if needs_node_class(spec.builder) else None)
        named = ctx.node_classes.ami_architecture(spec.builder.image_id) if spec.builder.image_id else None
        source = builder_source(spec.builder, node_class, named)
        instance_type = builder_instance_type(spec.builder.instance_type, source.architecture,
                                              "spec.builder.imageId's AMI" if spec.builder.image_id
                                              else "the node class's AMI")
        instance_id, volume_id = ctx.builders.launch(
            bake.id, declared.name, source.image_id, instance_type, source.subnet_ids[0],
            spec.data_volume.device_name, spec.data_volume.size_gib, user_data)
    except (BakeError, LaunchSourceError) as e:
        return bakes.fail(state, bake.id, f"the builder could not be launched: {e}", now)
    return bakes.launched(state, bake.id, instance_id, volume_id, now)


def record_push(store: WarmSnapshotItems, push: ImagePush, matched_rules: Sequence[str], now: float) -> list[str]:
    """A push changes the image set of each warm snapshot that names a rule it matched or the image itself.
    Only the record changes here: the table's stream hands it to `advance`, which starts the bake unless
    one runs (then the next bake takes the newest set). Returns the warm snapshots changed.

    A push without a tag (by digest only) moved no tag, so no tagged image's newest digest changed and no
    rule's set did: it starts no bake. The one it does change is an image the spec pins at that digest
    (`repository@sha256:...`): the push is what makes it pullable, so its digest is recorded and baked."""
    repository = f"{push.registry_host}/{push.repository}"
    reference = f"{repository}:{push.tag}" if push.tag else f"{repository}@{push.digest}"
    changed = []
    for manifest, _data, _version in store.list_warm_snapshots():
        declared = WarmSnapshot.from_manifest(manifest)
        rules = [r for r in matched_rules if r in declared.spec.rules] if push.tag else []
        if not declared.wants(reference, rules):
            continue

        def change(declared: WarmSnapshot, state: SnapshotState, ref: str = reference,
                   by: list[str] = rules) -> SnapshotState:
            if state.deleted_at is not None:
                return state
            spec = declared.spec
            pushed = bakes.with_push(state, ref, push.digest, now, by, named=spec.images)
            return bakes.with_declared(pushed, spec.images, spec.rules)

        if _update(store, declared.name, change) is not None:
            changed.append(declared.name)
    return changed


def record_baked(store: WarmSnapshotItems, report: Baked, now: float) -> SnapshotState | None:
    """The builder's report: the bake goes on to its snapshot (`advance` stops the builder and takes it), or
    ends on the builder's failure."""

    def change(declared: WarmSnapshot, state: SnapshotState) -> SnapshotState:
        if not report.ok:
            return bakes.fail(state, report.bake, f"the builder failed: {report.message}", now)
        return bakes.pulled(state, report.bake, dict(report.digests), report.image_bytes, now)

    return _update(store, report.warm_snapshot, change)


def _snapshot(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, now: float) -> SnapshotState:
    """Stops the builder and snapshots its data volume (`_advance` calls it at Snapshotting, before a snapshot)."""
    bake = state.bake
    assert bake is not None
    try:
        ctx.builders.stop(bake.instance_id)
        found = ctx.builders.snapshot_of(bake.id)
        snapshot_id = found[0] if found else ctx.builders.create_snapshot(bake.volume_id, bake.id, declared.name)
    except BakeError as e:
        return _end(ctx, bakes.fail(state, bake.id, f"the snapshot could not be started: {e}", now))
    return bakes.snapshot_started(state, bake.id, snapshot_id)


def on_snapshot_event(ctx: BakeContext, snapshot_id: str, succeeded: bool, cause: str, now: float) -> str | None:
    """EBS's `EBS Snapshot Notification` for a snapshot: publish it, or fail its bake. Returns the warm
    snapshot it was for (None: not a bake's snapshot)."""
    owner = ctx.builders.snapshot_owner(snapshot_id)
    if owner is None:
        return None
    name, bake_id = owner

    def change(declared: WarmSnapshot, state: SnapshotState) -> SnapshotState:
        if not succeeded:
            failed = bakes.fail(state, bake_id, f"snapshot {snapshot_id} failed: {cause or 'no cause'}", now)
            return _end(ctx, bakes.owe_clean_up(failed, delete=[snapshot_id]))
        return _publish(ctx, declared, bakes.snapshot_completed(state, snapshot_id, now), now)

    _clean_up_owed(ctx, name, _update(ctx.store, name, change), [], sweeping=False)
    return name


def _publish(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, now: float) -> SnapshotState:
    bake = state.bake
    if bake is None or bake.step is not BakeStep.PUBLISHING:
        return state
    spec = declared.spec
    try:
        ctx.builders.tag_snapshot(bake.snapshot_id, bake.pulled)
        if spec.fast_snapshot_restore is not None:
            ctx.builders.enable_fast_restore(bake.snapshot_id, spec.fast_snapshot_restore.availability_zones)
        ctx.node_classes.point_at(spec.node_class.kind, spec.node_class.name, spec.data_volume.device_name,
                                  bake.snapshot_id)
    except BakeError as e:
        failed = bakes.fail(state, bake.id, f"the node class was not pointed at {bake.snapshot_id}: {e}", now)
        return _end(ctx, bakes.owe_clean_up(failed, delete=[bake.snapshot_id]))
    # The node class boots from it now: that is what gets recorded. The earlier snapshots' clean-up is only
    # recorded as owed here, and done once this is saved (`_clean_up_owed`): its failure cannot undo this.
    zones = spec.fast_snapshot_restore.availability_zones if spec.fast_snapshot_restore is not None else []
    state, _beyond_keep = bakes.published(_declared(declared, state), bake.snapshot_id, spec.keep, now, zones)
    return _end(ctx, state)


def _clean_up_owed(ctx: BakeContext, name: str, recorded: SnapshotState | None, done: list[str], *,
                   sweeping: bool) -> None:
    """Does the clean-up the saved state owes, in a write of its own. Outside the sweep only a first
    attempt: a failure recorded is the sweep's to retry (the stream would otherwise go round on it)."""
    if recorded is None or not recorded.clean_up.owed or (recorded.clean_up.error and not sweeping):
        return
    _update(ctx.store, name, lambda declared, state: _clean_up(ctx, declared, state, done))


def _clean_up(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, done: list[str]) -> SnapshotState:
    """Disables FSR and deletes the snapshots owed, each call idempotent; records what failed, and why.
    Never deletes the snapshot the node class boots from (an interrupted publish may have pointed it)."""
    owed, spec = state.clean_up, declared.spec
    disabled: list[str] = []
    deleted: list[str] = []
    errors: list[str] = []
    for snapshot_id, zones in owed.fsr_off.items():
        try:
            ctx.builders.disable_fast_restore(snapshot_id, zones)
            disabled.append(snapshot_id)
        except BakeError as e:
            errors.append(f"Fast Snapshot Restore of {snapshot_id} not disabled: {e}")
    pointed: str | None = None
    if owed.delete:
        try:
            pointed = ctx.node_classes.current_snapshot(spec.node_class.kind, spec.node_class.name,
                                                        spec.data_volume.device_name)
        except NodeClassMissingError:
            pointed = None  # no such class (or volume): it boots from none of them
        except BakeError as e:
            errors.append(f"{', '.join(owed.delete)} not deleted: {spec.node_class.describe()} not read: {e}")
            return bakes.cleaned(state, disabled, deleted, "; ".join(errors))
    kept: str | None = None
    for snapshot_id in owed.delete:
        if snapshot_id == pointed and state.deleted_at is not None:
            kept = snapshot_id  # a deleted warm snapshot keeps its snapshots: this one's FSR goes off instead
            continue
        if snapshot_id == pointed:
            errors.append(f"{snapshot_id} not deleted: {spec.node_class.describe()} boots from it")
            continue
        try:
            ctx.builders.delete_snapshot(snapshot_id)
            deleted.append(snapshot_id)
        except BakeError as e:
            errors.append(f"{snapshot_id} not deleted: {e}")
    if disabled or deleted:
        done.append(f"{declared.name}: clean-up: " + ", ".join(
            [f"Fast Snapshot Restore of {s} disabled" for s in disabled] + [f"{s} deleted" for s in deleted]))
    if errors:
        log.warning("clean-up of earlier snapshots failed", extra={"warm_snapshot": declared.name, "errors": errors})
    state = bakes.cleaned(state, disabled, deleted, "; ".join(errors))
    if kept is not None:
        fsr = spec.fast_snapshot_restore
        state = bakes.kept_booted(state, kept, list(fsr.availability_zones) if fsr is not None else [])
    return state


def _end(ctx: BakeContext, state: SnapshotState) -> SnapshotState:
    """A bake that ended terminates its builder, once (the sweep terminates one this could not)."""
    bake = state.bake
    if bake is None or bake.active or not bake.instance_id or bake.builder_terminated:
        return state
    try:
        ctx.builders.terminate(bake.instance_id)
    except BakeError as e:
        log.warning("builder not terminated", extra={"bake": bake.id, "error": str(e)})
        return state
    return replace(state, bake=replace(bake, builder_terminated=True))


def advance(ctx: BakeContext, name: str, now: float, *, sweeping: bool = False) -> list[str]:
    """Carries one warm snapshot's bake on as far as it can go now (the table stream calls it after every
    change of the record, the sweep every minute): starts an owed bake, launches, snapshots, publishes,
    terminates an ended bake's builder; fails a bake past its time budget. `sweeping`: also look for what
    an event was lost for (a snapshot completed whose notification never came). Returns what it did."""
    done: list[str] = []
    recorded = _update(ctx.store, name, lambda declared, state: _advance(ctx, declared, state, now, sweeping, done))
    _clean_up_owed(ctx, name, recorded, done, sweeping=sweeping)
    return done


def sweep(ctx: BakeContext, now: float) -> list[str]:
    """`advance`s every warm snapshot, each on its own: one's error is logged and said, and the others, then
    the builders no bake owns (terminated past the longest time budget), are still swept. Returns what it
    did, one line each."""
    done: list[str] = []
    budgets: dict[str, float] = {}
    for manifest, _data, _version in ctx.store.list_warm_snapshots():
        name = str(manifest.get("metadata", {}).get("name", ""))
        budgets[name] = MAX_TIME_BUDGET_SECONDS  # until its spec is read: its builder is not cut short
        try:
            declared = WarmSnapshot.from_manifest(manifest)
            budgets[name] = declared.spec.builder.time_budget_seconds
            done += advance(ctx, name, now, sweeping=True)
        except Exception as e:  # an AWS, table or record fault of one warm snapshot stops no other's sweep
            log.exception("warm snapshot not swept", extra={"warm_snapshot": name})
            done.append(f"{name}: not swept: {e}")
    longest = max(budgets.values(), default=0.0)
    for instance_id, owner, bake_id, launched_at in ctx.builders.running_builders():
        if now - launched_at > budgets.get(owner, longest):
            try:
                ctx.builders.terminate(instance_id)
            except BakeError as e:
                log.warning("builder not terminated", extra={"instance": instance_id, "error": str(e)})
                done.append(f"builder {instance_id} of {bake_id} not terminated: {e}")
                continue
            done.append(f"terminated builder {instance_id} of {bake_id}: past its time budget")
    return done


def _advance(ctx: BakeContext, declared: WarmSnapshot, state: SnapshotState, now: float, sweeping: bool,
             done: list[str]) -> SnapshotState:
    if state.deleted_at is not None:
        return _end(ctx, state)  # its clean-up (FSR off) follows; `sync_resources` then drops the record
    state = _declared(declared, state)
    bake, budget = state.bake, declared.spec.builder.time_budget_seconds
    if bake is not None and bake.step is BakeStep.PUBLISHING:
        # Its snapshot is complete, the node class maybe on it already: published, never failed for its age.
        return _publish(ctx, declared, state, now)
    if bake is not None and bakes.expired(state, now, budget):
        done.append(f"{declared.name}: bake {bake.id} failed at {bake.step}, past its {budget} s budget")
        failed = bakes.fail(state, bake.id, f"the bake outlived its time budget ({budget} s) at {bake.step}", now)
        # Its snapshot is deleted by the clean-up, which never deletes one the node class boots from.
        return _end(ctx, bakes.owe_clean_up(failed, delete=[bake.snapshot_id] if bake.snapshot_id else []))
    if bake is None or not bake.active:
        state = _end(ctx, state)  # a bake the builder's report ended
        started = _start_if_owed(ctx, declared, state, now)
        if started is not state:
            done.append(f"{declared.name}: bake {started.bake.id if started.bake else ''} started")
        return started
    if bake.step is BakeStep.LAUNCHING:
        done.append(f"{declared.name}: bake {bake.id} launched")
        return _launch(ctx, declared, state, now)
    if bake.step is BakeStep.PULLING and sweeping:
        ended = ctx.builders.builder_state(bake.instance_id)
        if ended in _BUILDER_ENDED:
            # Killed, or its OS shut down (it stops): it will never report; fail now, not at the budget.
            done.append(f"{declared.name}: bake {bake.id} failed: its builder is {ended}")
            return _end(ctx, bakes.fail(state, bake.id, f"builder {bake.instance_id} was {ended} before it "
                                                        "reported its images", now))
    if bake.step is BakeStep.SNAPSHOTTING and not bake.snapshot_id:
        done.append(f"{declared.name}: bake {bake.id} snapshotting")
        return _snapshot(ctx, declared, state, now)
    if bake.step is BakeStep.SNAPSHOTTING and sweeping:
        found = ctx.builders.snapshot_of(bake.id)
        if found is not None and found[1] == "completed":
            done.append(f"{declared.name}: bake {bake.id} resumed at its completed snapshot {found[0]}")
            return _publish(ctx, declared, bakes.snapshot_completed(state, found[0], now), now)
        if found is not None and found[1] == "error":
            return _end(ctx, bakes.fail(state, bake.id, f"snapshot {found[0]} failed", now))
    return state
