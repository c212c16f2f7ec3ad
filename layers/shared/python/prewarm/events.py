"""Typed shapes of the events the functions receive.

The table's stream records are read here too, not with Powertools' `DynamoDBRecord`: its package
imports every event data class (about 20 ms of dispatch_job's cold start).

The EventBridge envelope is declared here, with the fields of Powertools' `EventBridgeModel`, rather
than imported: `aws_lambda_powertools.utilities.parser.models` builds every event model Powertools
knows (SQS, SNS, API Gateway, ...) on import, about 60 ms of on_image_push's cold start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prewarm.domain.push import ImagePush
from prewarm.domain.validation import describe_validation_error


class EcrImageAction(BaseModel):
    """`detail` of the EventBridge "ECR Image Action" event."""

    model_config = ConfigDict(populate_by_name=True)
    result: str
    repository_name: str = Field(alias="repository-name", min_length=2, max_length=256)  # ECR: 2 to 256
    image_digest: str = Field(default="", alias="image-digest")
    action_type: str = Field(alias="action-type")
    image_tag: str | None = Field(default=None, alias="image-tag")
    manifest_media_type: str = Field(default="", alias="manifest-media-type")
    artifact_media_type: str = Field(default="", alias="artifact-media-type")


class EventBridgeEnvelope(BaseModel):
    """What EventBridge puts around every event's `detail` (each event declares its own `detail`)."""

    model_config = ConfigDict(populate_by_name=True)
    version: str
    id: str
    source: str
    account: str
    time: datetime
    region: str
    resources: list[str]
    detail_type: str = Field(alias="detail-type")
    replay_name: str | None = Field(default=None, alias="replay-name")


class EcrImageActionEvent(EventBridgeEnvelope):
    source: Literal["aws.ecr"]
    detail_type: Literal["ECR Image Action"] = Field(alias="detail-type")
    detail: EcrImageAction

    @property
    def is_successful_push(self) -> bool:
        return self.detail.action_type == "PUSH" and self.detail.result == "SUCCESS" and bool(self.detail.image_digest)

    def to_push(self) -> ImagePush:
        return ImagePush(
            account=self.account, region=self.region, repository=self.detail.repository_name,
            digest=self.detail.image_digest, tag=self.detail.image_tag or None,
            manifest_media_type=self.detail.manifest_media_type,
        )


class EcrReplicationAction(BaseModel):
    """`detail` of "ECR Replication Action", sent in the destination Region (the envelope's `region`) when
    ECR copied an image there from `source-region`."""

    model_config = ConfigDict(populate_by_name=True)
    result: str
    repository_name: str = Field(alias="repository-name", min_length=2, max_length=256)  # ECR: 2 to 256
    image_digest: str = Field(alias="image-digest", min_length=1)
    action_type: str = Field(alias="action-type")
    source_account: str = Field(alias="source-account", min_length=1)
    source_region: str = Field(alias="source-region", min_length=1)
    image_tag: str | None = Field(default=None, alias="image-tag")


class EcrReplicationActionEvent(EventBridgeEnvelope):
    source: Literal["aws.ecr"]
    detail_type: Literal["ECR Replication Action"] = Field(alias="detail-type")
    detail: EcrReplicationAction

    @property
    def is_successful(self) -> bool:
        return self.detail.action_type == "REPLICATE" and self.detail.result == "SUCCESS"

    def to_push(self) -> ImagePush:
        """The push that was replicated, as its source Region announced it."""
        d = self.detail
        return ImagePush(account=d.source_account, region=d.source_region, repository=d.repository_name,
                         digest=d.image_digest, tag=d.image_tag or None)


class EcrPullThroughCacheAction(BaseModel):
    """`detail` of "ECR Pull Through Cache Action": an upstream image cached into `repository-name`."""

    model_config = ConfigDict(populate_by_name=True)
    sync_status: str = Field(alias="sync-status")
    repository_name: str = Field(alias="repository-name", min_length=2, max_length=256)  # ECR: 2 to 256
    image_digest: str = Field(default="", alias="image-digest")
    image_tag: str | None = Field(default=None, alias="image-tag")
    upstream_registry_url: str = Field(default="", alias="upstream-registry-url")


