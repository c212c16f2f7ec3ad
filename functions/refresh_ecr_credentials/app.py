"""Schedule → registry tokens → fresh pull secrets in the target namespaces and the agents' copies."""

import logging
import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer
from prewarm.services.credentials import RefreshReport

# At DEBUG botocore logs request parameters and response bodies, tokens included: never in this function.
logging.getLogger("botocore").setLevel(max(logging.INFO, logging.getLogger("botocore").getEffectiveLevel()))

_UNITS = {"SecondsToEarliestExpiry": MetricUnit.Seconds}


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = bootstrap.refresh_credentials()
    if report is None:
        logger.warning("nothing to refresh: set CREDENTIALS_CONFIG or CREDENTIALS_CONFIG_PARAMETER")
        report = RefreshReport()
    for name, value in report.metrics(time.time()).items():
        metrics.add_metric(name=name, unit=_UNITS.get(name, MetricUnit.Count), value=value)
    summary = report.describe()
    logger.info("credentials refreshed", extra=summary)
    report.raise_for_failures()  # after every namespace was tried, so the invocation counts as failed
    return summary
