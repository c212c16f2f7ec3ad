"""Status queue → agent reports and hellos, applied exactly once; freed slots go to waiting nodes."""

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.domain.messages import Hello, NodePhase, parse_agent_message
from prewarm.observability import logger, metrics, tracer

processor = BatchProcessor(event_type=EventType.SQS)


def handle_message(record: SQSRecord) -> None:
    message = parse_agent_message(record.body)  # a poison message raises: retried, then the DLQ
    if isinstance(message, Hello):
        logger.append_keys(node=message.node, job=None)
        hello = bootstrap.register_node(message)
        logger.info("node registered", extra={"added_to": hello.added_to})
        return
    logger.append_keys(job=message.job, node=message.node)
    outcome = bootstrap.record_report(message)
    if not outcome.applied:
        logger.info("report ignored", extra={"reason": outcome.reason, "phase": message.phase})
        return
    if outcome.phase is NodePhase.SUCCEEDED:
        metrics.add_metric(name="NodesSucceeded", unit=MetricUnit.Count, value=1)
    elif outcome.phase in (NodePhase.FAILED, NodePhase.CANCELLED):
        metrics.add_metric(name="NodesFailed", unit=MetricUnit.Count, value=1)
    if outcome.seconds is not None:
        metrics.add_metric(name="NodePullSeconds", unit=MetricUnit.Seconds, value=outcome.seconds)
    if outcome.finished_job:
        metrics.add_metric(name="JobsCompleted", unit=MetricUnit.Count, value=1)


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=handle_message, processor=processor, context=context)
