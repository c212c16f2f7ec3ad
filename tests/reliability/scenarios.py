"""The control plane's use cases as scenarios for the crash tests, and how to compare their end states.

Each scenario sets up its state, calls `watch()` where its subject starts (crash points are counted
from there), and returns the keys of the jobs to compare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prewarm.domain.liveness import AGENT_SILENCE_SECONDS, NO_AGENT_GRACE_SECONDS
from prewarm.domain.messages import Hello
from prewarm.services.schedules import SweepSettings, sweep
from tests.reliability.faults import Fault, FaultPlan
from tests.reliability.invariants import invariant_problems
from tests.reliability.simulation import Driver, Plane, moto_aws
from tests.support.cluster_directory import clusters_of
from tests.support.manifests import IMAGE, job_doc
from tests.support.resources import API, FakeResources

KEY = "default/warm"
Scenario = Callable[[Driver], list[str]]


def always_job_with_a_failing_node(d: Driver) -> list[str]:
    """apply → plan (2 of 4 dispatched) → reports, each freeing a slot → completion with one failed node."""
    d.plane.add_nodes("n0", "n1", "n2", "n3", pool="gpu")
    d.agents.outcomes["n1"] = "Failed"
    d.watch()
    d.apply(job_doc(parallelism=2, selector={"matchLabels": {"pool": "gpu"}}))
    d.work()
    return [KEY]


def deadline_passes_with_nodes_in_flight(d: Driver) -> list[str]:
    """sweep past activeDeadlineSeconds: in-flight nodes cancelled (with messages), waiting ones too."""
    d.plane.add_nodes("n0", "n1", "n2", "n3")
    d.agents.outcomes.update(n1="Silent", n2="Absent")
    d.apply(job_doc(parallelism=2, pullPolicy={"timeoutSeconds": 3000},
                    completionPolicy={"type": "Always", "activeDeadlineSeconds": 3600}))
    # No sweep before the deadline's: one would fail the silent node (its agent sends no progress).
    d.work(recover=False)
    d.plane.clock.advance(3700)
    d.watch()
    d.sweep()
    d.work(recover=False)
    return [KEY]


def delete_with_nodes_in_flight(d: Driver) -> list[str]:
    """delete: marked Deleting, cancels to the in-flight nodes, then the job and its node items go."""
    d.plane.add_nodes("n0", "n1", "n2")
    d.agents.outcomes.update(n0="Silent", n1="Absent")
    d.apply(job_doc(parallelism=2))
    d.agents_round()
    d.watch()
    d.delete(KEY)
    d.work(recover=False)
    return [KEY]


def selector_edit_replans_the_round(d: Driver) -> list[str]:
    """A selector edit re-plans the round: a finished node leaves, an in-flight one is cancelled, one joins."""
    d.plane.add_nodes("n0", "n1", "n2", "n3")
    d.agents.outcomes["n1"] = "Silent"
    d.apply(job_doc(parallelism=2, selector={"names": ["n0", "n1", "n2"]}))
    d.agents_round()
    d.watch()
    d.apply(job_doc(parallelism=2, selector={"names": ["n2", "n3"]}))
    d.work()
    return [KEY]


def new_image_starts_a_new_round(d: Driver) -> list[str]:
    """A new image: round 1 on every node, the in-flight pull of round 0 cancelled as superseded."""
    d.plane.add_nodes("n0", "n1")
    d.agents.outcomes[("n1", 0)] = "Silent"
    d.apply(job_doc(parallelism=2))
    d.agents_round()
    d.watch()
    d.apply(job_doc(parallelism=2, image=IMAGE.replace("a" * 64, "b" * 64)))
    d.work()
    return [KEY]


def new_node_hello_joins_a_never_job(d: Driver) -> list[str]:
    """A new node's hello registers it and adds it to the running Never job at once."""
    d.plane.add_nodes("n0", "n1", pool="gpu")
    d.apply(job_doc(parallelism=1, completionPolicy={"type": "Never"}, selector={"matchLabels": {"pool": "gpu"}}))
    d.work()
    d.plane.add_nodes("n2", pool="gpu")
    d.watch()
    d.hello(Hello(node="n2", labels={"pool": "gpu"}, architecture="amd64"))
    d.work()
    return [KEY]


def daily_round_of_a_never_job(d: Driver) -> list[str]:
    """The daily re-pull: one new round, planned on every node, pulled again."""
    d.plane.add_nodes("n0", "n1")
    d.apply(job_doc(parallelism=1, completionPolicy={"type": "Never"}))
    d.work()
    d.watch()
    d.repull()
    d.work()
    return [KEY]


