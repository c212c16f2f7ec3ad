"""events/*.json: the sample events are the shapes AWS delivers, with bodies our own code accepts.

Handler tests feed these files to the handlers, so a sample that drifts from the real shape, or from
the message schema, would make those tests prove nothing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import DynamoDBStreamModel, EventBridgeModel, SqsModel

from prewarm.domain.messages import Hello, StatusReport, node_queue_name, parse_agent_message

EVENTS = Path(__file__).resolve().parents[2] / "events"

ECR_EVENTS = ["ecr_push.json", "ecr_push_failed.json", "ecr_delete.json", "ecr_push_index.json"]
STREAM_EVENTS = ["dynamodb_stream_job_insert.json", "dynamodb_stream_job_modify.json"]
SQS_EVENTS = ["sqs_status_batch.json"]
SCHEDULE_EVENTS = ["schedule_repull.json", "schedule_sweep.json", "schedule_refresh_credentials.json",
                   "schedule_sync_resources.json", "schedule_bake_snapshots.json"]
EC2_EVENTS = ["ebs_snapshot_notification.json"]
ECR_OTHER_EVENTS = ["ecr_replication.json", "ecr_pull_through_cache.json"]

JOB_COUNTERS = ("desired", "waiting", "active", "succeeded", "failed", "done")


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return loaded


CRON_RUN_EVENTS = ["schedule_run_cron_job.json"]


def test_every_sample_event_is_checked_here() -> None:
    checked = set(ECR_EVENTS + ECR_OTHER_EVENTS + STREAM_EVENTS + SQS_EVENTS + SCHEDULE_EVENTS + EC2_EVENTS
                  + CRON_RUN_EVENTS)
    assert {p.name for p in EVENTS.glob("*.json")} == checked


# -- EBS (EventBridge) ------------------------------------------------------------------------


def test_the_ebs_snapshot_notification_names_its_snapshot_and_result() -> None:
    from prewarm.events import EventError, parse_snapshot_notification

    notice = parse_snapshot_notification(load("ebs_snapshot_notification.json"))
    assert (notice.snapshot_id, notice.succeeded) == ("snap-0a1b2c3d4e5f60718", True)
    broken = load("ebs_snapshot_notification.json")
    broken["detail"]["snapshot_id"] = "snap-1"
    with pytest.raises(EventError, match=r"detail\.snapshot_id"):
        parse_snapshot_notification(broken)


# -- ECR (EventBridge) ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ECR_EVENTS)
def test_ecr_events_parse_as_eventbridge_image_actions(name: str) -> None:
    event = EventBridgeModel.model_validate(load(name))
    assert (event.source, event.detail_type) == ("aws.ecr", "ECR Image Action")
    detail = event.detail
    assert isinstance(detail, dict)
    assert {"result", "repository-name", "image-digest", "action-type", "image-tag"} <= detail.keys()
    assert detail["image-digest"].startswith("sha256:") and len(detail["image-digest"]) == 71


def test_push_event_carries_both_media_types() -> None:
    detail = load("ecr_push.json")["detail"]
    assert (detail["action-type"], detail["result"]) == ("PUSH", "SUCCESS")
    assert detail["manifest-media-type"] == "application/vnd.oci.image.manifest.v1+json"
    assert detail["artifact-media-type"] == "application/vnd.oci.image.config.v1+json"


@pytest.mark.parametrize(
    ("name", "action", "result"),
    [("ecr_push_failed.json", "PUSH", "FAILURE"), ("ecr_delete.json", "DELETE", "SUCCESS")],
)
def test_the_events_on_image_push_must_ignore_are_what_they_claim(name: str, action: str, result: str) -> None:
    detail = load(name)["detail"]
    assert (detail["action-type"], detail["result"]) == (action, result)


def test_a_replication_event_names_the_source_push_and_the_region_replicated_to() -> None:
    from prewarm.events import EcrReplicationActionEvent, parse_ecr_event

    event = parse_ecr_event(load("ecr_replication.json"))
    assert isinstance(event, EcrReplicationActionEvent) and event.is_successful
    push = event.to_push()
    assert (push.region, event.region, push.repository, push.tag) == ("us-west-2", "eu-west-1", "platform/web", "v2")
    assert push.digest == "sha256:7f5b2640fe6fb4f46592dfd3410c4a79dac4f89e4782432e0378abcd1234abcd"
    failed = load("ecr_replication.json")
    failed["detail"]["result"] = "FAILED"
    assert not parse_ecr_event(failed).is_successful  # type: ignore[union-attr]


def test_a_pull_through_cache_event_is_a_push_of_the_cache_repository() -> None:
    from prewarm.events import EcrPullThroughCacheActionEvent, parse_ecr_event

    event = parse_ecr_event(load("ecr_pull_through_cache.json"))
    assert isinstance(event, EcrPullThroughCacheActionEvent) and event.is_successful_push
    push = event.to_push()
    assert (push.repository, push.tag, push.region) == ("docker-hub/alpine", "3.17.2", "us-west-2")


def test_an_ecr_event_of_another_kind_or_shape_is_named() -> None:
    from prewarm.events import EventError, parse_ecr_event

    with pytest.raises(EventError, match="detail-type: 'ECR Image Scan' is not one of"):
        parse_ecr_event({**load("ecr_replication.json"), "detail-type": "ECR Image Scan"})
    broken = load("ecr_replication.json")
    del broken["detail"]["source-region"]
    with pytest.raises(EventError, match=r"invalid ECR Replication Action event: detail\.source-region"):
        parse_ecr_event(broken)


def test_index_push_names_an_oci_image_index() -> None:
    detail = load("ecr_push_index.json")["detail"]
    assert (detail["action-type"], detail["result"]) == ("PUSH", "SUCCESS")
    assert detail["manifest-media-type"] == "application/vnd.oci.image.index.v1+json"


# -- DynamoDB stream --------------------------------------------------------------------------


@pytest.mark.parametrize("name", STREAM_EVENTS)
def test_stream_events_are_job_items_with_both_images_view(name: str) -> None:
    event = DynamoDBStreamModel.model_validate(load(name))
    assert event.Records
    for record in event.Records:
        change = record.dynamodb
        assert change.StreamViewType == "NEW_AND_OLD_IMAGES"
        # Keys only `pk`/`sk`, and the job item's sort key: what the event source filter lets through
        assert change.Keys.keys() == {"pk", "sk"}
        assert change.Keys["sk"] == "JOB" and change.Keys["pk"].startswith("JOB#")
        assert isinstance(change.NewImage, dict)
        image = change.NewImage
        assert {k: image[k] for k in ("pk", "sk")} == change.Keys
        assert image["kind"] == "job"
        assert image["pk"] == f"JOB#{image['namespace']}/{image['name']}"
        assert all(int(image[c]) >= 0 for c in JOB_COUNTERS)
        assert image["done"] == image["succeeded"] + image["failed"]
        assert image["desired"] == image["waiting"] + image["active"] + image["succeeded"] + image["failed"]
        spec = json.loads(image["spec"])
        assert (spec["kind"], spec["metadata"]["name"]) == (image["api_kind"], image["name"])
        assert len(image["spec_hash"]) == 64


def test_insert_is_a_new_job_not_yet_dispatched() -> None:
    [record] = DynamoDBStreamModel.model_validate(load("dynamodb_stream_job_insert.json")).Records
    assert record.eventName == "INSERT"
    assert record.dynamodb.OldImage is None
    image = record.dynamodb.NewImage
    assert isinstance(image, dict)
    assert (image["generation"], image["round"], image["planned"], image["state"]) == (1, 0, "", "Running")


def test_modify_is_a_spec_change_of_a_dispatched_job() -> None:
    [record] = DynamoDBStreamModel.model_validate(load("dynamodb_stream_job_modify.json")).Records
    assert record.eventName == "MODIFY"
    old, new = record.dynamodb.OldImage, record.dynamodb.NewImage
    assert isinstance(old, dict) and isinstance(new, dict)
    assert new["generation"] == old["generation"] + 1
    assert new["spec_hash"] != old["spec_hash"]
    assert new["uid"] == old["uid"] and new["planned"] == old["planned"] == "1.0"
    assert json.loads(new["spec"])["spec"]["parallelism"] != json.loads(old["spec"])["spec"]["parallelism"]


# -- SQS status batch -------------------------------------------------------------------------


def test_status_batch_parses_as_sqs_and_every_body_as_an_agent_message() -> None:
    event = SqsModel.model_validate(load("sqs_status_batch.json"))
    messages = []
    for record in event.Records:
        assert isinstance(record.body, str)
        # SQS checksums the body with MD5
        assert record.md5OfBody == hashlib.md5(record.body.encode(), usedforsecurity=False).hexdigest()
        messages.append(parse_agent_message(record.body))
    phases = {m.phase for m in messages if isinstance(m, StatusReport)}
    assert phases == {"Pulling", "Succeeded", "Failed"}
    assert any(isinstance(m, Hello) for m in messages)


def test_hello_in_the_batch_names_the_queue_the_control_plane_derives() -> None:
    bodies = [parse_agent_message(r["body"]) for r in load("sqs_status_batch.json")["Records"]]
    [hello] = [m for m in bodies if isinstance(m, Hello)]
    assert hello.queue_url.rsplit("/", 1)[1] == node_queue_name("prewarm-node", hello.node)


# -- schedules --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULE_EVENTS)
def test_schedule_events_carry_the_filled_in_scheduler_context(name: str) -> None:
    event = load(name)
    assert event["schedule_arn"].startswith("arn:aws:scheduler:")
    assert datetime.fromisoformat(event["scheduled_time"]).tzinfo is not None
    assert event["execution_id"] and int(event["attempt_number"]) >= 1
    assert "<aws.scheduler." not in json.dumps(event)


def test_a_cron_jobs_schedule_names_the_cron_job_and_its_filled_in_scheduled_time() -> None:
    # adapters/scheduler.py's Input, as Scheduler fills in <aws.scheduler.scheduled-time>
    event = load("schedule_run_cron_job.json")
    assert set(event) == {"cronJob", "scheduledTime"}
    assert "/" in event["cronJob"] and datetime.fromisoformat(event["scheduledTime"]).tzinfo is not None
    assert "<aws.scheduler." not in json.dumps(event)


@pytest.mark.parametrize("name", STREAM_EVENTS)
def test_stream_records_read_as_powertools_reads_them(name: str) -> None:
    """dispatch_job reads stream records itself (a lighter import): the images and sequence numbers
    must be what Powertools' DynamoDBRecord gives, numbers as Decimal."""
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

    from prewarm.events import parse_stream_record

    for raw in json.loads((EVENTS / name).read_text())["Records"]:
        ours, theirs = parse_stream_record(raw), DynamoDBRecord(raw)
        assert theirs.dynamodb is not None
        assert ours.new_image == (theirs.dynamodb.new_image or None)
        assert ours.old_image == (theirs.dynamodb.old_image or None)
        assert ours.sequence_number == theirs.dynamodb.sequence_number
        assert ours.partition_key == (theirs.dynamodb.keys or {})["pk"]


def test_stream_record_without_images() -> None:
    from prewarm.events import parse_stream_record

    record = parse_stream_record({"eventName": "REMOVE", "dynamodb": {"Keys": {"pk": {"S": "JOB#a/b"}},
                                                                      "SequenceNumber": "7"}})
    assert (record.new_image, record.old_image, record.sequence_number, record.partition_key) == (
        None, None, "7", "JOB#a/b")
    assert (parse_stream_record({}).sequence_number, parse_stream_record({}).partition_key) == (None, "")


@pytest.mark.parametrize("name", ECR_EVENTS)
def test_eventbridge_envelope_matches_powertools(name: str) -> None:
    """on_image_push declares the EventBridge envelope itself (a lighter import): same fields as
    Powertools' EventBridgeModel on every ECR sample."""
    from prewarm.events import EventBridgeEnvelope

    raw = json.loads((EVENTS / name).read_text())
    ours, theirs = EventBridgeEnvelope.model_validate(raw), EventBridgeModel.model_validate(raw)
    assert ours.model_dump() == theirs.model_dump(include=set(ours.model_dump()))
