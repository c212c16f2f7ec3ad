"""`fleet.py --clusters N`: one stack serving N EKS clusters whose nodes have the same names, and one push.

`--nodes` is split evenly over the clusters. Each cluster has an embedded Kubernetes API of its own with
the same synthetic nodes (EKS names nodes after their private IPs, so names repeat across clusters): the
first is the stack's own (`ClusterName` local, plain HTTP as in the one-cluster run), the others are
registered in the table as `prewarm cluster add` registers them (`put_cluster`: their HTTPS endpoint
and CA; the functions reach them with an EKS token). Each cluster's node queues are made first, as
their hellos have `record_status` make them, and the agents say hello with their cluster's name;
`record_status` registers them. A PrewarmRule
with no `spec.clusters` (every cluster) matches one ECR push, delivered to `on_image_push` as
EventBridge delivers it: one `Always` job per cluster, each planned by `dispatch_job` against its own
cluster's API. Then every cluster's agents pull at once, through the one status queue the stack has.

What it verifies beyond the one-cluster figures (per cluster, and in total):
- every DynamoDB key written (the base table's and each index's, counted by the AWS limits layer with
  the base-table partition keys whose writes landed on it) is attributed to the clusters whose traffic
  wrote it: during a cluster's hellos, that cluster (the clusters say hello one after another); during
  the push and the round, the cluster each writing item is keyed by (`JOB#<cluster>:…`, `NODE#<cluster>:…`;
  no prefix: the stack's own). Keys written by more than one cluster's traffic are listed, and so are
  those written for items of no cluster (the stack's own items);
- every node queue belongs to exactly one cluster, and no agent received a task of another cluster's job.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fleet_agents import IMAGE, NAMESPACE, Agents, cluster_of_message
from benchmarks.fleet_moto import ACCOUNT, REGION, Json, LimitedMoto, SimClock
from benchmarks.fleet_stack import Fleet, Lane, RoundResult, figures, targets
from benchmarks.measure import BenchmarkError, load_average, print_machine, print_targets
from benchmarks.servers import KubeApiProcess

OWN_CLUSTER = "local"  # the stack's ClusterName, as fleet.py deploys it
RULE = "fleet"
REPOSITORY, _, DIGEST = IMAGE.partition("/")[2].partition("@")
STACK = "(stack)"  # what writes an item of no cluster is attributed to


@dataclass
class Served:
    """One cluster the stack serves: its name as the stack keys it (`""`: its own), its API, its nodes."""

    name: str
    api: KubeApiProcess
    nodes: list[str] = field(default_factory=list)
    queues: Any = None  # NodeQueues of this cluster, as its agents make them

    @property
    def shown(self) -> str:
        return self.name or OWN_CLUSTER


def owner(pk: str) -> str:
    """The cluster an item of base-table partition key `pk` belongs to (shown name), or STACK."""
    from prewarm.domain.clusters import split_scoped

    for prefix in ("JOB#", "NODE#"):  # a job's key or a node's scoped name
        if pk.startswith(prefix):
            return split_scoped(pk[len(prefix) :])[0] or OWN_CLUSTER
    if pk.startswith("CLUSTER#"):
        return pk[len("CLUSTER#") :]
    return STACK


@dataclass
class KeyLedger:
    """Every key written, with the writes each cluster's traffic made on it, over the run's phases."""

    writes: dict[str, dict[str, int]] = field(default_factory=dict)
    foreign: dict[str, list[str]] = field(default_factory=dict)  # a cluster's traffic → other clusters' keys it wrote

    def add(self, usages: Sequence[Any], cluster: str | None = None) -> None:
        """`usages` written while only `cluster`'s traffic ran, or (None) attributed by their writers."""
        for usage in usages:
            if not usage.writes:
                continue
            by = self.writes.setdefault(str(usage.key), {})
            if cluster is not None:
                by[cluster] = by.get(cluster, 0) + usage.writes
                if {owner(w) for w in usage.writers} - {cluster, STACK}:
                    self.foreign.setdefault(cluster, []).append(str(usage.key))
                continue
            owners = sorted({owner(w) for w in usage.writers}) or [STACK]
            for name in owners:  # a key several clusters' items wrote: each is counted as a writer
                by[name] = by.get(name, 0) + (usage.writes if len(owners) == 1 else 1)

    def shared(self) -> dict[str, dict[str, int]]:
        """Keys written by more than one cluster's traffic."""
        return {k: v for k, v in sorted(self.writes.items()) if len([c for c in v if c != STACK]) > 1}

    def stack_wide(self) -> dict[str, dict[str, int]]:
        """Keys written for items of no cluster (rules, indexes' markers)."""
        return {k: v for k, v in sorted(self.writes.items()) if STACK in v}

    def of(self, cluster: str) -> set[str]:
        """Keys only `cluster`'s traffic wrote."""
        return {k for k, v in self.writes.items() if set(v) == {cluster}}


