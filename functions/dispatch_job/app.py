"""Table stream (job items) → select nodes → node items and the first `parallelism` tasks."""

import time
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer
from prewarm.services.dispatch import needs_planning, plan_job

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


def plan_record(record: DynamoDBRecord) -> None:
    image = record.dynamodb.new_image if record.dynamodb else None
    if not image or not needs_planning(image):
        return  # a removed job (its delete cancelled the nodes), or only its counters changed
    key = f"{image['namespace']}/{image['name']}"
    logger.append_keys(job=key)
    result = plan_job(
        bootstrap.store(), bootstrap.cluster(), bootstrap.queues(), key, now=time.time(),
        secrets=bootstrap.secret_mirror(),
    )
    logger.info("dispatch", extra={"action": result.action, "selected": result.selected,
                                   "excluded": result.excluded, "sent": result.sent})
    if result.send_failures:
        # Raising makes the stream retry this record; the re-run re-sends what was not sent.
        raise RuntimeError(f"{len(result.send_failures)} task sends failed, first: {result.send_failures[0]}")


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=plan_record, processor=processor, context=context)
