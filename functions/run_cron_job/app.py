"""A cron job's EventBridge Scheduler schedule → its run (an ImageListPullJob) for the time it was due."""

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
    # Retries of one scheduled invocation carry its scheduled time: they make the same run, once.
    scheduled = event.get("scheduledTime")
    outcome = bootstrap.run_cron_job(str(event["cronJob"]),
                                     datetime.fromisoformat(scheduled).timestamp() if scheduled else None)
    metrics.add_metric(name="CronRunsCreated", unit=MetricUnit.Count, value=1 if outcome.run else 0)
    logger.info("cron job run", extra={"cron_job": outcome.cron_job, "run": outcome.run, "skipped": outcome.skipped,
                                       "replaced": outcome.replaced, "expired": outcome.expired})
    return {"run": outcome.run, "skipped": outcome.skipped, "replaced": outcome.replaced, "expired": outcome.expired}
