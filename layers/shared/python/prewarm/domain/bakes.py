"""A warm snapshot's bakes: the state machine from a changed image set to a node class on a new snapshot.

Pure: each function takes the recorded `SnapshotState` and an event and returns the next state; the
services (`services/bakes.py`) make the AWS calls a step asks for and record the result. One bake at a
time per warm snapshot (so per node class); pushes during a bake only change `images`, and when the bake
ends a newer image set starts the next one (coalescing: the newest set wins, the sets between are never
baked). A failed bake leaves `snapshots` (the node class's last good one first) as it was.

Steps, in order (each recorded with its time):
  Launching     RunInstances of the builder (idempotent: its client token is the bake's id)
  Pulling       the builder's agent pulls each image through CRI and reports (`Baked`)
  Snapshotting  StopInstances, CreateSnapshot of the data volume; waits for EBS's event
  Publishing    tag the snapshot, Fast Snapshot Restore, point the node class at it
  Succeeded / Failed; the builder is then terminated. What is left to do to earlier snapshots (their Fast
  Snapshot Restore disabled, those beyond `keep` or of a failed bake deleted) is recorded as `clean_up`
  and done after, until it succeeds: its failure never undoes a publish.

Fast Snapshot Restore is billed per snapshot and AZ-hour while enabled, so each snapshot records the zones
it is enabled in: the clean-up disables those of earlier snapshots, those of the current one the spec no
longer names, and, once the WarmSnapshot is deleted, all of them (its snapshots are kept: nodes may boot
from them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any


class BakeStep(StrEnum):
    LAUNCHING = "Launching"
    PULLING = "Pulling"
    SNAPSHOTTING = "Snapshotting"
    PUBLISHING = "Publishing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def is_final(self) -> bool:
        return self in (BakeStep.SUCCEEDED, BakeStep.FAILED)


class BakeTransitionError(ValueError):
    """An event that does not apply to the bake's current step (a late or repeated event is not one)."""


@dataclass(frozen=True)
class StepRecord:
    step: BakeStep
    at: float
    note: str = ""


@dataclass(frozen=True)
class Bake:
    """One bake: the image set it bakes (reference -> digest, None where only the tag is known) and its steps."""

    id: str
    images: dict[str, str | None]
    started_at: float
    steps: tuple[StepRecord, ...]
    instance_id: str = ""
    volume_id: str = ""
    snapshot_id: str = ""
    pulled: dict[str, str] = field(default_factory=dict)
    bytes_pulled: int = 0
    reason: str = ""
    finished_at: float | None = None
    builder_terminated: bool = False

    @property
    def step(self) -> BakeStep:
        return self.steps[-1].step

    @property
    def active(self) -> bool:
        return not self.step.is_final

    def at(self, step: BakeStep, now: float, note: str = "", **changes: Any) -> Bake:
        return replace(self, steps=(*self.steps, StepRecord(step, now, note)), **changes)

    def builder_seconds(self, now: float) -> float:
        """How long the builder ran (so far): from its launch to its termination, the bake's end."""
        launched = next((s.at for s in self.steps if s.step is BakeStep.PULLING), None)
        if launched is None:
            return 0.0
        return max(0.0, (self.finished_at or now) - launched)


@dataclass(frozen=True)
class BakedSnapshot:
    """A snapshot a bake made and published: what it holds and when, and the zones Fast Snapshot Restore
    is enabled in (since `created_at`: it is enabled at the publish), until the clean-up disables them."""

    id: str
    digests: dict[str, str]
    created_at: float
    bake_id: str
    stored_bytes: int = 0
    fsr_zones: tuple[str, ...] | None = None  # None: recorded before the zones were (`with_fsr_declared`)


@dataclass(frozen=True)
class CleanUp:
    """What a publish (or a failed bake) left to do to snapshots the node class no longer boots from.
    Recorded with it and done after, so a failure here is retried (the sweep) and never undoes the publish."""

    fsr_off: dict[str, tuple[str, ...]] = field(default_factory=dict)  # snapshot -> AZs: billed per AZ-hour
    delete: tuple[str, ...] = ()  # beyond `keep`, or a failed bake's
    error: str = ""  # why the last attempt left some undone: which step, which snapshot, what AWS said

    @property
    def owed(self) -> bool:
        return bool(self.fsr_off or self.delete)