def rule_manifest(parallelism: int) -> Json:
    """A rule for the pushed repository with no `spec.clusters`: it selects every cluster the stack serves."""
    return {
        "apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": RULE},
        "spec": {"repositories": [REPOSITORY], "template": {"metadata": {"namespace": NAMESPACE}, "spec": {
            "parallelism": parallelism, "completionPolicy": {"type": "Always"},
            "pullPolicy": {"timeoutSeconds": 1800, "backoffLimit": 3}}}},
    }


def push_event() -> Json:
    """ECR's PUSH event for the image, as EventBridge delivers it to `on_image_push`."""
    return {
        "version": "0", "id": "fleet-push", "detail-type": "ECR Image Action", "source": "aws.ecr",
        "account": ACCOUNT, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "region": REGION,
        "resources": [],
        "detail": {"result": "SUCCESS", "repository-name": REPOSITORY, "image-digest": DIGEST, "action-type": "PUSH",
                   "manifest-media-type": "application/vnd.oci.image.manifest.v1+json", "image-tag": "v1"},
    }


@contextlib.contextmanager
def cluster_apis(count: int, nodes: int) -> Iterator[list[Served]]:
    """One embedded API per cluster, each with the same `nodes` synthetic nodes; the registered ones on HTTPS."""
    with contextlib.ExitStack() as stack:
        served = [Served("", stack.enter_context(KubeApiProcess(nodes=nodes)))]
        for i in range(2, count + 1):
            name = f"fleet-{i}"
            served.append(Served(name, stack.enter_context(KubeApiProcess(nodes=nodes, tls=True, cluster_name=name))))
        yield served


def register_clusters(fleet: Fleet, served: Sequence[Served]) -> None:
    """What `prewarm cluster add` leaves in the table: each registered cluster's endpoint and CA."""
    from prewarm.domain.clusters import RegisteredCluster

    for cluster in served[1:]:
        fleet.store.put_cluster(RegisteredCluster(cluster.name, endpoint=cluster.api.url, ca_data=cluster.api.ca_data,
                                                  labels={"fleet": "bench"}, added_at=time.time()))


def say_hello(fleet: Fleet, cluster: Served, ledger: KeyLedger) -> float:
    """The cluster's agents start: each creates its node queue and says hello; `record_status` registers them.
    The keys written meanwhile are this cluster's traffic. Returns the wall seconds it took."""
    from prewarm import bootstrap
    from prewarm.adapters.sqs import NodeQueues
    from prewarm.domain.messages import Hello
    from prewarm.settings import settings

    started = time.perf_counter()
    s = settings()
    cluster.queues = NodeQueues(s.node_queue_prefix, s.status_queue_url, dlq_arn=s.node_dlq_arn,
                                visibility_seconds=s.node_queue_visibility_seconds,
                                sender_arns=s.node_queue_sender_arns, client=fleet.queues.client, cluster=cluster.name)
    objects = bootstrap.cluster(cluster.name).list_nodes()
    cluster.nodes = [o["metadata"]["name"] for o in objects]
    fleet.moto.reset()
    with ThreadPoolExecutor(max_workers=16) as pool:
        urls = list(pool.map(cluster.queues.ensure_queue, cluster.nodes))
    hellos = []
    for obj, url in zip(objects, urls, strict=True):
        labels = obj["metadata"].get("labels", {})
        hellos.append(Hello(node=obj["metadata"]["name"], labels=labels, queue_url=url, cluster=cluster.name,
                            architecture=labels.get("kubernetes.io/arch", ""), agent_version="fleet-benchmark")
                      .model_dump_json())
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(fleet._send_status, [hellos[i : i + 10] for i in range(0, len(hellos), 10)]))
    fleet.drain_status()
    ledger.add(fleet.moto.stats()["keys"], cluster.shown)
    registered = {n.name for n in fleet.store.list_nodes(cluster.name)}
    if registered != set(cluster.nodes):
        raise BenchmarkError(f"cluster {cluster.shown}: {len(registered)} of {len(cluster.nodes)} nodes registered")
    return time.perf_counter() - started


