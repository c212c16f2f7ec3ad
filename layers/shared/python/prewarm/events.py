"""Typed shapes of the events the functions receive (Powertools parser models)."""

from __future__ import annotations

from typing import Any, Literal

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prewarm.services.push import ImagePush


class EcrImageAction(BaseModel):
    """`detail` of the EventBridge "ECR Image Action" event."""

    model_config = ConfigDict(populate_by_name=True)
    result: str
    repository_name: str = Field(alias="repository-name", min_length=1)
    image_digest: str = Field(default="", alias="image-digest")
    action_type: str = Field(alias="action-type")
    image_tag: str | None = Field(default=None, alias="image-tag")
    manifest_media_type: str = Field(default="", alias="manifest-media-type")
    artifact_media_type: str = Field(default="", alias="artifact-media-type")


class EcrImageActionEvent(EventBridgeModel):
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


class EventError(ValueError):
    """An event that is not the EventBridge "ECR Image Action" event the rule delivers; names each field."""


def parse_image_action(event: Any) -> EcrImageActionEvent:
    """The event as an `EcrImageActionEvent`, or `EventError` naming every field at fault."""
    try:
        return parse(event=event, model=EcrImageActionEvent)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'event'}: {error['msg']}"
            for error in e.errors(include_url=False, include_input=False)
        )
        raise EventError(f"invalid ECR Image Action event: {problems}") from None
