"""SQS's limits in front of moto's handler: message size, batch entries and size, queue name reuse.
Who may call is `authorization`'s to decide."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from moto.sqs.exceptions import SQSException

if TYPE_CHECKING:
    from prewarm_devtools.aws_limits.layer import LayerState

_BATCHES = ("send_message_batch", "delete_message_batch", "change_message_visibility_batch")
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def message_size(body: str, attributes: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """A message's size as SQS counts it: the body's UTF-8 bytes plus each attribute's name, data type
    and value ("Amazon SQS message attributes")."""
    size = len(body.encode())
    for name, attribute in (attributes or {}).items():
        value = attribute.get("StringValue")
        raw = value.encode() if isinstance(value, str) else attribute.get("BinaryValue") or b""
        size += len(name.encode()) + len(str(attribute.get("DataType", "")).encode()) + len(raw)
    return size


def access_key_id(headers: Mapping[str, str]) -> str | None:
    """The access key a SigV4 request was signed with (moto's own reading knows only 20-character keys)."""
    match = _CREDENTIAL.search(headers.get("Authorization", ""))
    return match.group(1) if match else None


class SQSLimits:
    def __init__(self, layer: LayerState) -> None:
        self.layer = layer
        self.quotas = layer.quotas
        self._lock = threading.Lock()
        self._deleted: dict[tuple[str, str, str], float] = {}

    def reset(self) -> None:
        with self._lock:
            self._deleted.clear()

    def guard(self, action: str, handler: Any, run: Callable[[], Any]) -> Any:
        where = (handler.current_account, handler.region)
        if action == "create_queue":
            self._check_name_reuse((*where, handler._get_param("QueueName")))
        elif action in _BATCHES:
            self._check_batch(handler)
        elif action == "send_message":
            self._check_message(handler, handler._get_param("MessageBody") or "",
                                handler._get_param("MessageAttributes", {}))
        result = run()
        if action == "delete_queue":
            with self._lock:
                self._deleted[(*where, handler._get_queue_name())] = self.layer.clock()
        return result

    def _check_name_reuse(self, queue: tuple[str, str, str]) -> None:
        with self._lock:
            deleted = self._deleted.get(queue)
        if deleted is not None and self.layer.clock() - deleted < self.quotas.sqs_queue_name_reuse_s:
            self._refuse("AWS.SimpleQueueService.QueueDeletedRecently",
                         f"You must wait {self.quotas.sqs_queue_name_reuse_s:g} seconds after deleting a queue "
                         f"before you can create another with the same name ({queue[2]}).")

    def _check_batch(self, handler: Any) -> None:
        entries = handler._get_param("Entries", []) or []
        if len(entries) > self.quotas.sqs_batch_entries:
            self._refuse("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                         f"Maximum number of entries per request are {self.quotas.sqs_batch_entries}. "
                         f"You have sent {len(entries)}.")
        if "MessageBody" not in (entries[0] if entries else {}):
            return
        total = 0
        for entry in entries:
            total += self._check_message(handler, entry.get("MessageBody") or "", entry.get("MessageAttributes"))
        if total > self.quotas.sqs_batch_bytes:
            self._refuse("AWS.SimpleQueueService.BatchRequestTooLong",
                         f"Batch requests cannot be longer than {self.quotas.sqs_batch_bytes} bytes. "
                         f"You have sent {total} bytes.")

    def _check_message(self, handler: Any, body: str, attributes: Mapping[str, Any] | None) -> int:
        size = message_size(body, attributes)
        limit = self.quotas.sqs_message_bytes
        with contextlib.suppress(SQSException):  # a missing queue: moto answers for it
            limit = min(limit, int(handler.sqs_backend.get_queue(handler._get_queue_name()).maximum_message_size))
        if size > limit:
            self._refuse("InvalidParameterValue", "One or more parameters are invalid. "
                         f"Reason: Message must be shorter than {limit} bytes.")
        return size

    def _refuse(self, code: str, message: str) -> None:
        self.layer.stats.record_refusal(code.rpartition(".")[2])
        raise SQSException(code, message)
