"""A dead agent or a missing one holds a job for minutes, not for timeoutSeconds + 300 s: the sweep fails
such nodes with their reasons, and a crash at any write of that sweep converges on the next delivery."""

from __future__ import annotations

from prewarm.domain.liveness import AGENT_NOT_REPORTING, NO_AGENT_ON_NODE
from tests.reliability.invariants import invariant_problems
from tests.reliability.scenarios import KEY, SCENARIOS, crash_runs, describe
from tests.reliability.simulation import Driver, Plane, moto_aws

SCENARIO = "silent_and_agentless_nodes_fail_within_their_bounds"


def test_silent_and_agentless_nodes_are_failed_with_their_reasons_and_the_job_completes() -> None:
    with moto_aws() as (ddb, sqs):
        plane = Plane(ddb, sqs, "liveness")
        try:
            SCENARIOS[SCENARIO](Driver(plane))
            store = plane.real_store
            record = store.get_job(KEY)
            assert record is not None and record.state == "Completed"
            messages = {t.node: (t.phase.value, t.message) for t in store.get_tasks(KEY)}
            assert messages == {"n0": ("Succeeded", ""), "n1": ("Failed", AGENT_NOT_REPORTING),
                                "n2": ("Failed", NO_AGENT_ON_NODE)}
            assert invariant_problems(store, KEY) == []
        finally:
            plane.close()


def test_a_crash_in_that_sweep_converges_on_redelivery() -> None:
    faults, failures = crash_runs(SCENARIO)
    assert faults
    assert not failures, f"{len(failures)} of {len(faults)} crash points diverge:\n{describe(failures)}"
