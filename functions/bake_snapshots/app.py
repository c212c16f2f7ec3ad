"""Warm snapshots' bakes: carried on after each change of their record (the table stream), on EBS's
`EBS Snapshot Notification` (EventBridge), and every minute (the sweep: budgets, lost events)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.events import parse_snapshot_notification, warm_snapshot_names
from prewarm.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if "Records" in event:
        done = bootstrap.advance_bakes(warm_snapshot_names(event))
    elif event.get("detail-type") == "EBS Snapshot Notification":
        notice = parse_snapshot_notification(event)  # a malformed event raises EventError naming its fields
        name = bootstrap.snapshot_completed(notice.snapshot_id, notice.succeeded, notice.cause)
        done = [f"{notice.snapshot_id} {notice.result}" + (f" for {name}" if name else ": not a bake's")]
    else:
        done = bootstrap.sweep_bakes()
    logger.info("bakes", extra={"done": done})
    return {"done": done}
