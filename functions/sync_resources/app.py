"""Every minute: ImagePullJob, ImageListPullJob and PrewarmRule resources into the table, status back.

Invoked with `{"reach_cluster": NAME}` (`prewarm cluster add`), it answers how the cluster's `/version`
answered this function, from the stack's own network: `{"cluster", "version", "error"}`."""

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if "reach_cluster" in event:  # `prewarm cluster add`: can the stack's network reach the cluster, which version?
        return bootstrap.reach_cluster(str(event["reach_cluster"])).to_json()
    report = bootstrap.sync_resources()
    metrics.add_metric(name="ResourcesApplied", unit=MetricUnit.Count, value=len(report.applied))
    metrics.add_metric(name="ResourcesRefused", unit=MetricUnit.Count, value=len(report.refused))
    metrics.add_metric(name="ResourceStatusWrites", unit=MetricUnit.Count, value=report.statuses_written)
    summary = {"listed": report.listed, "applied": report.applied, "unchanged": report.unchanged,
               "refused": report.refused, "deleted": report.deleted, "expired": report.expired,
               "statuses_written": report.statuses_written, "status_conflicts": report.status_conflicts,
               "missing_kinds": report.missing_kinds}
    if report.missing_kinds:
        logger.warning("resource kinds not served: run `prewarm install`", extra={"missing": report.missing_kinds})
    return summary
