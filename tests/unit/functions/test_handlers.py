"""Every sample event in `events/` is fed to its handler; the handler does what the event asks."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from prewarm import bootstrap
from prewarm.domain.jobs import PIN_ANNOTATION, job_key
from prewarm.domain.messages import ReleaseImage, StatusReport
from prewarm.services.jobs import apply_manifest, view_job
from prewarm.services.reports import record_report
from tests.support.cluster import make_node
from tests.support.control_plane import take_node_messages
from tests.support.events import load_event
from tests.support.handlers import load_handler
from tests.support.lambda_stack import REGION
from tests.support.manifests import job_doc

RULE = {
    "apiVersion": "prewarm.dev/v1alpha1",
    "kind": "PrewarmRule",
    "metadata": {"name": "inference"},
    "spec": {"repositories": ["ml/*", "platform/*"], "tags": ["v*", "1.*"],
             "template": {"metadata": {"namespace": "ml"}, "spec": {"parallelism": 4}}},
}


def test_ecr_push_creates_one_job_per_matching_rule_pinned_to_the_digest(stack: dict[str, Any]) -> None:
    bootstrap.store().put_rule("inference", RULE, "h")
    apply_manifest(bootstrap.store(), RULE, now=1.0)
    event = load_event("ecr_push")
    result = load_handler("on_image_push").lambda_handler(event, stack["ctx"])
    digest = event["detail"]["image-digest"]
    name = f"inference-{digest.split(':')[1][:12]}"
    assert result == {"jobs": [f"imagepulljob.apps.kruise.io/{name} created"]}
    record = bootstrap.store().get_job(f"ml/{name}")
    assert record is not None
    assert record.manifest["spec"]["image"] == f"123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/inference@{digest}"
    again = load_handler("on_image_push").lambda_handler(event, stack["ctx"])  # EventBridge may deliver twice
    assert again == {"jobs": [f"imagepulljob.apps.kruise.io/{name} unchanged"]}


def test_failed_pushes_and_deletes_are_ignored(stack: dict[str, Any]) -> None:
    apply_manifest(bootstrap.store(), RULE, now=1.0)
    handler = load_handler("on_image_push")
    for name in ("ecr_push_failed", "ecr_delete"):
        assert handler.lambda_handler(load_event(name), stack["ctx"]) == {"jobs": []}
    assert bootstrap.store().list_jobs() == []


def test_index_push_reads_platforms_from_ecr(stack: dict[str, Any]) -> None:
    apply_manifest(bootstrap.store(), RULE, now=1.0)
    event = load_event("ecr_push_index")
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 500,
             "digest": "sha256:" + "1" * 64, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 500,
             "digest": "sha256:" + "2" * 64, "platform": {"os": "unknown", "architecture": "unknown"}},
        ],
    }
    ecr = boto3.client("ecr", region_name=REGION)
    ecr.create_repository(repositoryName="platform/web")
    ecr.put_image(repositoryName="platform/web", imageManifest=json.dumps(index), imageTag="1.18.0",
                  imageManifestMediaType="application/vnd.oci.image.index.v1+json")
    digest = ecr.describe_images(repositoryName="platform/web")["imageDetails"][0]["imageDigest"]
    event["detail"]["image-digest"] = digest
    load_handler("on_image_push").lambda_handler(event, stack["ctx"])
    (record,) = bootstrap.store().list_jobs()
    assert record.platforms == [{"os": "linux", "architecture": "arm64", "variant": "v8"}]


def _seed_stream_image(stack: dict[str, Any], name: str) -> dict[str, Any]:
    event = load_event(name)
    image = event["Records"][0]["dynamodb"]["NewImage"]
    stack["ddb"].put_item(TableName="jobs", Item=image)
    spec = json.loads(image["spec"]["S"])
    stack["cluster"].nodes += [make_node(f"ip-10-0-9-{i}.ec2.internal", **(spec["spec"].get("selector", {})
                                                                             .get("matchLabels", {})))
                               for i in range(3)]
    return event


def test_job_stream_insert_plans_the_job_and_sends_first_tasks(stack: dict[str, Any]) -> None:
    event = _seed_stream_image(stack, "dynamodb_stream_job_insert")
    nodes = [n["metadata"]["name"] for n in stack["cluster"].nodes]
    urls = [bootstrap.node_queues().ensure_queue(n) for n in nodes]  # as each node's agent does at start
    result = load_handler("dispatch_job").lambda_handler(event, stack["ctx"])
    assert result == {"batchItemFailures": []}
    view = view_job(bootstrap.store(), "ml", "warm-inference", now=2e9)
    assert view.desired == 3 and view.active == 2  # parallelism 2
    waiting = [int(stack["sqs"].get_queue_attributes(QueueUrl=u, AttributeNames=["ApproximateNumberOfMessages"])
                   ["Attributes"]["ApproximateNumberOfMessages"]) for u in urls]
    assert sorted(waiting) == [0, 1, 1]
    assert len(stack["sqs"].list_queues(QueueNamePrefix="pw-")["QueueUrls"]) == 3  # the agents' own, no more


def test_job_stream_modify_re_plans(stack: dict[str, Any]) -> None:
    event = _seed_stream_image(stack, "dynamodb_stream_job_modify")
    assert load_handler("dispatch_job").lambda_handler(event, stack["ctx"]) == {"batchItemFailures": []}
    record = bootstrap.store().get_job("ml/warm-inference")
    assert record is not None and record.planned == record.plan_id


def test_status_batch_applies_reports_and_registers_the_hello(stack: dict[str, Any]) -> None:
    event = load_event("sqs_status_batch")
    result = load_handler("record_status").lambda_handler(event, stack["ctx"])
    assert result == {"batchItemFailures": []}  # reports of an unknown job are dropped, not retried
    assert [n.name for n in bootstrap.store().list_nodes()] == ["ip-10-0-4-9.ec2.internal"]


def test_poison_status_message_fails_only_itself(stack: dict[str, Any]) -> None:
    event = load_event("sqs_status_batch")
    event["Records"][0]["body"] = '{"v": 1, "kind": "status", "phase": "Exploded"}'
    result = load_handler("record_status").lambda_handler(event, stack["ctx"])
    assert result == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}


def test_a_batch_tells_the_status_queue_of_returns_on_the_task_queues_sqs_client(stack: dict[str, Any]) -> None:
    # Given a batch that hands nothing back
    handler = load_handler("record_status")
    assert handler.lambda_handler(load_event("sqs_status_batch"), stack["ctx"]) == {"batchItemFailures": []}
    # Then no redelivery was told, so no status queue adapter was built
    assert bootstrap.status_queue.cache_info().currsize == 0
    # When a batch hands a poison message back
    event = load_event("sqs_status_batch")
    event["Records"][0]["body"] = '{"v": 1, "kind": "status", "phase": "Exploded"}'
    assert handler.lambda_handler(event, stack["ctx"])["batchItemFailures"]
    # Then its redelivery is told through the SQS client the task queues already hold, not a second one
    assert bootstrap.status_queue.cache_info().currsize == 1
    assert bootstrap.status_queue().client is bootstrap.node_queues().client


def test_schedules_run_their_use_cases(stack: dict[str, Any]) -> None:
    assert load_handler("repull_daily").lambda_handler(load_event("schedule_repull"), stack["ctx"]) == {
        "rounds_started": []}
    summary = load_handler("sweep").lambda_handler(load_event("schedule_sweep"), stack["ctx"])
    assert summary["deadline_failed"] == [] and summary["expired"] == []


def test_reset_forgets_every_adapter_the_composition_root_built(monkeypatch: Any) -> None:
    # Every cached builder of bootstrap (the settings among them): one reset() misses keeps a client of the
    # environment before, for the next test that changes it
    cleared: list[str] = []
    cached = {name: value for name, value in vars(bootstrap).items() if hasattr(value, "cache_clear")}
    for name, value in cached.items():
        monkeypatch.setattr(value, "cache_clear", lambda name=name: cleared.append(name))
    bootstrap.reset()
    assert "eks_client" in cached and sorted(cleared) == sorted(cached)


def test_job_stream_modify_that_removes_the_pin_unpins_the_image_on_its_nodes(stack: dict[str, Any]) -> None:
    node = "ip-10-0-9-1.ec2.internal"
    stack["cluster"].nodes.append(make_node(node))
    url = bootstrap.node_queues().ensure_queue(node)
    store, key = bootstrap.store(), job_key("default", "pinned")
    doc = job_doc("pinned", image="registry.example/app:v1", parallelism=1, selector={"names": [node]})
    doc["metadata"]["annotations"] = {PIN_ANNOTATION: "true"}
    # Given a pinned job whose pull succeeded on its node
    apply_manifest(store, doc, now=1.0)
    bootstrap.plan_job(key)
    record = store.get_job(key)
    assert record is not None
    record_report(store, bootstrap.queues(), StatusReport(job=key, job_uid=record.uid, round=0, node=node,
                                                          phase="Succeeded", attempt=1, seq=1), now=2.0)
    take_node_messages(stack["sqs"], url)
    raw = {"TableName": "jobs", "Key": {"pk": {"S": f"JOB#{key}"}, "sk": {"S": "JOB"}}}
    old = stack["ddb"].get_item(**raw)["Item"]

    # When it is applied again without the annotation, and the stream hands dispatch_job the change
    del doc["metadata"]["annotations"]
    assert apply_manifest(store, doc, now=3.0).outcome == "configured"
    event = load_event("dynamodb_stream_job_modify")
    event["Records"][0]["dynamodb"].update(OldImage=old, NewImage=stack["ddb"].get_item(**raw)["Item"])
    assert load_handler("dispatch_job").lambda_handler(event, stack["ctx"]) == {"batchItemFailures": []}

    # Then the node is told to unpin the image and to keep it (the job still wants it)
    released = [(m.image, m.unpin, m.remove_after) for m in take_node_messages(stack["sqs"], url)
                if isinstance(m, ReleaseImage)]
    assert released == [("registry.example/app:v1", True, None)]


def test_dispatch_runs_each_jobs_records_in_order_and_reports_the_earliest_failure(
        stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    handler = load_handler("dispatch_job")
    handled: list[tuple[str, str]] = []

    def plan_record(record: Any) -> None:
        if (record.partition_key, record.sequence_number) == ("JOB#ml/b", "2"):
            raise RuntimeError("a send refused")
        handled.append((record.partition_key, record.sequence_number))

    monkeypatch.setattr(handler, "plan_record", plan_record)
    records = [{"eventName": "MODIFY", "dynamodb": {"Keys": {"pk": {"S": pk}}, "SequenceNumber": seq}}
               for pk, seq in (("JOB#ml/a", "1"), ("JOB#ml/b", "2"), ("JOB#ml/a", "3"), ("JOB#ml/b", "4"))]
    # The stream retries from the earliest failed record; the other job's records were handled, in order
    answer = handler.lambda_handler({"Records": records}, stack["ctx"])
    assert answer == {"batchItemFailures": [{"itemIdentifier": "2"}]}
    assert handled == [("JOB#ml/a", "1"), ("JOB#ml/a", "3")]
