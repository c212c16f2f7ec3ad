"""A parked job's cluster probed until it answers, and the one rule by which parked jobs are planned again.

A job whose cluster cannot be read is parked (`services.stream.park`). Its park starts the cluster's probe
chain, unless one runs: a `ClusterProbe` the control plane sends itself on the probe queue with SQS's
delay (`PROBE_SECONDS`). The status function GETs the cluster's `/version` through its bounded client:
when the cluster answers, its parked jobs are asked to plan again at once (`replan`) and the chain ends;
when not, the next probe goes out. One chain per cluster: each probe carries a token, and only the token on
the cluster's item counts (`ProbeChains`), so a duplicate delivery or a stray message does nothing. A chain
lost (a failed send, a message dead-lettered) costs at most the sweep's minute: the sweep re-plans parked
jobs of a cluster that answers, as it always did, and starts a chain again for one that does not.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prewarm.domain.clusters import DEFAULT_CLUSTER, PROBE_LOST_SECONDS, PROBE_SECONDS, probe_delay, shown
from prewarm.domain.job import StoredJob
from prewarm.domain.messages import ClusterProbe
from prewarm.services.clusters import ClusterRun, record_health
from prewarm.services.ports import (
    ClusterDirectory,
    ClusterError,
    ClusterProbes,
    JobItems,
    NodeQueueError,
    ProbeChains,
    ProbeItems,
    StoreConflictError,
    StoreError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probing:
    """What probing needs besides the store: where a probe is sent (`probes()`, asked for only when one is),
    and the clusters as a probe calls them (through an open circuit at its first pace:
    `prewarm.domain.clusters.ClusterCircuit.allows_probe`)."""

    probes: Callable[[], ClusterProbes]
    clusters: ClusterDirectory


@dataclass
class ProbeOutcome:
    """What one probe did: `answered` (its cluster's parked jobs asked to plan again), `down` (the next probe
    sent), `ended` (no job parked on the cluster any more), `restarted` (a job parked as it ended: a new
    chain started), or `dropped` (not the chain's probe)."""

    cluster: str
    action: str
    replanned: list[str] = field(default_factory=list)
    reason: str = ""


def replan(store: JobItems, records: Iterable[StoredJob]) -> list[str]:
    """Asks each job to plan again: the same spec at its next generation, which the table stream plans. A job
    changed meanwhile (a new spec, deleted) is left to whatever changed it. Returns the keys asked."""
    asked: list[str] = []
    for record in records:
        with contextlib.suppress(StoreConflictError):
            store.replace_job_spec(record.replanned(), expected_hash=record.spec_hash)
            asked.append(record.key)
    return asked


def _parked(store: ProbeItems, clusters: ClusterDirectory, cluster: str) -> list[StoredJob]:
    return [r for r in store.list_running_jobs(cluster) if r.is_parked] if clusters.serves(cluster) else []


def start_probing(store: ProbeChains, probes: ClusterProbes, cluster: str, *, own_name: str, now: float) -> bool:
    """Starts `cluster`'s probe chain (its first probe in `PROBE_SECONDS`) unless one runs; whether it did.
    A send refused ends the chain again (the next park or sweep starts another)."""
    name, token = shown(cluster, own_name), uuid.uuid4().hex
    if not store.start_probe(name, token, due=now + PROBE_SECONDS, lost_before=now - PROBE_LOST_SECONDS,
                             own=cluster == DEFAULT_CLUSTER):
        return False
    try:
        probes.send_probe(ClusterProbe(cluster=cluster, chain=token), delay=probe_delay())
    except NodeQueueError as e:
        log.warning("cluster %s is not probed: %s (the sweep plans its parked jobs once it answers)", name, e)
        with contextlib.suppress(StoreError):
            store.pass_probe(name, token, to=None)
        return False
    log.info("cluster %s probed every %d s until it answers", name, PROBE_SECONDS)
    return True


def probe(store: ProbeItems, probing: Probing, message: ClusterProbe, *, now: float) -> ProbeOutcome:
    """One probe of a chain: its cluster's parked jobs asked to plan again if the cluster answers, or the
    next probe sent if not; the cluster's health recorded either way. `NodeQueueError` when the next probe
    could not be sent (the chain is left to this one, which comes again); `StoreError` from the table."""
    clusters, cluster = probing.clusters, message.cluster
    name = shown(cluster, clusters.own_name)
    parked = _parked(store, clusters, cluster)
    if not parked:
        if not store.pass_probe(name, message.chain, to=None):
            return ProbeOutcome(cluster, "dropped")
        # A job parked after the read above found this chain running, so started none: it starts one now.
        if _parked(store, clusters, cluster):
            start_probing(store, probing.probes(), cluster, own_name=clusters.own_name, now=now)
            return ProbeOutcome(cluster, "restarted")
        return ProbeOutcome(cluster, "ended")
    # The chain passes to the next probe before the cluster is called: a duplicate of this one stops here.
    token, delay = uuid.uuid4().hex, probe_delay()
    if not store.pass_probe(name, message.chain, to=token, due=now + delay):
        return ProbeOutcome(cluster, "dropped")
    try:
        clusters.api(cluster).get_version()
        why = ""
    except ClusterError as e:
        why = str(e)
    with contextlib.suppress(StoreError):  # the sweep records it within a minute all the same
        record_health(store, clusters, [ClusterRun(cluster, now, error=why or None)])
    if not why:
        store.pass_probe(name, token, to=None)
        # With those parked while it was called: their park found the chain running, so started none.
        seen = {r.key for r in parked}
        asked = replan(store, [*parked, *(r for r in _parked(store, clusters, cluster) if r.key not in seen)])
        log.info("cluster %s answers again: %d parked jobs asked to plan", name, len(asked))
        return ProbeOutcome(cluster, "answered", asked)
    try:
        probing.probes().send_probe(ClusterProbe(cluster=cluster, chain=token), delay=delay)
    except NodeQueueError:
        store.pass_probe(name, token, to=message.chain, due=now)  # this probe comes again, the chain's again
        raise
    return ProbeOutcome(cluster, "down", reason=why)