def push(fleet: Fleet, served: Sequence[Served], parallelism: int, ledger: KeyLedger) -> list[str]:
    """The rule, then one push through `on_image_push`, then each cluster's job planned; the job keys."""
    from prewarm.domain.clusters import scoped
    from prewarm.domain.kubernetes import bounded_name
    from prewarm.services.jobs import apply_manifest

    fleet.moto.reset()
    apply_manifest(fleet.store, rule_manifest(parallelism), now=time.time())
    answer = fleet.stack.invoke("on_image_push", push_event())
    name = bounded_name(RULE, DIGEST.partition(":")[2][:12])
    keys = [scoped(c.name, f"{NAMESPACE}/{name}") for c in served]
    created = [line for line in answer["jobs"] if line.endswith(" created")]
    if len(created) != len(served):
        raise BenchmarkError(f"one push made {answer['jobs']}, not one job per cluster ({len(served)})")
    for key in keys:
        fleet.dispatch(key, 0)
    ledger.add(fleet.moto.stats()["keys"])
    return keys


def dlq_by_cluster(fleet: Fleet) -> dict[str, int]:
    """The DLQs' messages by the cluster they are about (a message that names none: the stack's)."""
    out: dict[str, int] = {}
    for url in fleet.dlq_urls.values():
        while True:
            got = fleet.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300)
            if not got.get("Messages"):
                break
            for m in got["Messages"]:
                try:
                    name = cluster_of_message(m["Body"]) or OWN_CLUSTER
                except (ValueError, AttributeError):
                    name = STACK
                out[name] = out.get(name, 0) + 1
    return out


def queue_owners(fleet: Fleet, served: Sequence[Served]) -> Json:
    """Every queue of the stack by cluster: node queues by their cluster's prefix, the rest the stack's."""
    from prewarm.domain.messages import is_cluster_queue

    names: list[str] = []
    kwargs: dict[str, Any] = {"MaxResults": 1000}
    while True:
        page = fleet.sqs.list_queues(**kwargs)
        names += [u.rsplit("/", 1)[1] for u in page.get("QueueUrls", [])]
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    prefix = fleet.queues.prefix
    by: dict[str, list[str]] = {}
    for name in names:
        owners = [c.shown for c in served if is_cluster_queue(prefix, name, c.name)]
        for who in owners or [STACK]:
            by.setdefault(who, []).append(name)
    return {
        "node_queues": {c.shown: len(by.get(c.shown, [])) for c in served},
        "queues_of_several_clusters": sorted(n for n in names if sum(n in by.get(c.shown, []) for c in served) > 1),
        "stack_queues": sorted(by.get(STACK, [])),
    }


