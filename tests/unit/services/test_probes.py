"""A parked job's cluster is probed until it answers (`services/probes.py`, issue 35): its park starts one
probe chain per cluster (a `ClusterProbe` the control plane sends itself with SQS's delay); a probe that
finds the cluster answering asks its parked jobs to plan again at once, without waiting for the sweep; one
that finds it down sends the next; a duplicate or a stray probe does nothing; a chain lost is started again
by the sweep."""

from __future__ import annotations

from typing import Any

from prewarm.domain.clusters import PROBE_LOST_SECONDS, PROBE_SECONDS, RegisteredCluster
from prewarm.domain.jobs import job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.messages import ClusterProbe, StatusReport
from prewarm.services.jobs import apply_manifest, request_deletion
from prewarm.services.ports import ClusterUnavailableError
from prewarm.services.probes import Probing, probe
from prewarm.services.schedules import SweepSettings, sweep
from prewarm.services.status_batches import record_status
from prewarm.services.stream import plan
from tests.support.cluster import FakeCluster, make_node
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_doc
from tests.support.memory_queues import MemoryProbeQueue

CLUSTER = "prod-eu"


class Down(FakeCluster):
    """prod-eu's API refusing connections, as the bounded client says it."""

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise ClusterUnavailableError("cluster prod-eu cannot be reached: connection refused")

    list_nodes = get_version = _refused


def parked(plane: ControlPlane, status: MemoryProbeQueue, *names: str) -> list[JobKey]:
    """Jobs of prod-eu applied and planned while prod-eu is down: each parked."""
    if plane.store.get_cluster(CLUSTER) is None:
        plane.store.put_cluster(RegisteredCluster(CLUSTER, endpoint="https://prod.example"))
    keys = []
    for name in names:
        apply_manifest(plane.store, job_doc(name), now=plane.now(), cluster=CLUSTER)
        key = job_key("default", name, CLUSTER)
        plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: Down()}), key, now=plane.now(),
             probes=status)
        record = plane.store.get_job(key)
        assert record is not None and record.is_parked
        keys.append(key)
    return keys


def probing(plane: ControlPlane, status: MemoryProbeQueue, api: FakeCluster) -> Probing:
    return Probing(lambda: status, clusters_of(plane.store, None, {CLUSTER: api}))


def test_a_parked_job_is_planned_again_by_the_probe_once_its_cluster_answers_without_a_sweep(
        plane: ControlPlane) -> None:
    # Given a job of prod-eu parked because prod-eu cannot be reached
    status = MemoryProbeQueue()
    (key,) = parked(plane, status, "warm")
    # Then its park sent one probe of prod-eu, delayed by the probe's period
    [(first, delay)] = status.probes
    assert (first.cluster, delay) == (CLUSTER, PROBE_SECONDS)
    # When the probe comes once prod-eu answers again (no sweep runs)
    up = FakeCluster(nodes=[make_node("p-1")])
    outcome = probe(plane.store, probing(plane, status, up), first, now=plane.now())
    # Then the job is asked to plan again at once, the chain ends, and prod-eu is recorded reachable
    assert (outcome.action, outcome.replanned) == ("answered", [key])
    assert len(status.probes) == 1
    asked = plane.store.get_job(key)
    assert asked is not None and not asked.is_parked and asked.asked_again_after_park
    cluster = plane.store.get_cluster(CLUSTER)
    assert cluster is not None and cluster.reachable is True
    # and the table stream's plan of it selects prod-eu's node
    result = plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: up}), key, now=plane.now(),
                  probes=status)
    assert result.selected == 1
    planned = plane.store.get_job(key)
    assert planned is not None and planned.is_planned


