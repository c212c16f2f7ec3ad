"""What one release reads (`services.lifecycle`): the table items a job's ending, or its image's change,
reads to learn which other live jobs want the same image on its nodes, at `--jobs` jobs stored.

template.yaml's table on moto in this process; `--jobs` ImagePullJob items over `--repositories`
repositories (the released job's repository has `--jobs / --repositories` of them), each job of that
repository with `--nodes` node items, all Succeeded on the same nodes (the other repositories' node
items are never read by either way, so they are not written). Then one job of that repository is
released, two ways, counted from each DynamoDB response (botocore's `after-call` event):

- **every job** (the baseline, the release before the `images` index): every job item (the `kinds`
  index's keys, then the items), then the node items of the same repository's live jobs;
- **Prewarm's** (`release_images`): the keys of the job's cluster's live jobs of its repository from
  the sparse `images` index, those job items, then their node items on the released job's nodes.

Items read are counted as DynamoDB counts them; read units by its rules ("Read/write capacity mode"): an
item of a GetItem or BatchGetItem rounded up to 4 KB, a Query's items together, halved for an eventually
consistent read (an index's), the item's size taken as its JSON's. moto reports no consumed capacity.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Target, emit, print_machine, print_targets

REGION = "us-west-2"
TABLE = "release-reads"
GRACE_S = 86_400


class Reads:
    """DynamoDB reads by operation: calls, items and read units, from each response."""

    def __init__(self, client: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.items = 0
        self.units = 0.0
        client.meta.events.register("after-call.dynamodb.*", self._after)

    def clear(self) -> None:
        self.calls.clear()
        self.items, self.units = 0, 0.0

    def _after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        op = model.name
        if op == "Query":
            items = parsed.get("Items", [])
            size = sum(len(json.dumps(i)) for i in items)
            self.units += max(1, math.ceil(size / 4096)) / 2  # an index: eventually consistent
        elif op == "BatchGetItem":
            items = [i for got in parsed.get("Responses", {}).values() for i in got]
            self.units += sum(math.ceil(len(json.dumps(i)) / 4096) for i in items)
        elif op == "GetItem":
            items = [parsed["Item"]] if "Item" in parsed else []
            self.units += max(1, sum(math.ceil(len(json.dumps(i)) / 4096) for i in items))
        else:
            return
        self.calls[op] += 1
        self.items += len(items)


class Sink:
    """Node queues that take every message (the sends are not what is measured)."""

    def __init__(self) -> None:
        self.sent = 0

    def send_many(self, messages: Sequence[Any]) -> list[tuple[str, str]]:
        self.sent += len(messages)
        return []


def seed(store: Any, jobs: int, repositories: int, nodes: list[str], now: float) -> list[str]:
    """`jobs` pinned ImagePullJobs, job i of repository i % `repositories`; those of repository 0 planned
    on `nodes`, each node Succeeded with an image of its own (another tag: nothing else wants it). Returns
    the keys of repository 0's jobs."""
    from moto.dynamodb.models import dynamodb_backends

    from prewarm.domain.job import ApiKind, StoredJob
    from prewarm.domain.jobs import ImagePullJob
    from prewarm.domain.messages import NodePhase
    from prewarm.domain.status import Counters, NodeTaskRecord
    from prewarm.services.jobs import apply_manifest
    from prewarm_devtools.account import ACCOUNT

    table = dynamodb_backends[ACCOUNT][REGION].get_table(TABLE)
    stream, table.stream_shard = table.stream_shard, None  # nothing reads the stream here
    same: list[str] = []
    try:
        for i in range(jobs):
            doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                   "metadata": {"name": f"job-{i}", "namespace": "bench",
                                "annotations": {"prewarm.dev/pin": "true"}},
                   "spec": {"image": f"registry.example/team/app-{i % repositories}:{i}", "parallelism": len(nodes),
                            "selector": {"names": nodes}}}
            if i % repositories:
                # Written straight (the store's own item), as `apply_manifest` would write it: seeding speed.
                job = ImagePullJob.from_manifest(doc)
                record = StoredJob(namespace="bench", name=job.name, uid=f"u{i}", api_kind=ApiKind.IMAGE_PULL_JOB,
                                   manifest=job.to_manifest(), spec_hash=job.spec_hash(), start_time=now,
                                   created_at=now, planned="1.0", shards=1,
                                   counters=Counters(desired=len(nodes), succeeded=len(nodes)))
                table.put_item(store._job_item(record))
                continue
            applied = apply_manifest(store, doc, now=now)
            key = f"{applied.namespace}/{applied.name}"
            shards = store.reserve_shards(key, len(nodes))
            tasks = [NodeTaskRecord(node=n, round=0, dispatched_at=now, updated_at=now, phase=NodePhase.SUCCEEDED,
                                    seq=1, version=1, image_id=f"sha256:{i:064x}") for n in nodes]
            for t in tasks:
                table.put_item(store._task_item(key, t, shards))
            current = store.get_job(key)
            store.commit_plan(key, plan_id=current.plan_id, expected_version=current.version,
                              counters=Counters(desired=len(nodes), succeeded=len(nodes)), extra={})
            same.append(key)
    finally:
        table.stream_shard = stream
    return same