def total_figures(results: Sequence[RoundResult], per_cluster: Mapping[str, Json], keys: Sequence[Any]) -> Json:
    """The round over every cluster: the hottest key of all, per report of all."""
    reports = sum(r.reports for r in results)
    hot = max(keys, key=lambda u: u.wcu, default=None)
    ran = list(per_cluster.values())
    first = results[0]
    return {
        "nodes": sum(r.nodes for r in results),
        "reports": reports,
        "sim_seconds": round(first.sim_seconds, 1),
        "wall_seconds": round(first.wall_seconds, 1),
        "hottest_key": str(hot.key) if hot else None,
        "hottest_key_writes_per_report": round(hot.writes / max(1, reports), 4) if hot else 0.0,
        "hottest_key_wcu_per_s": round(hot.peak_wcu_per_s, 1) if hot else 0.0,
        "hottest_key_avg_wcu_per_s": round(hot.wcu_per_s(), 1) if hot else 0.0,
        "peak_reports_per_s": max(Counter(int(second) for r in results for second, _ in r.sent).values(), default=0),
        "throttles": first.stats["throttles"],
        "transaction_conflicts": first.stats["conflicts"],
        "dlq_messages": sum(f["dlq_messages"] for f in ran),
        "lost_reports": sum(f["lost_reports"] for f in ran),
        "counters_exact": all(f["counters_exact"] for f in ran),
        "job_item_bytes": max(f["job_item_bytes"] for f in ran),
        "slot_refill_p50_s": None,
        "slot_refill_p99_s": None,
        "returned_items": sum(f["returned_items"] for f in ran),
        "crossed_tasks": sum(f["crossed_tasks"] for f in ran),
    }


def run_clusters(fleet: Fleet, served: Sequence[Served]) -> tuple[Json, Json]:
    """Hellos, the push and the round of every cluster's job; (figures in total, per cluster and keys)."""
    from prewarm.domain.messages import is_cluster_queue

    args = fleet.args
    per_cluster = args.nodes // args.clusters
    parallelism = args.parallelism or per_cluster
    ledger = KeyLedger()
    fleet.moto.reset()
    register_clusters(fleet, served)
    ledger.add(fleet.moto.stats()["keys"])
    for cluster in served:
        seconds = say_hello(fleet, cluster, ledger)
        print(f"  cluster {cluster.shown} ({cluster.api.url}): {len(cluster.nodes)} node queues made, agents "
              f"said hello, all registered, in {seconds:.0f} s wall")
    if any(c.nodes != served[0].nodes for c in served):
        raise BenchmarkError("the clusters' node names differ: the benchmark wants the same names in each")
    keys = push(fleet, served, parallelism, ledger)
    print(f"  one push of {REPOSITORY}: {len(keys)} Always jobs ({', '.join(keys)}), parallelism {parallelism}")
    lanes = []
    for i, (cluster, key) in enumerate(zip(served, keys, strict=True)):
        agents = Agents(fleet.clock, random.Random(args.seed + i), args.pull_median, args.pull_sigma, args.failures,
                        args.disorder)
        result = RoundResult(f"always@{cluster.shown}", key, len(cluster.nodes), parallelism, cluster=cluster.name)
        lanes.append(Lane(result, agents, owns_queue=functools.partial(is_cluster_queue, fleet.queues.prefix,
                                                                          cluster=cluster.name)))
    results = fleet.run_lanes(lanes)
    stats_keys = results[0].stats["keys"]
    ledger.add(stats_keys)
    dlq = dlq_by_cluster(fleet)
    figures_by: dict[str, Json] = {}
    for cluster, lane in zip(served, lanes, strict=True):
        result = lane.result
        checked = fleet.check(result, lane.agents, 0.0, unsettled=dlq.get(cluster.shown, 0))
        mine = ledger.of(cluster.shown)
        own_keys = [u for u in stats_keys if str(u.key) in mine]
        new = figures(result, checked, fleet, own_keys)
        # Throttles land on a key, so they are the cluster's own; a transaction conflict is counted for the stack.
        new["throttles"], new["transaction_conflicts"] = sum(u.throttles for u in own_keys), None
        new["dlq_messages"] = dlq.get(cluster.shown, 0)
        new["crossed_tasks"] = result.extra.get("crossed_tasks", 0)
        figures_by[cluster.shown] = new
        report_cluster(cluster.shown, new)
    total = total_figures(results, figures_by, stats_keys)
    total["dlq_messages"] = sum(dlq.values())
    shared, stack_wide = ledger.shared(), ledger.stack_wide()
    queues = queue_owners(fleet, served)
    report_keys(total, shared, stack_wide, queues, len(ledger.writes))
    if ledger.foreign:
        print(f"  keys of another cluster written by a cluster's hellos: {ledger.foreign}")
    return total, {"clusters": figures_by, "shared_keys": shared, "stack_keys": stack_wide, "queues": queues,
                   "keys_written": len(ledger.writes), "foreign_keys": ledger.foreign, "dlq_by_cluster": dlq}


