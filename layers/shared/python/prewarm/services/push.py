"""ECR pushes → prewarm rules → `Always` jobs pinned to the pushed digest; a cluster in a Region the push is
replicated to pulls that Region's replica, once ECR's replication event says it is there."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from prewarm.domain.clusters import DEFAULT_CLUSTER, RegisteredCluster, select_clusters
from prewarm.domain.job import ApiKind, StoredJob
from prewarm.domain.jobs import job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.lifecycle import superseded
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.push import ImagePush, ecr_host
from prewarm.domain.replication import replica_region
from prewarm.domain.rules import PrewarmRule
from prewarm.domain.warm_budgets import WarmBudgetExceededError
from prewarm.services.jobs import Applied, apply_job, request_deletion
from prewarm.services.ports import ApplyItems, ClusterRoster, ImageMetadata, ImageSizes, ReplicaRegions
from prewarm.services.warm_budgets import refused_at_push

log = logging.getLogger(__name__)


def matching_rules(store: ApplyItems, push: ImagePush) -> list[PrewarmRule]:
    rules = []
    for doc in store.list_rules():
        rule = parse_manifest(doc)
        if isinstance(rule, PrewarmRule) and rule.matches(push.repository, push.tag, push.registry_host):
            rules.append(rule)
    return sorted(rules, key=lambda r: r.metadata.name)


def handle_push(store: ApplyItems, images: ImageMetadata | None, push: ImagePush, *, now: float,
                clusters: ClusterRoster | None = None, rules: Sequence[PrewarmRule] | None = None,
                replication: ReplicaRegions | None = None, sizes: ImageSizes | None = None) -> list[Applied]:
    """Applies one job per matching rule and cluster it selects of `clusters` (those the stack serves;
    None: the stack's own alone). A duplicate event finds the same spec and changes nothing. Each
    cluster's job has its own key, node items and status: one cluster's nodes never count in another's
    job. `rules`: the rules matching the push when the caller has read them (None: read here).

    A cluster registered in another Region that `replication` (read at most once, and only for such a
    cluster) copies the repository to gets a job on its Region's replica, held until that Region's
    `ECR Replication Action` event (`handle_replication`); with no `replication`, every cluster pulls the
    pushed image. A job its namespace's warm budget refuses is recorded `Failed` with the refusal, and
    retires no earlier digest; `sizes` reads the images' sizes for the budget."""
    rules = matching_rules(store, push) if rules is None else rules
    if not rules:
        return []
    facts = _image_facts(images, push)
    served = [RegisteredCluster(DEFAULT_CLUSTER)] if clusters is None else clusters.served()
    own_name = "" if clusters is None else clusters.own_name
    replicated: frozenset[str] | None = None
    jobs = _read_once(store)
    applied = []
    for rule in rules:
        for unknown in rule.spec.clusters.unknown_names(served, own_name) if rule.spec.clusters else ():
            log.warning("rule names a cluster the stack does not serve: no job there",
                        extra={"rule": rule.metadata.name, "cluster": unknown})
        for cluster in select_clusters(rule.spec.clusters, served, own_name):
            region = ""
            if replication is not None and cluster.region and cluster.region != push.region:
                if replicated is None:
                    replicated = replication.replica_regions(push.repository)
                region = replica_region(cluster.region, push.region, replicated)
            done = _apply(store, facts, push, rule, cluster.name, now=now, replica=region, hold=True, sizes=sizes,
                          jobs=jobs)
            applied.append(done)
            if done.outcome != "refused":
                retire_superseded(store, rule, job_key(done.namespace, done.name, done.cluster), jobs(), now=now)
    return applied


def handle_replication(store: ApplyItems, images: ImageMetadata | None, push: ImagePush, region: str, *,
                       now: float, clusters: ClusterRoster, sizes: ImageSizes | None = None) -> list[Applied]:
    """ECR says `push` is replicated to `region`: the jobs of the clusters registered in that Region start
    (held since the push, or applied now if this event came first), each on the replica."""
    applied: list[Applied] = []
    rules = matching_rules(store, push)
    served = clusters.served() if rules else []
    targets = [(rule, cluster) for rule in rules
               for cluster in select_clusters(rule.spec.clusters, served, clusters.own_name)
               if cluster.region == region != push.region]
    facts = _image_facts(images, push) if targets else (None, None)
    for rule, cluster in targets:
        done = _apply(store, facts, push, rule, cluster.name, now=now, replica=region, hold=False,
                      jobs=_read_once(store), sizes=sizes)
        key = job_key(done.namespace, done.name, done.cluster)
        record = store.get_job(key)
        if record is not None and record.awaits_replica == region:
            # The stream sees the hold lifted and plans the job (`StoredJob.needs_planning`).
            store.set_job_fields(key, {"awaits_replica": None})
        applied.append(done)
    return applied


def _image_facts(images: ImageMetadata | None, push: ImagePush) -> tuple[list[dict[str, str]] | None, int | None]:
    """The pushed index's platforms and the image's layer count, read once for every cluster's job; the
    same whichever of the push and its replication event comes first (the latter says no media type)."""
    if images is None:
        return None, None
    # The pull's share of the registry's budget (None: unknown, the budget assumes a default).
    layers = images.layer_count(push.account, push.repository, push.digest, region=push.region)
    # An event that names no media type and whose manifest cannot be read (`layers` unknown) has its platforms
    # unknown, as before it was read; an index push's manifest that cannot be read raises, and is retried.
    if push.is_index or (push.may_be_index and layers is not None):
        return images.platforms(push.account, push.repository, push.digest, region=push.region), layers
    return None, layers


def _apply(store: ApplyItems, facts: tuple[list[dict[str, str]] | None, int | None], push: ImagePush,
           rule: PrewarmRule, cluster: str, *, now: float, replica: str, hold: bool,
           jobs: Callable[[], Iterator[StoredJob]], sizes: ImageSizes | None = None) -> Applied:
    """Rule `rule`'s job of `push` in `cluster`, on Region `replica`'s copy when given (held for its event
    when `hold`). The digests it supersedes do not count against its namespace's warm budget: they go
    with it. Refused by the budget, it is recorded `Failed` with the refusal."""
    platforms, layers = facts
    host = ecr_host(push.account, replica) if replica else push.registry_host
    job = rule.job_for_push(host, push.repository, push.digest, push.tag)
    newest = StoredJob(job.namespace, job.name, "", ApiKind.IMAGE_PULL_JOB, job.to_manifest(), "",
                       created_at=now, cluster=cluster)
    leaving = {old.key for old in superseded(newest, jobs(), rule.spec.kept_digests)}
    try:
        return apply_job(store, job, now=now, platforms=platforms, cluster=cluster, layers=layers,
                         awaits_replica=replica if hold else "", sizes=sizes, leaving=leaving)
    except WarmBudgetExceededError as e:
        refused_at_push(store, job, str(e), now=now, cluster=cluster, platforms=platforms)
        return Applied("ImagePullJob", job.namespace, job.name, "refused", cluster=cluster, note=str(e))


def _read_once(store: ApplyItems) -> Callable[[], Iterator[StoredJob]]:
    """The store's jobs, listed at the first iteration of the first call and reused by every later one: a
    push retiring superseded jobs for several rules and clusters lists the jobs once (an untagged push,
    which supersedes nothing, never)."""
    listed: list[StoredJob] | None = None

    def jobs() -> Iterator[StoredJob]:
        nonlocal listed
        if listed is None:
            listed = store.list_jobs()
        yield from listed

    return jobs


def retire_superseded(store: ApplyItems, rule: PrewarmRule, newest: JobKey, jobs: Iterable[StoredJob], *,
                      now: float) -> list[JobKey]:
    """Deletes the rule's jobs of the digests the push of job `newest` superseded beyond the rule's
    `keepDigests` (`prewarm.domain.lifecycle.superseded`), among `jobs`; their deletion releases their images,
    which are removed after the stack's grace period where no other job wants them. Returns their keys."""
    record = store.get_job(newest)
    if record is None:
        return []
    retired: list[JobKey] = []
    for old in superseded(record, jobs, rule.spec.kept_digests):
        request_deletion(store, old.namespace, old.name, now=now, by=old.source, cluster=old.cluster)
        log.info("job %s retired: rule %s keeps %d earlier digests of the tag", old.key, rule.metadata.name,
                 rule.spec.kept_digests)
        retired.append(old.key)
    return retired
