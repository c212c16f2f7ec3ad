"""Every minute: deadlines, silent nodes, lost sends, expired jobs and queues of departed nodes."""

import dataclasses
import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer
from prewarm.services.schedules import sweep
from prewarm.settings import settings


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    s = settings()
    result = sweep(
        bootstrap.store(), bootstrap.queues(), bootstrap.cluster_or_none(), now=time.time(),
        prefix=s.node_queue_prefix, silence_grace_seconds=s.node_silence_grace_seconds,
        resend_after_seconds=s.task_resend_seconds, secrets=bootstrap.secret_mirror(),
    )
    metrics.add_metric(name="JobsFailed", unit=MetricUnit.Count, value=len(result.deadline_failed))
    summary = dataclasses.asdict(result)
    logger.info("sweep", extra=summary)
    return summary
