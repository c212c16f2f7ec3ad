"""EventBridge ECR events → prewarm rules → one pull job per matching rule and cluster: "ECR Image Action"
(a push) and "ECR Pull Through Cache Action" (an upstream image cached) apply jobs, and the warm snapshots
wanting the image record its digest (their bake starts from the table stream); "ECR Replication Action"
starts the jobs of the clusters in the Region the image was replicated to."""

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.events import EcrReplicationActionEvent, parse_ecr_event
from prewarm.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    action = parse_ecr_event(event)  # a malformed event raises EventError naming its fields
    if isinstance(action, EcrReplicationActionEvent):
        if not action.is_successful:
            logger.info("ignored: not a successful replication", extra={"result": action.detail.result})
            return {"jobs": []}
        push = action.to_push()
        logger.append_keys(image=f"{push.registry_host}/{push.repository}@{push.digest}", replica=action.region)
        applied = bootstrap.handle_replication(push, action.region)
    else:
        if not action.is_successful_push:
            logger.info("ignored: not a successful push", extra={"detail_type": action.detail_type})
            return {"jobs": []}
        push = action.to_push()
        logger.append_keys(image=f"{push.registry_host}/{push.repository}@{push.digest}")
        applied, changed = bootstrap.handle_push(push)
        if changed:
            logger.info("warm snapshots to bake again", extra={"warm_snapshots": changed})
    created = sum(a.outcome in ("created", "configured") for a in applied)  # a refused job is recorded, not started
    metrics.add_metric(name="JobsStarted", unit=MetricUnit.Count, value=created)
    handled = "replication handled" if isinstance(action, EcrReplicationActionEvent) else "push handled"
    logger.info(handled, extra={"jobs": [a.describe() for a in applied]})
    return {"jobs": [a.describe() for a in applied]}