def silent_and_agentless_nodes_fail_within_their_bounds(d: Driver) -> list[str]:
    """sweep: a node whose agent fell silent while Pulling and a node with no agent are failed with their
    reasons two minutes on, though each pull may take an hour; the job completes."""
    d.plane.add_nodes("n0", "n1", "n2")
    for node in ("n0", "n1"):
        d.hello(Hello(node=node))
    d.agents.outcomes.update(n1="Silent", n2="Absent")
    d.apply(job_doc(parallelism=3, pullPolicy={"timeoutSeconds": 3600}))
    d.work(recover=False)
    d.plane.clock.advance(max(AGENT_SILENCE_SECONDS, NO_AGENT_GRACE_SECONDS) + 1)
    d.watch()
    p = d.plane
    d.deliver(lambda: sweep(p.store, p.queues, clusters_of(p.store), now=p.clock(),
                            config=SweepSettings(prefix=p.real_queues.prefix,
                                                 no_agent_grace_seconds=NO_AGENT_GRACE_SECONDS)))
    d.work(recover=False)
    return [KEY]


def resource_applied_edited_and_deleted(d: Driver) -> list[str]:
    """sync_resources: a resource becomes a job, its edit re-plans it, its deletion cancels and removes it."""
    d.plane.add_nodes("n0", "n1", "n2")
    d.agents.outcomes.update(n2="Silent")
    api = FakeResources()
    api.put("ImagePullJob", "warm", {"image": IMAGE, "parallelism": 2})
    d.watch()
    d.sync(api)
    d.work()
    d.sync(api)
    api.put("ImagePullJob", "warm", {"image": IMAGE, "parallelism": 3})
    d.sync(api)
    d.work()
    api.delete_object(API, "imagepulljobs", "warm", "default")
    d.sync(api)
    d.finish_deletion(KEY)
    return [KEY]


SCENARIOS: dict[str, Scenario] = {s.__name__: s for s in (
    always_job_with_a_failing_node, deadline_passes_with_nodes_in_flight, delete_with_nodes_in_flight,
    selector_edit_replans_the_round, new_image_starts_a_new_round, new_node_hello_joins_a_never_job,
    daily_round_of_a_never_job, silent_and_agentless_nodes_fail_within_their_bounds,
    resource_applied_edited_and_deleted,
)}


def run(ddb: Any, sqs: Any, scenario: Scenario, name: str, plan: FaultPlan) -> tuple[dict[str, Any], list[str]]:
    plane = Plane(ddb, sqs, name, plan=plan)
    try:
        driver = Driver(plane)
        keys = scenario(driver)
        return driver.outcome(*keys), [p for k in keys for p in invariant_problems(plane.real_store, k)]
    finally:
        plane.close()


def differences(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    for key, state in expected["jobs"].items():
        other = got["jobs"][key]
        if state is None or other is None:
            if state != other:
                out.append(f"{key}: {'deleted' if state is None else 'present'} without the fault, "
                           f"{'deleted' if other is None else 'present'} with it")
            continue
        out += [f"{key}.{name}: {state[name]!r} != {other[name]!r}" for name in state if state[name] != other[name]]
    if expected["delivered"] != got["delivered"]:
        missing = sorted(set(expected["delivered"]) - set(got["delivered"]))
        extra = sorted(set(got["delivered"]) - set(expected["delivered"]))
        out.append(f"messages to nodes: missing {missing}, extra {extra}")
    return out


def crash_runs(scenario: str, faults: list[Fault] | None = None) -> tuple[list[Fault], dict[Fault, list[str]]]:
    """Runs `scenario` without a fault, then once per fault (every crash point it has when None).

    Returns the faults tried and, for each run that did not end as the fault-free run did (or broke
    the invariant), what differed.
    """
    with moto_aws() as (ddb, sqs):
        recorder = FaultPlan()
        expected, problems = run(ddb, sqs, SCENARIOS[scenario], "base", recorder)
        assert not problems, problems
        faults = recorder.faults() if faults is None else faults
        failures: dict[Fault, list[str]] = {}
        for i, fault in enumerate(faults):
            plan = FaultPlan(fault)
            got, problems = run(ddb, sqs, SCENARIOS[scenario], str(i), plan)
            assert plan.fired, f"{fault} never happened: the scenario is not deterministic"
            if found := problems + differences(expected, got):
                failures[fault] = found
    return faults, failures


def describe(failures: dict[Fault, list[str]]) -> str:
    return "\n".join(f"{fault}:\n  " + "\n  ".join(found) for fault, found in failures.items())
