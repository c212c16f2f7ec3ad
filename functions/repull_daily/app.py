"""Daily schedule → a new round of every active `completionPolicy: Never` job."""

from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    scheduled = event.get("scheduled_time")
    # Retries of one scheduled invocation carry its scheduled time: they must not start a second round.
    started = bootstrap.repull_daily(datetime.fromisoformat(scheduled).timestamp() if scheduled else None)
    metrics.add_metric(name="RoundsStarted", unit=MetricUnit.Count, value=len(started))
    logger.info("re-pull rounds started", extra={"jobs": started})
    return {"rounds_started": started}