@dataclass(frozen=True)
class SnapshotState:
    """What is recorded of one warm snapshot: the image set wanted, the bakes, the snapshots kept."""

    images: dict[str, str | None] = field(default_factory=dict)
    newest_push_at: float | None = None
    # The rules whose pushes brought each image in (none: the spec names it): when the spec no longer
    # names the image nor any of those rules, the image leaves the set.
    image_rules: dict[str, list[str]] = field(default_factory=dict)
    bake: Bake | None = None
    bakes: int = 0
    snapshots: tuple[BakedSnapshot, ...] = ()
    clean_up: CleanUp = field(default_factory=CleanUp)
    # When its WarmSnapshot was deleted: no bake starts; the record goes once the clean-up is done.
    deleted_at: float | None = None

    @property
    def current(self) -> BakedSnapshot | None:
        """The snapshot the node class points at: the newest published."""
        return self.snapshots[0] if self.snapshots else None

    @property
    def newer_pushed(self) -> list[str]:
        """Images pushed at a digest the current snapshot does not hold (any pushed one when there is none)."""
        held = self.current.digests if self.current else {}
        return [ref for ref, digest in self.images.items() if digest is not None and held.get(ref) != digest]

    @property
    def not_baked(self) -> list[str]:
        """Images declared (no push of them seen) that the current snapshot, if any, does not hold: the
        builder resolves their digests."""
        held = self.current.digests if self.current else {}
        return [ref for ref, d in self.images.items() if d is None and ref not in held]

    @property
    def no_longer_declared(self) -> list[str]:
        """Images the current snapshot holds that the set no longer names. An empty set owes no bake: a
        snapshot of nothing helps no node, the class keeps what it has."""
        held = self.current.digests if self.current else {}
        return [ref for ref in held if self.images and ref not in self.images]

    @property
    def stale(self) -> bool:
        """Whether the current snapshot is not the image set (a pushed digest or a declared image it lacks,
        none baked yet included; an image dropped since it was baked): a bake is owed."""
        return bool(self.newer_pushed or self.not_baked or self.no_longer_declared)

    @property
    def last_bake_failed(self) -> bool:
        """The last bake failed and the image set is still not baked: nothing retries it before the next
        push or change of the spec."""
        return self.stale and self.bake is not None and self.bake.step is BakeStep.FAILED

    @property
    def deletion_done(self) -> bool:
        """Its WarmSnapshot is deleted and nothing is left to do: no FSR to disable, no builder to end."""
        bake = self.bake
        builder_left = bake is not None and (bake.active or (bool(bake.instance_id) and not bake.builder_terminated))
        return self.deleted_at is not None and not self.clean_up.owed and not builder_left

    @property
    def pending(self) -> bool:
        """Whether the image set differs from what the current (or running) bake bakes: a bake is owed."""
        if self.bake is not None and self.bake.active:
            return self.bake.images != self.images
        return self.stale

    def message(self) -> str:
        """One line on where the warm snapshot stands: what the node class boots from, and the last bake."""
        bake, current = self.bake, self.current
        parts = [f"node class on {current.id}" if current else "no snapshot baked yet"]
        if self.deleted_at is not None:
            parts.append("deleted: Fast Snapshot Restore being disabled on its snapshots (they are kept)")
        why = [text for refs, text in ((self.newer_pushed, "a newer digest is pushed but not baked"),
                                       (self.not_baked, f"{_some(self.not_baked)} declared but not baked"),
                                       (self.no_longer_declared, f"{_some(self.no_longer_declared)} no longer "
                                                                 "declared but in the snapshot")) if refs]
        if why:
            parts.append("Stale: " + ", ".join(why))
        if bake is not None:
            parts.append(f"bake {bake.id} {bake.step}" + (f": {bake.reason}" if bake.reason else ""))
        if self.clean_up.error:
            parts.append(f"clean-up owed (the sweep retries): {self.clean_up.error}")
        return "; ".join(parts)

    def resource_status(self) -> dict[str, Any]:
        """The WarmSnapshot resource's status (the CRD's `.status`)."""
        status: dict[str, Any] = {"stale": self.stale, "message": self.message()}
        if self.current is not None:
            status["snapshotID"] = self.current.id
        return status

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SnapshotState:
        if not data:
            return cls()
        bake, clean_up = data.get("bake"), data.get("clean_up") or {}
        return cls(
            images=dict(data.get("images", {})),
            newest_push_at=data.get("newest_push_at"),
            image_rules={ref: list(rules) for ref, rules in data.get("image_rules", {}).items()},
            bake=None if bake is None else Bake(
                **{**bake, "steps": tuple(StepRecord(BakeStep(s["step"]), s["at"], s.get("note", ""))
                                          for s in bake["steps"])}),
            bakes=int(data.get("bakes", 0)),
            snapshots=tuple(BakedSnapshot(**{**s, "fsr_zones": None if s.get("fsr_zones") is None
                                             else tuple(s["fsr_zones"])}) for s in data.get("snapshots", ())),
            clean_up=CleanUp({s: tuple(zones) for s, zones in clean_up.get("fsr_off", {}).items()},
                             tuple(clean_up.get("delete", ())), clean_up.get("error", "")),
            deleted_at=data.get("deleted_at"),
        )


