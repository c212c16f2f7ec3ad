"""ECR pushes → prewarm rules → `Always` jobs pinned to the pushed digest."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from prewarm.domain.clusters import DEFAULT_CLUSTER, RegisteredCluster, select_clusters
from prewarm.domain.jobs import job_key
from prewarm.domain.keys import JobKey
from prewarm.domain.lifecycle import superseded
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.push import ImagePush
from prewarm.domain.rules import PrewarmRule
from prewarm.services.jobs import Applied, apply_job, request_deletion
from prewarm.services.ports import ApplyItems, ClusterRoster, ImageMetadata

log = logging.getLogger(__name__)


def matching_rules(store: ApplyItems, push: ImagePush) -> list[PrewarmRule]:
    rules = []
    for doc in store.list_rules():
        rule = parse_manifest(doc)
        if isinstance(rule, PrewarmRule) and rule.matches(push.repository, push.tag, push.registry_host):
            rules.append(rule)
    return sorted(rules, key=lambda r: r.metadata.name)


def handle_push(store: ApplyItems, images: ImageMetadata | None, push: ImagePush, *, now: float,
                clusters: ClusterRoster | None = None, rules: Sequence[PrewarmRule] | None = None) -> list[Applied]:
    """Applies one job per matching rule and cluster it selects of `clusters` (those the stack serves;
    None: the stack's own alone). A duplicate event finds the same spec and changes nothing. Each
    cluster's job has its own key, node items and status: one cluster's nodes never count in another's
    job. `rules`: the rules matching the push when the caller has read them (None: read here)."""
    rules = matching_rules(store, push) if rules is None else rules
    if not rules:
        return []
    platforms = layers = None
    if images is not None and push.is_index:
        platforms = images.platforms(push.account, push.repository, push.digest)
    if images is not None:
        # The pull's share of the registry's budget (None: unknown, the budget assumes a default).
        layers = images.layer_count(push.account, push.repository, push.digest)
    served = [RegisteredCluster(DEFAULT_CLUSTER)] if clusters is None else clusters.served()
    own_name = "" if clusters is None else clusters.own_name
    applied = []
    for rule in rules:
        job = rule.job_for_push(push.registry_host, push.repository, push.digest, push.tag)
        for unknown in rule.spec.clusters.unknown_names(served, own_name) if rule.spec.clusters else ():
            log.warning("rule names a cluster the stack does not serve: no job there",
                        extra={"rule": rule.metadata.name, "cluster": unknown})
        for cluster in select_clusters(rule.spec.clusters, served, own_name):
            applied.append(apply_job(store, job, now=now, platforms=platforms, cluster=cluster.name, layers=layers))
            retire_superseded(store, rule, job_key(job.metadata.namespace, job.metadata.name, cluster.name), now=now)
    return applied


def retire_superseded(store: ApplyItems, rule: PrewarmRule, newest: JobKey, *, now: float) -> list[JobKey]:
    """Deletes the rule's jobs of the digests the push of job `newest` superseded beyond the rule's
    `keepDigests` (`prewarm.domain.lifecycle.superseded`); their deletion releases their images, which are
    removed after the stack's grace period where no other job wants them. Returns their keys."""
    record = store.get_job(newest)
    if record is None:
        return []
    retired: list[JobKey] = []
    for old in superseded(record, store.list_jobs(), rule.spec.kept_digests):
        request_deletion(store, old.namespace, old.name, now=now, by=old.source, cluster=old.cluster)
        log.info("job %s retired: rule %s keeps %d earlier digests of the tag", old.key, rule.metadata.name,
                 rule.spec.kept_digests)
        retired.append(old.key)
    return retired
