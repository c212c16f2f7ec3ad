"""Table stream (job items) → select nodes → node items and the first `parallelism` tasks."""

from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer
from prewarm.services.dispatch import needs_planning

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


def plan_record(record: DynamoDBRecord) -> None:
    image = record.dynamodb.new_image if record.dynamodb else None
    old = record.dynamodb.old_image if record.dynamodb else None
    if not image or not needs_planning(image, old or None):
        return  # a removed job (its delete cancelled the nodes), or only its counters or shards changed
    key = f"{image['namespace']}/{image['name']}"
    logger.append_keys(job=key)
    # A failed send raises TaskSendError, so the stream retries this record and re-sends what was not sent.
    result = bootstrap.plan_job(key)
    logger.info("dispatch", extra={"action": result.action, "selected": result.selected,
                                   "excluded": result.excluded, "sent": result.sent})


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=plan_record, processor=processor, context=context)