def _some(refs: Sequence[str], shown: int = 3) -> str:
    """A few references for a one-line message (a spec may name 100)."""
    more = len(refs) - shown
    return ", ".join(refs[:shown]) + (f" and {more} more" if more > 0 else "")


def _repository(reference: str) -> str:
    """`registry/repository` of `registry/repository:tag` or `registry/repository@digest`."""
    if "@" in reference:
        return reference.split("@", 1)[0]
    name, _, tag = reference.rpartition(":")
    return name if name and "/" not in tag else reference


def with_push(state: SnapshotState, reference: str, digest: str, now: float,
              rules: list[str] | None = None, named: Collection[str] = ()) -> SnapshotState:
    """The image set after `reference` (registry/repository:tag, or @digest) was pushed at `digest`;
    `rules`: the warm snapshot's rules that matched the push (none: the spec names the image).

    A rule keeps the newest tag pushed per repository: the tags of that repository it brought earlier
    leave the set (and the next snapshot) unless another rule still brings them or the spec names them
    (`named`). Every tag a rule ever matched would otherwise be baked into every snapshot, forever."""
    matched = sorted(set(rules or ()))
    images, image_rules = dict(state.images), dict(state.image_rules)
    repository = _repository(reference)
    for ref, by in state.image_rules.items():
        if ref == reference or not set(by) & set(matched) or _repository(ref) != repository:
            continue
        left = [r for r in by if r not in matched]
        if left:
            image_rules[ref] = left
            continue
        del image_rules[ref]
        if ref not in named:
            images.pop(ref, None)
    moved = images.get(reference) != digest
    images[reference] = digest
    image_rules.pop(reference, None)
    if matched:
        image_rules[reference] = matched
    if images == state.images and image_rules == state.image_rules:
        return state
    return replace(state, images=images, image_rules=image_rules,
                   newest_push_at=now if moved else state.newest_push_at)


def with_declared(state: SnapshotState, images: list[str], rules: list[str]) -> SnapshotState:
    """The image set the spec declares now: each image it names (its digest unknown until a push or the
    builder says), each pushed image one of its rules brought in; an image it no longer names, brought
    by no rule it still names, leaves the set. Either change makes the current snapshot `stale`: a bake
    is owed that adds or drops it."""
    named, kept_rules = set(images), set(rules)
    kept = {ref: digest for ref, digest in state.images.items()
            if ref in named or kept_rules & set(state.image_rules.get(ref, ()))}
    kept.update({ref: None for ref in images if ref not in kept})
    if kept == state.images:
        return state
    return replace(state, images=kept, image_rules={k: v for k, v in state.image_rules.items() if k in kept})


def start(state: SnapshotState, name: str, now: float) -> SnapshotState:
    """A new bake of the current image set: only when none runs and the set is owed."""
    if state.bake is not None and state.bake.active:
        raise BakeTransitionError(f"bake {state.bake.id} is still {state.bake.step}: pushes coalesce into the next")
    number = state.bakes + 1
    bake = Bake(id=f"{name}-{number}", images=dict(state.images), started_at=now,
                steps=(StepRecord(BakeStep.LAUNCHING, now),))
    return replace(state, bake=bake, bakes=number)


def _active(state: SnapshotState, bake_id: str, *steps: BakeStep) -> Bake | None:
    """The bake if `bake_id` is it and it is at one of `steps`; None for a late or repeated event."""
    bake = state.bake
    if bake is None or bake.id != bake_id or bake.step not in steps:
        return None
    return bake


def launched(state: SnapshotState, bake_id: str, instance_id: str, volume_id: str, now: float) -> SnapshotState:
    bake = _active(state, bake_id, BakeStep.LAUNCHING)
    if bake is None:
        return state
    return replace(state, bake=bake.at(BakeStep.PULLING, now, instance_id, instance_id=instance_id,
                                       volume_id=volume_id))


def pulled(state: SnapshotState, bake_id: str, digests: dict[str, str], bytes_pulled: int,
           now: float) -> SnapshotState:
    """The builder holds every image: its digests as pulled (a tag's digest is learnt here)."""
    bake = _active(state, bake_id, BakeStep.PULLING)
    if bake is None:
        return state
    missing = sorted(set(bake.images) - set(digests))
    if missing:
        return fail(state, bake_id, f"the builder did not report {', '.join(missing)}", now)
    return replace(state, bake=bake.at(BakeStep.SNAPSHOTTING, now, pulled=dict(digests), bytes_pulled=bytes_pulled))