def every_job_way(store: Any, record: Any) -> int:
    """The baseline: the release's lookup as it was, every job item read, then the node items of the same
    repository's live jobs. Returns how many images it found wanted on the released job's nodes."""
    from prewarm.domain.images import parse_image
    from prewarm.domain.lifecycle import images_on_nodes, wants_images

    repository = parse_image(record.pull_reference).name
    wanted = 0
    for other in store.list_jobs():
        if (other.key == record.key or other.cluster != record.cluster or not wants_images(other)
                or not other.shards or parse_image(other.pull_reference).name != repository):
            continue
        wanted += len(images_on_nodes(other, store.get_tasks(other.key, shards=other.ref.shards)))
    return wanted


def benchmark(jobs: int, repositories: int, nodes: int) -> dict[str, Any]:
    import boto3
    from moto import mock_aws

    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.services.lifecycle import release_images
    from prewarm_devtools.sam.template import create_table, load_template

    print_machine()
    same_repository = len(range(0, jobs, repositories))
    print(f"release_reads: {jobs} jobs over {repositories} repositories ({same_repository} of the released job's), "
          f"{nodes} nodes each")
    for name, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "bench",
                        "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(name, value)
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        create_table(client, load_template(), TABLE)
        store = DynamoJobStore(TABLE, client=client)
        started = time.perf_counter()
        names = [f"ip-10-0-{n // 250}-{n % 250}.us-west-2.compute.internal" for n in range(nodes)]
        keys = seed(store, jobs, repositories, names, now=time.time())
        print(f"  seeded in {time.perf_counter() - started:.1f} s")
        record = store.get_job(keys[0])
        reads = Reads(client)
        # Once in a table's life, the first reader of the `images` index indexes the job items written before
        # it (every job read); then once per function instance, a read of its marker. Not counted below.
        backfill_started = time.perf_counter()
        store.list_image_jobs("", "registry.example/none")
        backfill = {"items_read": reads.items, "seconds": round(time.perf_counter() - backfill_started, 1)}
        reads.clear()
        every_job_way(store, record)
        baseline = {"items_read": reads.items, "read_units": reads.units, "calls": dict(reads.calls)}
        reads.clear()
        sink = Sink()
        release_images(store, sink, record, remove_after=GRACE_S)
        ours = {"items_read": reads.items, "read_units": reads.units, "calls": dict(reads.calls),
                "releases_sent": sink.sent}
    print(f"  the index's backfill, once per table: {backfill['items_read']} items read")
    for name, figures in (("every job (baseline)", baseline), ("Prewarm's", ours)):
        print(f"  {name}: {figures['items_read']} items read, {figures['read_units']:g} read units, "
              f"calls {figures['calls']}")
    # What a release needs at most: its own node items, the index keys and items of its repository's jobs
    # (its own among them), and the other jobs' node items on its nodes.
    needed = nodes + 2 * same_repository + (same_repository - 1) * nodes
    met = print_targets([Target("items read per release", ours["items_read"], needed)])
    return {"jobs": jobs, "repositories": repositories, "nodes": nodes, "same_repository_jobs": same_repository,
            "baseline": baseline, "prewarm": ours, "index_backfill_once": backfill, "targets_met": met}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="job items stored (default 10000)")
    parser.add_argument("--repositories", type=int, default=1000, help="repositories they pull (default 1000)")
    parser.add_argument("--nodes", type=int, default=20, help="nodes of each job of the released repository")
    args = parser.parse_args(argv)
    if args.jobs < 2 or not 1 <= args.repositories <= args.jobs // 2 or args.nodes < 1:
        parser.error("--jobs at least 2, --repositories between 1 and half of --jobs, --nodes at least 1")
    emit(benchmark(args.jobs, args.repositories, args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
