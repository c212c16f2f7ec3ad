"""`prewarm delete job` stops in-flight pulls on every node within 2 s, through the control plane.

A real local stack (as `prewarm local up` runs it: agents as processes signing as the agents' role,
a private containerd per node, the registry behind a bandwidth-limiting proxy, the node-queue policy
evaluated per principal). The operator applies a job over two nodes with the CLI, waits until both
containerds are receiving layer bytes, and deletes the job with the CLI. The operator may not send to
a node queue, so the cancels can only come from `dispatch_job`, which sees the job's stream record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from prewarm.domain.messages import node_queue_name
from prewarm_agent.cri.client import ContentStatusReader
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from prewarm_devtools.localnodes import LocalNode
from prewarm_devtools.node.agent import agent_output_path
from prewarm_devtools.node.throttle import ConnectionRecord, ThrottlingProxy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node, pytest.mark.timed,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

PREWARM = str(Path(sys.executable).with_name("prewarm"))
MIB = 1024 * 1024
IMAGE_MB = 32
# Shared by the nodes: two pulls at about 1 MiB/s each, so 32 MiB takes about 32 s (16 s alone).
BANDWIDTH = 2 * MIB
# Issue #14: seconds from `prewarm delete` returning (and from the job marked Deleting) to every download stopped.
STOP_WITHIN = 2.0
# After the bound, how long nothing may flow any more for the downloads to count as stopped.
STILL_FOR = 1.0
# More than any manifest or config: a connection that carried this much was downloading the layer.
LAYER_BYTES = 100_000
NAMESPACE, JOB = "default", "big-delete-me"


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalMode]:
    monkeypatch.setenv("PREWARM_LOCAL_STATE", str(tmp_path / "local.json"))
    with LocalMode(nodes=2, agent_processes=True, registry_bandwidth=BANDWIDTH) as mode:
        yield mode


def prewarm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI, as the operator (it signs with the operator's key on a local stack)."""
    return subprocess.run([PREWARM, *args], capture_output=True, text=True, env=dict(os.environ),
                          timeout=timeout, check=False)


