"""Job items: one per job (`JOB#<key>`: `<namespace>/<name>`, `<cluster>:` first in a registered cluster;
sort key `JOB`), its manifest, plan, counters and state."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from prewarm.adapters.dynamodb.table import Table, from_item, job_pk, plain_value, task_pk, to_item
from prewarm.domain.clusters import DEFAULT_CLUSTER, scoped
from prewarm.domain.job import ApiKind, EarlierImage, StoredJob
from prewarm.domain.jobs import JobState
from prewarm.domain.lifecycle import wanted_repository
from prewarm.domain.status import Counters
from prewarm.services.ports import StoreConflictError

_COUNTERS = ("desired", "waiting", "active", "succeeded", "failed", "done")
NODES_PER_SHARD = 100
MAX_SHARDS = 64
# The sparse, keys-only `running` index: only running jobs carry the attribute, so a hello reads those
# jobs (the `Never` ones it joins, those that dispatched to it before its queue existed), not every job
# ever stored. Set and removed by the writes that change a job's spec or state, never by its counter
# updates, so reports never write the index.
RUNNING = "running"
# An item saying every job item is indexed: tables of versions before the index are indexed once, by
# the first reader that finds it missing.
_INDEXED = {"pk": {"S": "INDEX#running"}, "sk": {"S": "INDEX"}}
# The sparse, keys-only `images` index: each live ImagePullJob (not being deleted) under its cluster and
# repository (`ipk`), so that a release reads the jobs that may want the same image, not every job
# (`services.lifecycle`). Set with the job's spec, removed when its deletion starts; tables of versions
# before it are indexed once, as for `running`. One key value per repository and cluster: written only when
# a job is created, changes repository or starts its deletion (keys only, so reports never write it), far
# below a partition's 1,000 writes a second (DynamoDB developer guide, "Partitions and data distribution").
IMAGES, IMAGES_KEY = "images", "ipk"
_IMAGES_INDEXED = {"pk": {"S": "INDEX#images"}, "sk": {"S": "INDEX"}}


def _running(cluster: str) -> str:
    """The `running` index partition of a cluster's jobs: a hello reads its own cluster's running jobs."""
    return scoped(cluster, "job")


def _runs(job: StoredJob) -> bool:
    """Whether the job item belongs in the index: a running job (planned or not yet); readers apply
    their own rule (`StoredJob.is_running_never`, `is_dispatching`)."""
    return job.state is JobState.RUNNING


def _images(job: StoredJob) -> str | None:
    """The `images` index partition a job is in (None: it wants no image)."""
    repository = wanted_repository(job)
    return None if repository is None else scoped(job.cluster, repository)


def job_of_item(item: Mapping[str, Any] | None) -> StoredJob | None:
    """The job an item of the table holds, as the table stream shows it (plain values); None for any
    other item (node items, rules, nodes, schedule runs)."""
    if not item or item.get("sk") != "JOB":
        return None
    return JobItems._job({k: plain_value(v) for k, v in item.items()})


class JobItems(Table):
    """Job items, and how many partitions each job's node items are spread over."""

    @staticmethod
    def _job_item(job: StoredJob) -> dict[str, Any]:
        c = job.counters
        return to_item(
            {
                "pk": job_pk(job.key),
                "sk": "JOB",
                "kind": "job",
                "namespace": job.namespace,
                "name": job.name,
                "uid": job.uid,
                "api_kind": job.api_kind,
                # Stored as `spec`, the attribute existing tables already hold.
                "spec": json.dumps(job.manifest, sort_keys=True),
                "spec_hash": job.spec_hash,
                "generation": job.generation,
                "round": job.round,
                "planned": job.planned,
                "state": job.state,
                "version": job.version,
                "desired": c.desired,
                "waiting": c.waiting,
                "active": c.active,
                "succeeded": c.succeeded,
                "failed": c.failed,
                "done": c.done,
                "shards": job.shards or None,
                "platforms": json.dumps(job.platforms),
                "layers": job.layers, "image_bytes": job.image_bytes,
                "start_time": job.start_time,
                "completion_time": job.completion_time,
                "message": job.message,
                "ttl": job.ttl,
                "created_at": job.created_at,
                "owner": job.owner or None,
                "children": job.children or None,
                "pull_secret_arns": job.pull_secret_arns or None,
                "placement_note": job.placement_note or None,
                "seeds": job.seeds or None, "first_estimate": job.first_estimate or None,
                "parked": job.parked or None, "awaits_replica": job.awaits_replica or None,
                "warm_digest": job.warm_digest or None, "warm_bytes": job.warm_bytes,
                "budget_note": job.budget_note or None,
                "earlier": job.earlier.to_json() if job.earlier else None, "pinned_until": job.pinned_until,
                RUNNING: _running(job.cluster) if _runs(job) else None,
                IMAGES_KEY: _images(job),
                "cluster": job.cluster or None,
            }
        )

    @staticmethod
    def _job(values: Mapping[str, Any]) -> StoredJob:
        return StoredJob(
            namespace=values["namespace"],
            name=values["name"],
            uid=values["uid"],
            api_kind=ApiKind(values["api_kind"]),
            manifest=json.loads(values["spec"]),
            spec_hash=values["spec_hash"],
            generation=values.get("generation", 1),
            round=values.get("round", 0),
            planned=values.get("planned", ""),
            state=JobState(values.get("state", JobState.RUNNING)),
            version=values.get("version", 0),
            counters=Counters(**{k: values.get(k, 0) for k in _COUNTERS if k != "done"}),
            shards=values.get("shards", 0),
            deleting_since=values.get("deleting_since"),
            platforms=json.loads(values.get("platforms", "[]")),
            layers=values.get("layers"),
            image_bytes=int(values["image_bytes"]) if values.get("image_bytes") is not None else None,
            start_time=values.get("start_time"),
            completion_time=values.get("completion_time"),
            message=values.get("message", ""),
            ttl=values.get("ttl"),
            created_at=values.get("created_at"),
            owner=values.get("owner", ""),
            children=list(values.get("children", [])),
            pull_secret_arns=list(values.get("pull_secret_arns", [])),
            placement_note=values.get("placement_note", ""),
            seeds=list(values.get("seeds", [])), first_estimate=values.get("first_estimate", ""),
            parked=values.get("parked", ""), awaits_replica=values.get("awaits_replica", ""),
            warm_digest=values.get("warm_digest", ""), warm_bytes=values.get("warm_bytes"),
            budget_note=values.get("budget_note", ""),
            earlier=EarlierImage.from_json(values.get("earlier")),
            pinned_until=int(values["pinned_until"]) if values.get("pinned_until") is not None else None,
            cluster=values.get("cluster", DEFAULT_CLUSTER),
        )

    def get_job(self, key: str, *, consistent: bool = True) -> StoredJob | None:
        out = self._call("get job", "get_item", Key=self._key(job_pk(key), "JOB"), ConsistentRead=consistent)
        return self._job(from_item(out["Item"])) if "Item" in out else None

    def create_job(self, job: StoredJob) -> None:
        self._call(
            f"create job {job.key}", "put_item", Item=self._job_item(job),
            ConditionExpression="attribute_not_exists(pk)",
        )

    def replace_job_spec(self, job: StoredJob, *, expected_hash: str) -> None:
        fields = {
            "spec": json.dumps(job.manifest, sort_keys=True),
            "spec_hash": job.spec_hash,
            "generation": job.generation,
            "round": job.round,
            "api_kind": job.api_kind,
            "platforms": json.dumps(job.platforms),
            "layers": job.layers, "image_bytes": job.image_bytes,
            "state": job.state,
            "start_time": job.start_time,
            "completion_time": job.completion_time,
            "message": job.message,
            "ttl": job.ttl,
            "warm_digest": job.warm_digest or None, "warm_bytes": job.warm_bytes,
            "budget_note": job.budget_note or None,
            "earlier": job.earlier.to_json() if job.earlier else None, "pinned_until": job.pinned_until,
            RUNNING: _running(job.cluster) if _runs(job) else None,
            IMAGES_KEY: _images(job),
        }
        self._update(
            f"update job {job.key}", job_pk(job.key), "JOB", fields,
            condition="spec_hash = :expected_hash", values={":expected_hash": expected_hash},
        )

    def set_job_fields(self, key: str, fields: Mapping[str, Any], *, condition_state: JobState | None = None) -> None:
        if "platforms" in fields:
            fields = {k: json.dumps(v) if k == "platforms" else v for k, v in fields.items()}
        if "state" in fields and fields["state"] != JobState.RUNNING:
            fields = {**fields, RUNNING: None}
        if fields.get("state") == JobState.DELETING:
            fields = {**fields, IMAGES_KEY: None}
        self._update(
            f"update job {key}", job_pk(key), "JOB", fields,
            condition="attribute_exists(pk)" + (" AND #state = :state" if condition_state else ""),
            values={":state": condition_state} if condition_state else None,
        )

    def list_jobs(self) -> list[StoredJob]:
        return sorted((self._job(v) for v in self._list_kind("job")), key=lambda r: r.key)

    def list_running_jobs(self, cluster: str = DEFAULT_CLUSTER) -> list[StoredJob]:
        """The running jobs of one cluster (and any that stopped a moment ago: the index is eventually
        consistent, as `list_jobs`' is), read through the `running` index."""
        self._index_older_jobs(_INDEXED, RUNNING, lambda job: _running(job.cluster) if _runs(job) else None)
        return self._jobs_of_index("running jobs", RUNNING, RUNNING, _running(cluster))

    def list_image_jobs(self, cluster: str, repository: str) -> list[StoredJob]:
        """The live ImagePullJobs of `cluster` whose image is of `repository` (and any whose deletion started
        a moment ago: the index is eventually consistent), read through the `images` index."""
        self._index_older_jobs(_IMAGES_INDEXED, IMAGES_KEY, _images)
        return self._jobs_of_index(f"jobs of {repository}", IMAGES, IMAGES_KEY, scoped(cluster, repository))

    def _jobs_of_index(self, what: str, index: str, attribute: str, value: str) -> list[StoredJob]:
        keys = [
            self._key(v["pk"], v["sk"])
            for v in self._query(f"list {what}", IndexName=index, KeyConditionExpression=f"{attribute} = :k",
                                 ExpressionAttributeValues={":k": {"S": value}})
        ]
        items = self._batch_get(f"read {what}", keys)
        return sorted((self._job(v) for v in items if v.get("sk") == "JOB"), key=lambda r: r.key)

    def _index_older_jobs(self, marker: dict[str, Any], attribute: str,
                          value_of: Callable[[StoredJob], str | None]) -> None:
        """Once per table and index: indexes the job items a version before the index wrote."""
        indexed: set[str] = self.__dict__.setdefault("_indexed", set())
        if attribute in indexed:
            return
        if "Item" not in self._call("read the index marker", "get_item", Key=marker, ConsistentRead=True):
            for values in self._list_kind("job"):
                job = self._job(values)
                if values.get(attribute) != (value := value_of(job)):
                    self._update(f"index job {job.key}", job_pk(job.key), "JOB", {attribute: value},
                                 condition="attribute_exists(pk)")
            self._call("write the index marker", "put_item", Item=marker)
        indexed.add(attribute)

    def delete_job(self, key: str) -> None:
        """Deletes the node and excluded items of every shard, then the job item (a retry finds the rest)."""
        keys = [
            {"DeleteRequest": {"Key": self._key(v["pk"], v["sk"])}}
            for pk in self._shard_pks(key, self._shards(key, None))
            for v in self._query(
                f"read job {key}", KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": pk}},
                ProjectionExpression="pk, sk", ConsistentRead=True,
            )
        ]
        self._batch_write(f"delete job {key}", keys)
        self._call(f"delete job {key}", "delete_item", Key=self._key(job_pk(key), "JOB"))

    # -- node tasks -------------------------------------------------------------------------
    #
    # A job's node items (and its excluded nodes) are spread over `shards` partition keys, each node
    # always in the same one. DynamoDB serves one partition key value at most 1,000 WCU/s
    # (developer guide, "Partitions and data distribution" / "burst and adaptive capacity"); 5,000
    # nodes reporting progress every 5 s write 1,000 node items per second, so one key per job would
    # throttle. `reserve_shards` fixes the count at the first plan: one shard per `NODES_PER_SHARD`
    # nodes considered, at most `MAX_SHARDS`.

    def reserve_shards(self, key: str, nodes: int) -> int:
        wanted = max(1, min(MAX_SHARDS, -(-nodes // NODES_PER_SHARD)))
        try:
            self._update(f"fix the shards of {key}", job_pk(key), "JOB", {"shards": wanted},
                         condition="attribute_exists(pk) AND attribute_not_exists(#shards)")
        except StoreConflictError:
            record = self.get_job(key)
            return record.shards if record is not None and record.shards else wanted
        return wanted

    def _shards(self, key: str, shards: int | None) -> int:
        if shards is not None:
            return max(1, shards)
        record = self.get_job(key)
        return max(1, record.shards) if record is not None else 1

    @staticmethod
    def _shard_pks(key: str, shards: int) -> list[str]:
        return [task_pk(key, i) for i in range(shards)]

    def commit_plan(
        self,
        key: str,
        *,
        plan_id: str,
        expected_version: int,
        counters: Counters,
        extra: Mapping[str, Any],
    ) -> None:
        fields: dict[str, Any] = {
            "planned": plan_id,
            "desired": counters.desired,
            "waiting": counters.waiting,
            "active": counters.active,
            "succeeded": counters.succeeded,
            "failed": counters.failed,
            "done": counters.done,
            **extra,
        }
        self._update(
            f"commit plan of {key}", job_pk(key), "JOB", fields,
            condition="#version = :v", values={":v": expected_version}, add={"version": 1},
        )

    def finish_job(self, key: str, fields: Mapping[str, Any], *, require_done: bool = True) -> bool:
        condition = "#state = :running" + (" AND #done = #desired" if require_done else "")
        try:
            self._update(f"finish job {key}", job_pk(key), "JOB", {**fields, RUNNING: None},
                         condition=condition, values={":running": JobState.RUNNING}, add={"version": 1})
        except StoreConflictError:
            return False
        return True
