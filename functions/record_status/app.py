"""Status queue → agent reports, hellos, warm-ups and gone images: a batch applied together, exactly
once; freed slots refilled; what it hands back comes again after a short backoff."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.domain.messages import Baked, ClusterProbe, MessageError, NodePhase, StatusMessage, parse_agent_message
from prewarm.domain.retry import Delivery
from prewarm.observability import logger, metrics, tracer

if TYPE_CHECKING:
    # The batch utility's package costs ~100 ms of imports: its response type is for the type checker only.
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    messages: list[tuple[str, StatusMessage]] = []
    baked: list[tuple[str, Baked]] = []
    poison: list[str] = []
    deliveries: list[Delivery] = []
    for record in event["Records"]:
        delivery = Delivery(record["messageId"], record["receiptHandle"],
                            int(record.get("attributes", {}).get("ApproximateReceiveCount", 1)))
        try:
            message = parse_agent_message(record["body"])
        except MessageError as e:
            # Left on the queue: retried, then the DLQ keeps it for a person to read.
            logger.warning("poison message on the status queue", extra={"message_id": record["messageId"],
                                                                        "error": str(e)})
            poison.append(record["messageId"])
            deliveries.append(delivery)
            continue
        if isinstance(message, Baked):
            baked.append((record["messageId"], message))  # a warm snapshot's builder, not a node
        else:
            messages.append((record["messageId"], message))
        if not isinstance(message, ClusterProbe):  # a probe handed back comes again after its queue's timeout
            deliveries.append(delivery)
    # A builder's report that could not be applied (AWS or the table refused) comes again.
    poison += bootstrap.record_baked(baked) if baked else []
    # What goes back to the queue comes again sooner than its 180 s visibility (domain.retry.redelivery_seconds).
    outcome = bootstrap.record_status(messages, deliveries, poison,
                                      lambda: context.get_remaining_time_in_millis() / 1000)
    for hello in outcome.hellos:
        logger.info("node registered", extra={"node": hello.node, "added_to": hello.added_to})
    for node in outcome.warmed:
        logger.info("node warm-up recorded", extra={"node": node})
    for probe in outcome.probes:
        logger.info("cluster probed", extra={"cluster": probe.cluster, "action": probe.action,
                                             "replanned": probe.replanned, "reason": probe.reason})
    for gone in outcome.gone:
        logger.info("image gone from a node", extra={"node": gone.node, "job": gone.job, "action": gone.action,
                                                     "reason": gone.reason})
        if gone.action != "ignore":
            metrics.add_metric(name="ImagesGone", unit=MetricUnit.Count, value=1)
    for report, result in outcome.reports:
        if not result.applied:
            logger.info("report not applied", extra={"job": report.job, "node": report.node, "reason": result.reason,
                                                     "phase": report.phase, "retry": result.retry})
            continue
        if result.phase is NodePhase.SUCCEEDED:
            metrics.add_metric(name="NodesSucceeded", unit=MetricUnit.Count, value=1)
        elif result.phase in (NodePhase.FAILED, NodePhase.CANCELLED):
            metrics.add_metric(name="NodesFailed", unit=MetricUnit.Count, value=1)
        if result.seconds is not None:
            metrics.add_metric(name="NodePullSeconds", unit=MetricUnit.Seconds, value=result.seconds)
        if result.finished_job:
            metrics.add_metric(name="JobsCompleted", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="JobItemWrites", unit=MetricUnit.Count, value=outcome.job_writes)
    return {"batchItemFailures": [{"itemIdentifier": i} for i in poison + outcome.retry_ids]}
