"""The node's own task queue on SQS, as the agent consumes it: receive, keep invisible, delete, release.

The long poll is the only call an idle agent makes. Readiness is answered from its last outcome, so a
probe costs no request (`TaskQueue.problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from prewarm.adapters.sqs import queue_error
from prewarm_agent.pulls import Delivery

# SQS batch calls take at most ten entries.
_BATCH = 10


@dataclass(frozen=True)
class Received:
    """A message as received: its body and how to answer for it."""

    delivery: Delivery
    body: str = field(repr=False)
    receive_count: int = 1


class TaskQueue:
    """Receive, extend, delete and release messages of one queue (`client` is a boto3 SQS client)."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url
        # Why the last receive failed; None after one that answered (or before the first: the queue was
        # just created or found, so it answered then).
        self._problem: str | None = None

    @property
    def problem(self) -> str | None:
        """Why the node queue cannot be reached, from the outcome of the last receive; None when it answered."""
        return self._problem

    def receive(self, *, wait_seconds: int, visibility_seconds: int, max_messages: int = _BATCH) -> list[Received]:
        """Long-poll for up to `max_messages`; each stays invisible for `visibility_seconds`."""
        try:
            answer = self.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=max_messages,
                WaitTimeSeconds=wait_seconds,
                VisibilityTimeout=visibility_seconds,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        except (ClientError, BotoCoreError) as e:
            error = queue_error(e, f"receive from {self.url}")
            self._problem = str(error)
            raise error from e
        self._problem = None
        return [
            Received(
                Delivery(str(m["MessageId"]), str(m["ReceiptHandle"])),
                str(m.get("Body", "")),
                int((m.get("Attributes") or {}).get("ApproximateReceiveCount", 1)),
            )
            for m in answer.get("Messages") or ()
        ]

    def delete(self, deliveries: Sequence[Delivery]) -> list[str]:
        """Delete the messages; returns the ids that could not be deleted, with the reason."""
        return self._batch("delete_message_batch", deliveries, {})

    def set_visibility(self, deliveries: Sequence[Delivery], seconds: int) -> list[str]:
        """Hide the messages for `seconds` more (0: visible again now); returns the failures."""
        return self._batch("change_message_visibility_batch", deliveries, {"VisibilityTimeout": seconds})

    def _batch(self, operation: str, deliveries: Sequence[Delivery], extra: dict[str, Any]) -> list[str]:
        failures: list[str] = []
        for start in range(0, len(deliveries), _BATCH):
            chunk = deliveries[start : start + _BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": d.receipt_handle, **extra} for i, d in enumerate(chunk)]
            try:
                answer = getattr(self.client, operation)(QueueUrl=self.url, Entries=entries)
            except (ClientError, BotoCoreError) as e:
                failures.extend(f"{d.message_id}: {queue_error(e, operation)}" for d in chunk)
                continue
            for failed in answer.get("Failed") or ():
                message_id = chunk[int(failed["Id"])].message_id
                failures.append(f"{message_id}: {failed.get('Code', '')} {failed.get('Message', '')}".strip())
        return failures