class EcrPullThroughCacheActionEvent(EventBridgeEnvelope):
    source: Literal["aws.ecr"]
    detail_type: Literal["ECR Pull Through Cache Action"] = Field(alias="detail-type")
    detail: EcrPullThroughCacheAction

    @property
    def is_successful_push(self) -> bool:
        return self.detail.sync_status == "SUCCESS" and bool(self.detail.image_digest)

    def to_push(self) -> ImagePush:
        """The cached image as a push to its cache repository: rules match that repository's name."""
        return ImagePush(account=self.account, region=self.region, repository=self.detail.repository_name,
                         digest=self.detail.image_digest, tag=self.detail.image_tag or None)


EcrEvent = EcrImageActionEvent | EcrReplicationActionEvent | EcrPullThroughCacheActionEvent
_ECR_EVENTS: dict[str, type[EcrEvent]] = {
    "ECR Image Action": EcrImageActionEvent, "ECR Replication Action": EcrReplicationActionEvent,
    "ECR Pull Through Cache Action": EcrPullThroughCacheActionEvent,
}


class EventError(ValueError):
    """An event that is not one of the ECR events the rules deliver; names each field at fault."""


def parse_ecr_event(event: Any) -> EcrEvent:
    """The event as the ECR event its `detail-type` names, or `EventError` naming every field at fault."""
    kind = event.get("detail-type") if isinstance(event, Mapping) else None
    model = _ECR_EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise EventError(f"invalid ECR event: detail-type: {kind!r} is not one of {', '.join(_ECR_EVENTS)}")
    try:
        return model.model_validate(event)
    except ValidationError as e:
        problems = describe_validation_error(e, subject="event")
        raise EventError(f"invalid {kind} event: {problems}") from None


@dataclass(frozen=True)
class StreamRecord:
    """One record of the table's stream: its images as boto3 reads items (numbers as Decimal)."""

    new_image: dict[str, Any] | None
    old_image: dict[str, Any] | None
    sequence_number: str | None
    # The item's partition key ("" when the record names none): one item's records must be handled in order.
    partition_key: str = ""


def parse_stream_record(raw: Mapping[str, Any]) -> StreamRecord:
    """A DynamoDB stream record's `dynamodb` part; an image the record does not carry is None."""
    from boto3.dynamodb.types import TypeDeserializer  # the table adapter loads it on first use anyway

    change = raw.get("dynamodb") or {}
    deserializer = TypeDeserializer()

    def image(key: str) -> dict[str, Any] | None:
        item = change.get(key)
        return {name: deserializer.deserialize(value) for name, value in item.items()} if item else None

    pk = (change.get("Keys") or {}).get("pk") or {}
    return StreamRecord(image("NewImage"), image("OldImage"), change.get("SequenceNumber"),
                        str(next(iter(pk.values()), "")))


class EbsSnapshotNotification(BaseModel):
    """`detail` of EventBridge's "EBS Snapshot Notification" (the `createSnapshot` event): `snapshot_id` is
    the snapshot's ARN (`arn:aws:ec2::REGION:snapshot/snap-...`), `result` `succeeded` or `failed`."""

    model_config = ConfigDict(populate_by_name=True)
    event: Literal["createSnapshot"]
    result: str
    cause: str = ""
    snapshot_arn: str = Field(alias="snapshot_id", pattern=r"^arn:aws[\w-]*:ec2:.*:snapshot/snap-[0-9a-f]+$")

    @property
    def snapshot_id(self) -> str:
        return self.snapshot_arn.rsplit("/", 1)[1]

    @property
    def succeeded(self) -> bool:
        return self.result == "succeeded"


class EbsSnapshotEvent(EventBridgeEnvelope):
    source: Literal["aws.ec2"]
    detail_type: Literal["EBS Snapshot Notification"] = Field(alias="detail-type")
    detail: EbsSnapshotNotification


def parse_snapshot_notification(event: Any) -> EbsSnapshotNotification:
    """The notification's `detail`, or `EventError` naming every field at fault."""
    try:
        return EbsSnapshotEvent.model_validate(event).detail
    except ValidationError as e:
        problems = describe_validation_error(e, subject="event")
        raise EventError(f"invalid EBS Snapshot Notification: {problems}") from None


def warm_snapshot_names(event: Mapping[str, Any]) -> list[str]:
    """The warm snapshots whose records a batch of the table's stream changed (their keys name them)."""
    names = []
    for record in event.get("Records", []):
        pk = ((record.get("dynamodb") or {}).get("Keys") or {}).get("pk", {}).get("S", "")
        if pk.startswith("WARMSNAPSHOT#"):
            names.append(pk.partition("#")[2])
    return names
