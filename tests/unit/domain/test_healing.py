"""The garbage-collection heal rule: which gone images are pulled again, which nodes are only marked."""

from __future__ import annotations

import pytest

from prewarm.domain.healing import HealAction, heal_decision
from prewarm.domain.messages import NodePhase
from prewarm.domain.status import NodeTaskRecord, ReportKey, accepts

SEEN = 1795500000.0  # 2026-11-24T06:00:00Z


def succeeded(round_: int = 2) -> NodeTaskRecord:
    return NodeTaskRecord(node="n1", round=round_, phase=NodePhase.SUCCEEDED, attempt=1, seq=3, version=4)


def decide(task: NodeTaskRecord | None, *, never: bool = True, job_round: int = 2, gone_round: int = 2,
           disk: str = "") -> tuple[HealAction, str, str]:
    heal = heal_decision(task, never_running=never, job_round=job_round, gone_round=gone_round, disk=disk,
                         seen_at=SEEN)
    return heal.action, heal.reason, str(heal.fields.get("message", ""))


def test_a_succeeded_node_of_a_running_never_job_pulls_again_and_says_so() -> None:
    action, _, message = decide(succeeded())

    assert action is HealAction.REPULL
    assert message == ("image removed from the node at 2026-11-24T06:00:00Z (image garbage collection?); "
                       "pulling it again")


def test_with_no_room_the_node_is_marked_with_the_disk_guards_words_and_not_pulled() -> None:
    action, reason, message = decide(succeeded(), disk="disk guard: imagefs 91% used, threshold 85%")

    assert action is HealAction.MARK and reason.startswith("disk guard")
    assert message.endswith("; not pulled again: disk guard: imagefs 91% used, threshold 85%")


@pytest.mark.parametrize(("task", "kwargs", "why"), [
    (succeeded(), {"never": False}, "not a running Never job"),
    (succeeded(), {"gone_round": 1}, "round 1 is over: round 2 pulls every node again"),
    (None, {}, "not in the job any more"),
    (NodeTaskRecord(node="n1", round=2, phase=NodePhase.FAILED), {}, "Failed in round 2"),
    (NodeTaskRecord(node="n1", round=2, phase=NodePhase.PULLING), {}, "Pulling in round 2"),
])
def test_nothing_happens_where_nothing_holds_the_image(task: NodeTaskRecord | None, kwargs: dict[str, object],
                                                       why: str) -> None:
    action, reason, message = decide(task, **kwargs)  # type: ignore[arg-type]

    assert action is HealAction.IGNORE and why in reason and message == ""


def test_a_later_attempts_succeeded_replaces_the_stored_one_a_duplicate_does_not() -> None:
    stored = ReportKey(round=2, attempt=1, seq=3)
    ok = NodePhase.SUCCEEDED

    assert accepts(ok, stored, ok, ReportKey(2, 2, 5))  # pulled again after the image was removed
    assert not accepts(ok, stored, ok, ReportKey(2, 1, 3))  # the same report delivered twice
    assert not accepts(ok, stored, ok, ReportKey(2, 1, 9))  # same attempt: a duplicate, not a new pull
    assert not accepts(ok, stored, NodePhase.PULLING, ReportKey(2, 2, 4))  # never backwards
