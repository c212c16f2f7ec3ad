"""moto's SQS, made to cost per call what SQS costs rather than per message queued.

moto answers every call on a queue by walking all of its messages, several times: each `SendMessage`
builds the queue's attributes (three passes to count visible, in-flight and delayed messages), and
`ReceiveMessage` reads `MessageRetentionPeriod` through `GetQueueAttributes` once per message it
returns (nine passes each); every pass converts the time through `datetime` once per message. With
5,000 messages on the status queue a batch of 10 took about 1 s to send and 3 s to receive here
(`benchmarks/fleet.py` spent most of its time there), which is moto's cost, not SQS's.

These patches change how moto computes its answers, not what they are: the same attributes, the
same messages, the same retention rule. They go in with the limits layer (`patches.install`).

One is a fix: moto deletes a message by rebuilding the queue's message list without the lock its
sends take, so two deletes at once (a local event source mapping with 10 batches in flight) put
back a message the other deleted, which then comes back after its visibility timeout, and a send
during a delete is lost. SQS loses neither; deletes here hold the queue's own lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

_memo = threading.local()  # per thread: id(queue) -> its three counts, while its attributes are built

_COUNTS = ("approximate_number_of_messages", "approximate_number_of_messages_not_visible",
           "approximate_number_of_messages_delayed")


def _clock(original: Any, scale: float) -> Any:
    """moto's `unix_time`/`unix_time_millis` (`scale` 1 or 1000) without `datetime` for the present."""

    def now(dt: Any = None) -> float:
        return time.time() * scale if dt is None else float(original(dt))

    return now


def _counts(queue: Any) -> dict[str, int]:
    """The three approximate counts in one pass, at one instant (moto: a pass and a clock read each)."""
    now = time.time() * 1000.0
    visible = in_flight = delayed = 0
    for message in queue._messages:
        is_delayed = now < message.delayed_until
        is_visible = now > message.visible_at
        delayed += is_delayed
        in_flight += not is_visible
        visible += is_visible and not is_delayed
    return dict(zip(_COUNTS, (visible, in_flight, delayed), strict=True))


def _counted(name: str, original: property) -> property:
    def read(queue: Any) -> Any:
        memo = getattr(_memo, "counts", {}).get(id(queue))
        return memo[name] if memo is not None else original.fget(queue)  # type: ignore[misc]

    return property(read)


def _attributes(original: property) -> property:
    def read(queue: Any) -> Any:
        counts = getattr(_memo, "counts", None)
        if counts is None:
            counts = _memo.counts = {}
        counts[id(queue)] = _counts(queue)
        try:
            return original.fget(queue)  # type: ignore[misc]
        finally:
            counts.pop(id(queue), None)

    return property(read)


def _retained(backend: Any, queue_name: str, message: Any) -> bool:
    """moto's rule, read from the queue itself rather than through all of its attributes."""
    queue = backend.get_queue(queue_name)
    return bool(int(queue.message_retention_period) + message.sent_timestamp / 1000 > time.time())


def _locked(original: Any) -> Any:
    def delete_message(queue: Any, receipt_handle: str) -> None:
        with queue._messages_lock:  # what moto's add_message holds while it appends
            original(queue, receipt_handle)

    return delete_message


def patches() -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for `patches.install` to put in place."""
    import moto.sqs.models as sqs_models

    queue = sqs_models.Queue
    backend = sqs_models.SQSBackend
    found: list[tuple[Any, str, Any]] = [
        (sqs_models, "unix_time_millis", _clock(vars(sqs_models)["unix_time_millis"], 1000.0)),
        (sqs_models, "unix_time", _clock(vars(sqs_models)["unix_time"], 1.0)),
        (queue, "attributes", _attributes(queue.__dict__["attributes"])),
        (backend, "is_message_valid_based_on_retention_period", _retained),
        (queue, "delete_message", _locked(queue.__dict__["delete_message"])),
    ]
    found += [(queue, name, _counted(name, queue.__dict__[name])) for name in _COUNTS]
    return found
