"""Every minute: deadlines, silent nodes, lost sends, expired jobs and queues of departed nodes."""

import dataclasses
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    result = bootstrap.sweep(lambda: context.get_remaining_time_in_millis() / 1000)
    metrics.add_metric(name="JobsFailed", unit=MetricUnit.Count, value=len(result.deadline_failed))
    summary = dataclasses.asdict(result)
    logger.info("sweep", extra=summary)
    return summary