def snapshot_started(state: SnapshotState, bake_id: str, snapshot_id: str) -> SnapshotState:
    bake = _active(state, bake_id, BakeStep.SNAPSHOTTING)
    if bake is None or bake.snapshot_id == snapshot_id:
        return state
    return replace(state, bake=replace(bake, snapshot_id=snapshot_id))


def snapshot_completed(state: SnapshotState, snapshot_id: str, now: float) -> SnapshotState:
    bake = state.bake
    if bake is None or bake.step is not BakeStep.SNAPSHOTTING or bake.snapshot_id != snapshot_id:
        return state
    return replace(state, bake=bake.at(BakeStep.PUBLISHING, now, snapshot_id))


def published(state: SnapshotState, snapshot_id: str, keep: int, now: float,
              fsr_zones: Sequence[str] = ()) -> tuple[SnapshotState, list[str]]:
    """The node class points at `snapshot_id`, its Fast Snapshot Restore enabled in `fsr_zones`: it becomes
    current. The clean-up it leaves is recorded as owed: the snapshots beyond `keep` deleted (returned too),
    and the FSR of the kept earlier ones disabled in the zones recorded for each (only the snapshot nodes
    launch from keeps it)."""
    bake = state.bake
    if bake is None or bake.step is not BakeStep.PUBLISHING or bake.snapshot_id != snapshot_id:
        return state, []
    made = BakedSnapshot(snapshot_id, dict(bake.pulled), now, bake.id, bake.bytes_pulled, tuple(fsr_zones))
    kept = (made, *(s for s in state.snapshots if s.id != snapshot_id))
    done = bake.at(BakeStep.SUCCEEDED, now, finished_at=now)
    beyond = [s.id for s in kept[keep:]]
    fsr_off = {s.id: s.fsr_zones for s in kept[1:keep] if s.fsr_zones}
    return owe_clean_up(replace(state, bake=done, snapshots=kept[:keep]), delete=beyond, fsr_off=fsr_off), beyond


def with_fsr_declared(state: SnapshotState, zones: Sequence[str]) -> SnapshotState:
    """The Fast Snapshot Restore the spec declares now (`zones`; none: off): the current snapshot's zones it
    no longer names are owed disabling, and a zone named again before that is done no longer is. A zone
    added is enabled from the next snapshot. A snapshot recorded before zones were is taken as enabled
    where the spec says if current (its publish enabled the spec's), else nowhere (the next publish
    disabled it). A deleted WarmSnapshot's state is left as `deleted` made it."""
    if state.deleted_at is not None:
        return state
    snapshots = tuple(replace(s, fsr_zones=tuple(zones) if i == 0 else ()) if s.fsr_zones is None else s
                      for i, s in enumerate(state.snapshots))
    off = dict(state.clean_up.fsr_off)
    if snapshots:
        current = snapshots[0]
        undeclared = tuple(z for z in current.fsr_zones or () if z not in zones)
        if undeclared:
            off[current.id] = undeclared
        else:
            off.pop(current.id, None)
    after = replace(state, snapshots=snapshots, clean_up=replace(state.clean_up, fsr_off=off))
    return state if after == state else after


def deleted(state: SnapshotState, now: float) -> SnapshotState:
    """Its WarmSnapshot is deleted: a running bake fails (its snapshot deleted; `_end` terminates its
    builder), and Fast Snapshot Restore is owed disabling on every snapshot, in the zones recorded for it.
    The snapshots are kept: the node class may still boot from them, and a node booting from a deleted
    snapshot fails."""
    if state.deleted_at is not None:
        return state
    bake = state.bake
    if bake is not None and bake.active:
        state = fail(state, bake.id, "its WarmSnapshot was deleted", now)
        state = owe_clean_up(state, delete=[bake.snapshot_id] if bake.snapshot_id else [])
    state = owe_clean_up(state, fsr_off={s.id: s.fsr_zones for s in state.snapshots if s.fsr_zones})
    return replace(state, deleted_at=now)


def undeleted(state: SnapshotState) -> SnapshotState:
    """A WarmSnapshot of that name applied again before its record went: it bakes again (the FSR disabled
    meanwhile is enabled on its next snapshot)."""
    return state if state.deleted_at is None else replace(state, deleted_at=None)


