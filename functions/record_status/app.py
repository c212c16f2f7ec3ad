"""Status queue → agent reports and hellos, applied exactly once; freed slots go to waiting nodes."""

import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.domain.messages import Hello, parse_agent_message
from prewarm.observability import logger, metrics, tracer
from prewarm.services.reports import record_report, register_node

processor = BatchProcessor(event_type=EventType.SQS)


def handle_message(record: SQSRecord) -> None:
    message = parse_agent_message(record.body)  # a poison message raises: retried, then the DLQ
    now = time.time()
    if isinstance(message, Hello):
        logger.append_keys(node=message.node, job=None)
        hello = register_node(bootstrap.store(), bootstrap.queues(), bootstrap.cluster_or_none(), message, now=now)
        logger.info("node registered", extra={"added_to": hello.added_to})
        return
    logger.append_keys(job=message.job, node=message.node)
    outcome = record_report(bootstrap.store(), bootstrap.queues(), message, now=now)
    if not outcome.applied:
        logger.info("report ignored", extra={"reason": outcome.reason, "phase": message.phase})
        return
    if outcome.phase == "Succeeded":
        metrics.add_metric(name="NodesSucceeded", unit=MetricUnit.Count, value=1)
    elif outcome.phase in ("Failed", "Cancelled"):
        metrics.add_metric(name="NodesFailed", unit=MetricUnit.Count, value=1)
    if outcome.seconds is not None:
        metrics.add_metric(name="NodePullSeconds", unit=MetricUnit.Seconds, value=outcome.seconds)
    if outcome.finished_job:
        metrics.add_metric(name="JobsCompleted", unit=MetricUnit.Count, value=1)


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=handle_message, processor=processor, context=context)
