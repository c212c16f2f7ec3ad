"""A crash at every write boundary of every use case, then the same input delivered again.

Each scenario runs once without a fault, counting its writes (store and queue calls). It then runs
again once per crash point: before a write (nothing of it happened) and after the last write of a
delivery (it happened, but the caller never learnt). The crashed input is redelivered as its event
source would, and the run must end exactly where the fault-free run ended: same job states,
counters, node items and the same messages received by the nodes; and the job invariant holds.
"""

from __future__ import annotations

import pytest

from tests.reliability.scenarios import SCENARIOS, crash_runs, describe

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_crash_at_any_write_converges_on_redelivery(scenario: str) -> None:
    # Given the scenario's end state without a fault, and every crash point it crosses
    # When each crash point crashes in turn and the crashed input is delivered again
    faults, failures = crash_runs(scenario)
    # Then every run ends where the fault-free run did, with the invariant intact
    assert len(faults) >= 4
    assert not failures, f"{len(failures)} of {len(faults)} crash points diverge:\n{describe(failures)}"