def job_manifest(image: str, nodes: list[str]) -> str:
    return json.dumps({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {"image": image, "parallelism": len(nodes), "selector": {"names": nodes},
                 "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 300}, "completionPolicy": {"type": "Always"}},
    })


def ingested(node: LocalNode) -> int:
    """Layer bytes containerd of `node` has written so far for downloads still in flight."""
    with ContentStatusReader(str(node.containerd.socket_path)) as reader:
        return sum(s.offset for s in reader.list_statuses() if s.ref.startswith("layer-"))


def layer_downloads(proxy: ThrottlingProxy) -> list[ConnectionRecord]:
    return [c for c in proxy.connections() if c.bytes_to_client > LAYER_BYTES]



def logged_at(log: Path, message: str) -> float | None:
    """The wall-clock time of the first JSON log line of `log` whose message starts with `message`."""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{") and str((entry := json.loads(line)).get("message", "")).startswith(message):
            stamp = entry.get("time") or entry.get("timestamp")
            return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    return None


def test_delete_stops_every_nodes_download_within_two_seconds(local: LocalMode, tmp_path: Path) -> None:
    assert local.aws is not None and local.stack is not None and local.registry_proxy is not None
    proxy: ThrottlingProxy = local.registry_proxy
    store = local.job_store()
    nodes = sorted(local.nodes)
    assert len(nodes) == 2

    # Given a 32 MiB image pulled onto both nodes, applied by the operator with the CLI ...
    pushed = local.push("e2e/big", "v1", size_mb=IMAGE_MB)
    manifest = tmp_path / "job.json"
    manifest.write_text(job_manifest(pushed.reference, nodes), encoding="utf-8")
    applied = prewarm("--local", "apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    # ... and both containerds receiving its layer
    wait_until(lambda: all(ingested(local.nodes[n]) > 0 for n in nodes), 20, "both nodes' layer downloads")
    assert len(layer_downloads(proxy)) == len(nodes)
    # ... whose node queues refuse the operator's own sends: only the stack's roles may send there
    sqs = local.aws.client("sqs")  # the operator's key, as the CLI signs
    for node in nodes:
        url = sqs.get_queue_url(QueueName=node_queue_name(local.stack.env()["NODE_QUEUE_PREFIX"], node))["QueueUrl"]
        with pytest.raises(ClientError) as refused:
            sqs.send_message(QueueUrl=url, MessageBody="{}")
        assert refused.value.response["Error"]["Code"] == "AccessDenied"

    # When the operator deletes the job with the CLI
    reader, invoked = stream_reader(local), time.monotonic()
    deleted = prewarm("--local", "delete", "job", JOB, "-n", NAMESPACE)
    returned, returned_wall = time.monotonic(), time.time()
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f'imagepulljob.apps.kruise.io "{JOB}" deleted (2 in-flight pulls being cancelled)\n'
    marked = marked_deleting_at(local, reader)
    assert marked is not None, "no stream record of the job marked Deleting"

    # Then within 2 s of the delete returning (and of the job marked Deleting) every node's containerd
    # hung up on the registry ...
    proxy.wait_for(lambda p: not any(c.open for c in layer_downloads(p)), timeout=STOP_WITHIN + 3)
    downloads = layer_downloads(proxy)
    stopped = [c.upstream_closed_at - returned for c in downloads if c.upstream_closed_at is not None]

    def timings() -> str:
        return breakdown(local, returned_wall, marked, stopped)

    assert len(stopped) == len(nodes) and all(c.closed_by == "client" for c in downloads), (downloads, timings())
    assert max(stopped) < STOP_WITHIN, timings()
    assert returned_wall + max(stopped) - marked < STOP_WITHIN, timings()
    # ... nothing flows and no ingest grows afterwards, and no node has the image
    time.sleep(max(0.0, returned + STOP_WITHIN - time.monotonic()))
    forwarded, ingests = proxy.bytes_to_client, {n: ingested(local.nodes[n]) for n in nodes}
    time.sleep(STILL_FOR)
    assert proxy.bytes_to_client == forwarded < len(nodes) * IMAGE_MB * MIB
    assert all(ingested(local.nodes[n]) in (0, ingests[n]) for n in nodes)
    assert not any(local.nodes[n].image_present(pushed.reference) for n in nodes)
    # ... each agent reported the pull Cancelled, and the job is gone from the table
    wait_until(lambda: all(logged_at(agent_output_path(local.logs_dir, n), "Cancelled job deleted") for n in nodes),
             5, "every agent reporting Cancelled")
    wait_until(lambda: store.get_job(f"{NAMESPACE}/{JOB}") is None, 10, "the job leaving the table")
    assert not store.get_tasks(f"{NAMESPACE}/{JOB}")
    assert JOB not in prewarm("--local", "get", "jobs").stdout
    print(f"\ndelete ran {returned - invoked:.3f} s; {timings()}")


def breakdown(local: LocalMode, returned: float, marked: float, stopped: list[float]) -> str:
    """Where the time went, in seconds from the delete command returning (wall clock)."""
    assert local.function_log is not None
    local.function_log.flush()
    finished = logged_at(local.logs_dir / "functions.log", "deleted")
    steps = [("marked Deleting", marked), ("dispatch_job finished the deletion", finished)]
    for node in sorted(local.nodes):
        log = agent_output_path(local.logs_dir, node)
        steps += [(f"{node}: cancelling", logged_at(log, "cancelling the pull")),
                  (f"{node}: Cancelled", logged_at(log, "Cancelled job deleted"))]
    steps += [("download stopped", returned + s) for s in stopped]
    return "; ".join(f"{what} {at - returned:+.3f}" if at else f"{what} not seen" for what, at in steps)


def stream_reader(local: LocalMode) -> str:
    """A reader of the jobs table's stream from now on (the local limits layer keeps what it has not read)."""
    assert local.aws is not None and local.stack is not None
    streams = local.aws.client("dynamodbstreams")
    arn = local.stack.physical["JobsTable"].attrs["StreamArn"]
    (shard,) = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                          ShardIteratorType="LATEST")["ShardIterator"]
    return str(streams.get_records(ShardIterator=iterator)["NextShardIterator"])


def marked_deleting_at(local: LocalMode, iterator: str) -> float | None:
    """When the CLI marked the job Deleting (its `deleting_since`), read from the table's stream."""
    assert local.aws is not None
    streams = local.aws.client("dynamodbstreams")
    while records := (out := streams.get_records(ShardIterator=iterator))["Records"]:
        for record in records:
            new = record["dynamodb"].get("NewImage", {})
            if new.get("sk", {}).get("S") == "JOB" and new.get("state", {}).get("S") == "Deleting":
                return float(new["deleting_since"]["N"])
        iterator = out["NextShardIterator"]
    return None