def report_cluster(name: str, new: Json) -> None:
    print(f"  cluster {name}: {new['reports']} reports over {new['sim_seconds']:.0f} simulated s "
          f"(peak {new['peak_reports_per_s']}/s); its hottest key {new['hottest_key']}: "
          f"{new['hottest_key_writes_per_report']} writes/report, peak {new['hottest_key_wcu_per_s']} WCU/s; "
          f"job item {new['job_item_writes_per_report']} writes/report, {new['job_item_bytes']} B; throttles "
          f"{new['throttles']}, DLQ "
          f"{new['dlq_messages']}, lost {new['lost_reports']}, items handed back {new['returned_items']}, counters "
          f"exact {new['counters_exact']} {new['counters']}; tasks of another cluster's job received "
          f"{new['crossed_tasks']}")
    for problem in new["problems"]:
        print(f"    problem: {problem}")


def report_keys(total: Json, shared: Json, stack_wide: Json, queues: Json, written: int) -> None:
    print(f"  all clusters: {total['reports']} reports (peak {total['peak_reports_per_s']}/s), "
          f"hottest key {total['hottest_key']}: "
          f"{total['hottest_key_writes_per_report']} writes/report, peak {total['hottest_key_wcu_per_s']} WCU/s; "
          f"throttles {total['throttles']}, conflicts {total['transaction_conflicts']}, DLQ {total['dlq_messages']}, "
          f"lost {total['lost_reports']}, counters exact {total['counters_exact']}, items handed back "
          f"{total['returned_items']}")
    print(f"  {written} DynamoDB keys written (table and indexes); by more than one cluster's traffic: "
          f"{len(shared)}")
    for key, by in shared.items():
        print(f"    shared {key}: {by}")
    for key, by in stack_wide.items():
        print(f"    for no cluster's item {key}: {by}")
    print(f"  node queues per cluster {queues['node_queues']}; of several clusters: "
          f"{queues['queues_of_several_clusters'] or 'none'}; the stack's own: {', '.join(queues['stack_queues'])}")


def benchmark_clusters(args: argparse.Namespace) -> Json:
    """`fleet.py --clusters N`: the push's `Always` jobs in every cluster at once."""
    from prewarm_devtools.sam.aws import aws_environment

    print_machine()
    load_before = load_average()
    started = time.perf_counter()
    clock = SimClock()
    per_cluster = args.nodes // args.clusters
    with LimitedMoto(clock) as moto, cluster_apis(args.clusters, per_cluster) as served, \
            aws_environment(moto.url):
        fleet = Fleet(args, clock, moto, served[0].api)
        fleet.deploy()
        print(f"fleet: {args.clusters} clusters of {per_cluster} simulated agents with the same node names; moto with "
              f"the AWS limits layer at {moto.url}; record_status batches of up to {fleet.batch_size}, up to "
              f"{fleet.concurrency} in flight (template.yaml); the old path is not replayed with --clusters")
        try:
            total, detail = run_clusters(fleet, served)
            concurrency = fleet.concurrency_figures()
        finally:
            fleet.close()
    wall = time.perf_counter() - started
    print(f"  batches in flight: max {concurrency['max']}, mean {concurrency['mean']}; mean batch "
          f"{concurrency['mean_batch']} messages; whole benchmark {wall:.0f} s wall; load average before "
          f"{load_before}, after {load_average()}")
    print("  targets (every cluster's Always job, in total):")
    met = print_targets(targets(total))
    return {**total, **detail, "cluster_count": args.clusters, "targets_met": met,
            "benchmark_wall_seconds": round(wall, 1), "concurrency": concurrency,
            "load_average": [load_before, load_average()], "rounds": args.rounds, "always": total, "old": None,
            "never": None}
