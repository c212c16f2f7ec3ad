"""Table stream (job items) → select nodes → node items and the first `parallelism` tasks; (cron job items)
→ their EventBridge Scheduler schedules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from prewarm import bootstrap
from prewarm.events import StreamRecord, parse_stream_record
from prewarm.observability import logger, metrics, tracer

if TYPE_CHECKING:
    # The batch utility's package costs ~100 ms of imports: its response type is for the type checker only.
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse


def plan_record(record: StreamRecord) -> None:
    # A cron job's item: its schedules follow it (created, changed, deleted with it).
    if (done := bootstrap.sync_cron_schedules(record.new_image, record.old_image)) is not None:
        logger.info("cron job schedules", extra={"action": done})
        return
    job, old = bootstrap.stored_job(record.new_image), bootstrap.stored_job(record.old_image)
    if job is not None and job.deletion_requested(old):
        logger.thread_safe_append_keys(job=job.key)
        # A failed cancel raises TaskSendError: the stream retries this record, the items still there.
        # Nodes still warming no longer wait for its image (a failed send retries this record too).
        logger.info("deleted", extra={"cancels_sent": bootstrap.delete_job(job.key)})
        return
    if job is None or not job.needs_planning(old):
        return  # a removed job, or only its counters or shards changed
    key = job.key
    logger.thread_safe_append_keys(job=key)
    # A pin removed from an image the job keeps: its nodes unpin it (a failed send retries this record).
    if (unpinned := bootstrap.release_dropped_pin(job, old)) is not None:
        logger.info("pin removed", extra={"unpinned": unpinned})
    # A failed send raises TaskSendError, so the stream retries this record and re-sends what was not sent.
    result = bootstrap.plan_job(key, probing=job.asked_again_after_park)
    logger.info("dispatch", extra={"action": result.action, "selected": result.selected,
                                   "excluded": result.excluded, "sent": result.sent})


def handle_record(record: StreamRecord) -> None:
    logger.thread_safe_clear_keys()  # a thread's keys are its record's (records run side by side)
    try:
        plan_record(record)
    except Exception:
        logger.exception("planning failed; the stream retries from this record")
        raise


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    # Each job's records in order, the jobs side by side; at the earliest that fails, Lambda retries from it
    # (checkpointing the ones before). (The batch utility costs 70 ms of imports.)
    from prewarm.services.stream import each_item_in_order  # loaded by the first plan all the same

    records = [parse_stream_record(raw) for raw in event["Records"]]
    if len({r.partition_key for r in records}) > 1:
        bootstrap.prepare_plans()
    failed = each_item_in_order(records, lambda r: r.partition_key, handle_record)
    return {"batchItemFailures": [{"itemIdentifier": failed.sequence_number or ""}] if failed else []}