def test_a_second_parked_job_of_the_same_cluster_starts_no_second_chain(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    # When two jobs of prod-eu are parked one after the other
    keys = parked(plane, status, "one", "two")
    # Then one probe chain runs, not two
    assert [p.cluster for p, _ in status.probes] == [CLUSTER]
    # and its probe, once prod-eu answers, asks both to plan again
    outcome = probe(plane.store, probing(plane, status, FakeCluster()), status.probes[0][0], now=plane.now())
    assert sorted(outcome.replanned) == sorted(keys)


class Counting(FakeCluster):
    """prod-eu's API, counting the calls a plan makes to it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = 0

    def list_nodes(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        self.calls += 1
        return super().list_nodes(*args, **kwargs)


def test_while_its_chain_runs_a_plan_parks_without_calling_the_cluster_and_the_probe_plans_it(
        plane: ControlPlane) -> None:
    # Given prod-eu's probe chain running, started by a job parked a moment ago (a hung API costs each
    # function environment a timeout: their circuits are their own, the chain is the stack's)
    status = MemoryProbeQueue()
    parked(plane, status, "first")
    # When a second job of prod-eu is planned, by another environment
    apply_manifest(plane.store, job_doc("second"), now=plane.now(), cluster=CLUSTER)
    key = job_key("default", "second", CLUSTER)
    api = Counting(nodes=[make_node("p-1")])
    result = plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: api}), key, now=plane.now(),
                  probes=status)
    # Then it is parked without a call to prod-eu, and says why; no second chain starts
    assert (api.calls, result.action) == (0, f"parked: cluster {CLUSTER} cannot be read: it did not answer its "
                                             f"last probe (probed every {PROBE_SECONDS} s)")
    assert len(status.probes) == 1
    # and the chain's probe, once prod-eu answers, asks for its plan, which calls prod-eu
    outcome = probe(plane.store, probing(plane, status, api), status.probes[0][0], now=plane.now())
    assert key in outcome.replanned
    replanned = plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: api}), key, now=plane.now(),
                     probes=status, asked_again=True)
    assert (replanned.selected, api.calls) == (1, 1)


def test_a_lost_chain_no_longer_keeps_plans_from_calling_the_cluster(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    parked(plane, status, "first")
    # When the chain's probe is long overdue (lost), a new job's plan calls prod-eu again
    late = plane.now() + PROBE_SECONDS + PROBE_LOST_SECONDS + 1
    apply_manifest(plane.store, job_doc("second"), now=late, cluster=CLUSTER)
    api = Counting(nodes=[make_node("p-1")])
    result = plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: api}),
                  job_key("default", "second", CLUSTER), now=late, probes=status)
    assert (api.calls, result.selected) == (1, 1)


def test_a_probe_for_a_cluster_still_down_sends_itself_again_and_records_why(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    (key,) = parked(plane, status, "warm")
    # When the probe comes while prod-eu is still down
    outcome = probe(plane.store, probing(plane, status, Down()), status.probes[0][0], now=plane.now())
    # Then the next probe goes out with the same delay, under a token of its own, and the job stays parked
    assert outcome.action == "down" and outcome.reason == "cluster prod-eu cannot be reached: connection refused"
    assert [(p.cluster, d) for p, d in status.probes] == [(CLUSTER, PROBE_SECONDS)] * 2
    assert status.probes[1][0].chain != status.probes[0][0].chain
    record = plane.store.get_job(key)
    assert record is not None and record.is_parked
    cluster = plane.store.get_cluster(CLUSTER)
    assert cluster is not None and (cluster.reachable, cluster.reason) == (False, outcome.reason)
    # and that next probe, once prod-eu answers, asks for the plan
    again = probe(plane.store, probing(plane, status, FakeCluster()), status.probes[1][0], now=plane.now())
    assert again.replanned == [key]


def test_a_duplicate_or_stray_probe_does_nothing(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    parked(plane, status, "warm")
    first = status.probes[0][0]
    probe(plane.store, probing(plane, status, Down()), first, now=plane.now())
    # When the same probe is delivered again (SQS delivers at least once), or one names a chain of its own
    for message in (first, ClusterProbe(cluster=CLUSTER, chain="forged")):
        outcome = probe(plane.store, probing(plane, status, FakeCluster()), message, now=plane.now())
        # Then it is dropped: no plan asked, no probe sent, the chain's own probe still counts
        assert (outcome.action, outcome.replanned) == ("dropped", [])
    assert len(status.probes) == 2
    assert probe(plane.store, probing(plane, status, FakeCluster()), status.probes[1][0],
                 now=plane.now()).action == "answered"


def test_the_chain_ends_with_the_last_parked_job_and_a_later_park_starts_another(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    parked(plane, status, "warm")
    # When the parked job is deleted before its cluster answers
    request_deletion(plane.store, "default", "warm", now=plane.now(), cluster=CLUSTER)
    plane.store.delete_job(job_key("default", "warm", CLUSTER))
    outcome = probe(plane.store, probing(plane, status, Down()), status.probes[0][0], now=plane.now())
    # Then the chain ends without a call, and the next job parked starts a new one
    assert outcome.action == "ended" and len(status.probes) == 1
    parked(plane, status, "next")
    assert len(status.probes) == 2


def test_a_refused_send_leaves_the_probe_to_come_again_as_the_chains(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    (key,) = parked(plane, status, "warm")
    first = status.probes[0][0]
    # When the next probe cannot be sent
    status.refuse = True
    result = record_status(plane.store, plane.queues, clusters_of(plane.store, None), [("m1", first)],
                           now=plane.now(), probing=probing(plane, status, Down()))
    # Then this one is handed back, and, delivered again, it is still the chain's
    assert result.retry_ids == ["m1"]
    status.refuse = False
    outcome = probe(plane.store, probing(plane, status, FakeCluster()), first, now=plane.now())
    assert outcome.replanned == [key]


def test_a_lost_chain_is_started_again_by_the_sweep_while_the_cluster_is_down(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    parked(plane, status, "warm")
    config = SweepSettings(prefix=plane.queues.prefix)
    down = clusters_of(plane.store, None, {CLUSTER: Down()})
    # When the sweep runs while the chain's probe is due: nothing is started
    assert sweep(plane.store, plane.queues, down, now=plane.now(), config=config, probes=status).probes_started == []
    # and when its probe is long overdue (lost), the sweep starts a chain again
    late = plane.now() + PROBE_SECONDS + PROBE_LOST_SECONDS
    assert sweep(plane.store, plane.queues, down, now=late, config=config, probes=status).probes_started == [CLUSTER]
    assert len(status.probes) == 2
    # and the old chain's probe, if it comes after all, does nothing
    assert probe(plane.store, probing(plane, status, FakeCluster()), status.probes[0][0],
                 now=late).action == "dropped"


def test_a_probe_in_a_status_batch_runs_beside_the_agents_messages(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    (key,) = parked(plane, status, "warm")
    report = StatusReport(job="default/other", job_uid="u", round=0, node="n1", phase="Pulling")
    result = record_status(plane.store, plane.queues, clusters_of(plane.store, None),
                           [("m1", status.probes[0][0]), ("m2", report)], now=plane.now(),
                           probing=probing(plane, status, FakeCluster()))
    assert [(p.action, p.replanned) for p in result.probes] == [("answered", [key])]
    assert [r.applied for _, r in result.reports] == [False]


def test_a_job_parked_while_the_probe_calls_the_cluster_is_planned_with_the_others(plane: ControlPlane) -> None:
    # Given prod-eu's chain running for a parked job
    status = MemoryProbeQueue()
    (first,) = parked(plane, status, "first")

    class Answering(FakeCluster):
        """prod-eu answering, while a second job is applied and planned (parked: the chain runs)."""

        def get_version(self) -> dict[str, str]:
            apply_manifest(plane.store, job_doc("second"), now=plane.now(), cluster=CLUSTER)
            plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: Down()}),
                 job_key("default", "second", CLUSTER), now=plane.now(), probes=status)
            return {"gitVersion": "v1.33.0"}

    # When the chain's probe finds prod-eu answering
    outcome = probe(plane.store, probing(plane, status, Answering()), status.probes[0][0], now=plane.now())
    # Then both are asked to plan again: the second's park found the chain running and started none
    assert outcome.action == "answered"
    assert sorted(outcome.replanned) == sorted([first, job_key("default", "second", CLUSTER)])


def test_a_job_parked_as_the_chain_ends_starts_a_new_chain(plane: ControlPlane) -> None:
    status = MemoryProbeQueue()
    parked(plane, status, "first")
    request_deletion(plane.store, "default", "first", now=plane.now(), cluster=CLUSTER)

    class Listing:
        """The table, a job parked on prod-eu between the probe's read and the chain's end."""

        def __init__(self) -> None:
            self.reads = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(plane.store, name)

        def list_running_jobs(self, cluster: str = "") -> Any:
            self.reads += 1
            if self.reads == 2:
                apply_manifest(plane.store, job_doc("late"), now=plane.now(), cluster=CLUSTER)
                plan(plane.store, plane.queues, clusters_of(plane.store, None, {CLUSTER: Down()}),
                     job_key("default", "late", CLUSTER), now=plane.now(), probes=status)
            return plane.store.list_running_jobs(cluster)

    store = Listing()  # the probe's first read finds no job parked; the park lands before its second
    outcome = probe(store, probing(plane, status, Down()), status.probes[0][0], now=plane.now())  # type: ignore[arg-type]
    assert outcome.action == "restarted"
    assert len(status.probes) == 2 and status.probes[1][0].chain != status.probes[0][0].chain