def owe_clean_up(state: SnapshotState, *, delete: Iterable[str] = (),
                 fsr_off: Mapping[str, Sequence[str]] | None = None) -> SnapshotState:
    """Records clean-up owed, added to what is owed already. A snapshot kept (the current one first) is
    never deleted; one to delete needs no FSR disabled (EBS disables it with the snapshot). Which of the
    current one's zones to disable is the caller's to say (`with_fsr_declared`, `deleted`)."""
    kept = {s.id for s in state.snapshots}
    owed = state.clean_up
    deletes = tuple(s for s in dict.fromkeys((*owed.delete, *delete)) if s not in kept)
    off = dict(owed.fsr_off)
    for snapshot_id, zones in (fsr_off or {}).items():
        off[snapshot_id] = tuple(dict.fromkeys((*off.get(snapshot_id, ()), *zones)))
    after = replace(owed, fsr_off={s: z for s, z in off.items() if z and s not in deletes}, delete=deletes)
    return state if after == owed else replace(state, clean_up=after)


def kept_booted(state: SnapshotState, snapshot_id: str, zones: Sequence[str]) -> SnapshotState:
    """The node class boots from `snapshot_id`, owed deletion because the warm snapshot was deleted while a
    publish had pointed the class at it: it is kept, as every snapshot of a deleted warm snapshot is, and
    the Fast Snapshot Restore that publish enabled (in `zones`) is owed off instead."""
    owed = state.clean_up
    state = replace(state, clean_up=replace(owed, delete=tuple(s for s in owed.delete if s != snapshot_id)))
    return owe_clean_up(state, fsr_off={snapshot_id: zones}) if zones else state


def cleaned(state: SnapshotState, disabled: Iterable[str], deleted: Iterable[str], error: str) -> SnapshotState:
    """What a clean-up attempt did: the snapshots done leave what is owed (those whose FSR was disabled no
    longer have it in those zones); `error` says why the rest was not ("": nothing failed)."""
    off, gone, owed = set(disabled), set(deleted), state.clean_up
    after = CleanUp({s: z for s, z in owed.fsr_off.items() if s not in off},
                    tuple(s for s in owed.delete if s not in gone), error)
    snapshots = tuple(replace(s, fsr_zones=tuple(z for z in s.fsr_zones if z not in owed.fsr_off[s.id]))
                      if s.id in off and s.id in owed.fsr_off and s.fsr_zones else s for s in state.snapshots)
    if after == owed and snapshots == state.snapshots:
        return state
    return replace(state, clean_up=after, snapshots=snapshots)


def fail(state: SnapshotState, bake_id: str, reason: str, now: float) -> SnapshotState:
    """The bake ends without a new snapshot; the node class stays on the current one."""
    bake = state.bake
    if bake is None or bake.id != bake_id or not bake.active:
        return state
    return replace(state, bake=bake.at(BakeStep.FAILED, now, reason, reason=reason, finished_at=now))


def expired(state: SnapshotState, now: float, budget_seconds: float) -> bool:
    """Whether the running bake's builder has outlived its time budget (the sweep then fails it)."""
    bake = state.bake
    return bake is not None and bake.active and now - bake.started_at > budget_seconds


def next_bake_owed(state: SnapshotState) -> bool:
    """Whether a new bake should start now: none runs, and the image set is not what the current snapshot
    holds, and the last bake did not already fail on this very set (the next push tries again)."""
    bake = state.bake
    if state.deleted_at is not None or (bake is not None and bake.active):
        return False
    if bake is not None and bake.step is BakeStep.FAILED and bake.images == state.images:
        return False
    return state.stale


@dataclass(frozen=True)
class BakeCost:
    """What the warm snapshot costs: its last bake's builder, the snapshots kept, and the Fast Snapshot
    Restore still enabled (until the clean-up disables it), each zone since its snapshot's publish."""

    builder_minutes: float
    gb_stored: float
    fsr_hours: float

    def dollars(self, snapshot_gb_month: float, fsr_az_hour: float) -> tuple[float, float]:
        """(storage a month, FSR so far) at the given prices; the builder's depends on its instance type."""
        return round(self.gb_stored * snapshot_gb_month, 2), round(self.fsr_hours * fsr_az_hour, 2)


def cost(state: SnapshotState, now: float) -> BakeCost:
    fsr_seconds = sum(len(s.fsr_zones or ()) * max(0.0, now - s.created_at) for s in state.snapshots)
    return BakeCost(
        builder_minutes=round(state.bake.builder_seconds(now) / 60, 1) if state.bake else 0.0,
        gb_stored=round(sum(s.stored_bytes for s in state.snapshots) / 1e9, 3),
        fsr_hours=round(fsr_seconds / 3600, 2))
