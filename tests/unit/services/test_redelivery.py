"""What `record_status` hands back to the status queue comes again sooner than the queue's 180 s: after a
backoff that grows with the message's receive count; a message that does not parse comes back at once,
to reach the DLQ in seconds. Here the queue is `MemoryStatusQueue`; on moto's SQS, through the real adapter:
tests/unit/adapters/test_status_queue_redelivery.py; through the record_status handler:
tests/unit/functions/test_record_status_redelivery.py."""

from __future__ import annotations

import pytest

from prewarm.domain.retry import Delivery, redelivery_seconds
from prewarm.services.status_batches import deliver_again
from tests.support.memory_queues import MemoryStatusQueue


def test_a_returned_message_comes_again_after_2_s_then_four_times_longer_each_receive_up_to_the_queues_timeout(
) -> None:
    assert [redelivery_seconds(n) for n in range(1, 8)] == [2, 8, 32, 128, 180, 180, 180]
    # five receives before the DLQ (maxReceiveCount 5): about 6 minutes from the first receive
    assert sum(redelivery_seconds(n) for n in range(1, 6)) == 350
    assert redelivery_seconds(9, poison=True) == 0


def test_a_receive_count_below_1_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="receive_count must be >= 1, got 0"):
        redelivery_seconds(0)


def test_the_queue_is_told_each_returned_messages_backoff_and_the_poisons_none() -> None:
    # Given three messages of one batch, the first received for the fourth time
    deliveries = [Delivery("report", "r-report", receive_count=4), Delivery("poison", "r-poison"),
                  Delivery("applied", "r-applied")]
    queue = MemoryStatusQueue([d.receipt_handle for d in deliveries])
    # When the batch hands back the report to retry and the poison
    delays = deliver_again(queue, deliveries, retry_ids=["report"], poison_ids=["poison"])
    # Then the report waits 128 s (its fourth receive), the poison none, the applied one is not touched
    assert delays == [("report", 128), ("poison", 0)]
    assert queue.hidden == {"r-report": 128, "r-poison": 0} and queue.calls == 1
