"""The template's event sources, as Lambda and EventBridge drive a function: SQS queues, the table stream,
EventBridge rules and schedules.

`EventSources` is the part of `LocalStack` that delivers: each source's batching, partial batch failures,
retries and failure destinations; `run_until_idle` pumps them all in turn; `start` runs each source on a
thread of its own, as Lambda polls each mapping on its own (each queue mapping, each stream shard, the
event bus, a timer for each `rate(...)` schedule: moto's schedules never fire, `fire` runs one on demand),
so a slow function holds up only its own source, and a queue's batches run in a pool of their own, each
freeing its slot when it returns; `stop` ends them all.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from prewarm_devtools.sam.aws import ACCOUNT
from prewarm_devtools.sam.events import matches_pattern, schedule_event, sqs_event, stream_event
from prewarm_devtools.sam.intrinsics import Physical
from prewarm_devtools.sam.invocation import Function, WiringError
from prewarm_devtools.sam.scheduler import LocalScheduler

log = logging.getLogger(__name__)

# The template's event types the emulator delivers (a ScheduleV2 fires as a Schedule does).
SUPPORTED_EVENTS = ("SQS", "DynamoDB", "EventBridgeRule", "Schedule", "ScheduleV2")

_RATE = re.compile(r"rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)")
_CRON = re.compile(r"cron\((\S+\s+){5}\S+\)")


def parse_schedule(expression: str, where: str) -> float | None:
    """Seconds between runs of a `rate(...)`, None for a valid `cron(...)` (fired on demand locally)."""
    if m := _RATE.fullmatch(expression.strip()):
        unit = {"minute": 60, "hour": 3600, "day": 86400}[m.group(2).rstrip("s")]
        return int(m.group(1)) * unit
    if _CRON.fullmatch(expression.strip()):
        return None
    raise WiringError(f"{where}: schedule expression {expression!r} is neither rate(...) nor cron(...)")


def as_filter_input(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"eventName": record.get("eventName"), "dynamodb": record.get("dynamodb", {})}


# "Lambda polls shards in your DynamoDB stream for records at a base rate of 4 times per second" (Lambda's
# guide, DynamoDB streams).
SHARD_READ_SECONDS = 0.25


@dataclass
class StreamCursor:
    iterator: str | None
    pending: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    # ParallelizationFactor N > 1: the shard's records split into N lanes by partition key, as Lambda does
    # (each key's records in order, lanes side by side), each with a cursor of its own.
    lanes: list[StreamCursor] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fetched_at: float = float("-inf")  # when GetRecords last read the shard (monotonic)

    def lane(self, record: dict[str, Any], factor: int) -> StreamCursor:
        if not self.lanes:
            self.lanes = [StreamCursor(None) for _ in range(factor)]
        key = record["dynamodb"]["Keys"].get("pk") or record["dynamodb"]["Keys"]
        return self.lanes[zlib.crc32(json.dumps(key, sort_keys=True).encode()) % factor]


class EventSources:
    """Delivers the template's events to its functions (`LocalStack` deploys them and invokes)."""

    # Set by `LocalStack`.
    region: str
    sqs: Any
    streams: Any
    scheduler: Any = None  # the Scheduler client, when the stack runs the schedules its functions make
    functions: dict[str, Function]
    event_bus_url: str
    _cursors: dict[tuple[str, str], StreamCursor]
    _schedule_due: dict[str, float]  # each rate schedule's next firing (monotonic), set while it waits
    _threads: list[threading.Thread]
    _pools: list[ThreadPoolExecutor]  # the running SQS sources' batches (set by `start`)
    _batches: set[Future[None]]  # those in flight
    _stop: threading.Event

    def function(self, name: str) -> Function:
        raise NotImplementedError

    def invoke(self, name: str, event: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def _queue_by_arn(self, arn: str, where: str) -> Physical:
        raise NotImplementedError

    def bindings(self, kind: str) -> list[tuple[Function, str, dict[str, Any]]]:
        return [
            (fn, name, ev.get("Properties", {}))
            for fn in self.functions.values()
            for name, ev in fn.events.items()
            if ev.get("Type") == kind or (kind == "Schedule" and ev.get("Type") == "ScheduleV2")
        ]

    def put_event(self, event: Mapping[str, Any]) -> list[Any]:
        """Delivers an EventBridge event to every matching rule's function, with the rule's retries and DLQ."""
        results = []
        for fn, _name, props in self.bindings("EventBridgeRule"):
            if not matches_pattern(props["EventPattern"], event):
                continue
            target = props.get("Target", {})
            attempts = 1 + int(target.get("RetryPolicy", {}).get("MaximumRetryAttempts", 185))
            for attempt in range(attempts):
                try:
                    results.append(self.invoke(fn.logical_id, event))
                    break
                except Exception as e:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                    log.warning("%s failed on attempt %d: %s", fn.name, attempt + 1, e)
            else:
                dlq = target.get("DeadLetterConfig", {}).get("Arn")
                if dlq:
                    self.sqs.send_message(QueueUrl=self._queue_by_arn(dlq, fn.logical_id).ref,
                                          MessageBody=json.dumps(event))
        return results

    def invoke_arn(self, arn: str, event: Mapping[str, Any]) -> Any:
        """Invokes the function an ARN names (a schedule's target)."""
        for fn in self.functions.values():
            if self._function_arn(fn.logical_id) == arn:
                return self.invoke(fn.logical_id, event)
        raise KeyError(f"no function of this stack is {arn}")

    def _function_arn(self, logical_id: str) -> str:
        raise NotImplementedError

    def fire(self, name: str, payload: Any = None) -> Any:
        """Fires a function's schedule now (moto's schedules never fire)."""
        fn = self.function(name)
        for ev_name, ev in fn.events.items():
            if ev.get("Type") in ("Schedule", "ScheduleV2"):
                arn = f"arn:aws:scheduler:{self.region}:{ACCOUNT}:schedule/default/{fn.logical_id}-{ev_name}"
                return self.invoke(fn.logical_id, schedule_event(arn, self.region, ACCOUNT, payload))
        raise KeyError(f"{name} has no schedule")

    def pump_event_bus(self) -> int:
        """Delivers the events other processes put on the local event bus (see `put_event`)."""
        if not self.event_bus_url:
            return 0
        got = self.sqs.receive_message(QueueUrl=self.event_bus_url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=0).get("Messages", [])
        for m in got:
            try:
                event = json.loads(m["Body"])
            except json.JSONDecodeError:
                log.warning("dropped a local event bus message that is not JSON")
            else:
                self.put_event(event)
            self.sqs.delete_message(QueueUrl=self.event_bus_url, ReceiptHandle=m["ReceiptHandle"])
        return len(got)

    def pump_sqs(self) -> int:
        """Delivers batches from each SQS event source; returns how many messages were handled.

        As Lambda's event source mapping: a batch gathers up to `BatchSize` messages (10 per receive),
        and up to `ScalingConfig.MaximumConcurrency` batches (else the function's reserved concurrency,
        else one) are in flight at once, each in an environment of its own. Locally a batch
        takes what the queue holds now instead of waiting out `MaximumBatchingWindowInSeconds`, so at
        low traffic AWS adds up to that window of latency that local mode does not.
        """
        return sum(self._pump_queue(fn, props) for fn, _name, props in self.bindings("SQS"))

    @staticmethod
    def _in_flight(fn: Function, props: Mapping[str, Any]) -> int:
        return max(1, int(props.get("ScalingConfig", {}).get("MaximumConcurrency") or fn.reserved_concurrency or 1))

    def _pump_queue(self, fn: Function, props: Mapping[str, Any]) -> int:
        queue = self._queue_by_arn(props["EventSourceArn"], fn.logical_id)
        size, in_flight = int(props.get("BatchSize", 10)), self._in_flight(fn, props)
        batches = []
        for _ in range(in_flight):
            batch = self._gather(queue.ref, size)
            if not batch:
                break
            batches.append(batch)
        if len(batches) == 1:
            self._deliver_sqs_batch(fn, props, queue.ref, batches[0])
        elif batches:
            with ThreadPoolExecutor(len(batches), thread_name_prefix=f"esm-{fn.name}") as pool:
                futures = [pool.submit(self._deliver_sqs_batch, fn, props, queue.ref, b) for b in batches]
                for future in futures:
                    future.result()
        return sum(len(b) for b in batches)

    def _feed_queue(self, fn: Function, props: Mapping[str, Any], slots: threading.Semaphore,
                    pool: ThreadPoolExecutor) -> int:
        """A running stack's round of one SQS source: a batch for each free slot, handed to the pool, so
        each batch in flight frees its slot on its own, as Lambda's pollers go on independently."""
        queue_url, size, moved = self._queue_by_arn(props["EventSourceArn"], fn.logical_id).ref, \
            int(props.get("BatchSize", 10)), 0
        while slots.acquire(blocking=False):
            batch = self._gather(queue_url, size)
            if not batch:
                slots.release()
                break

            def deliver(batch: list[dict[str, Any]] = batch) -> None:
                try:
                    self._deliver_sqs_batch(fn, props, queue_url, batch)
                except Exception:  # keep serving; the failure is logged with its traceback
                    log.exception("local event source %s", fn.logical_id)
                finally:
                    slots.release()

            future = pool.submit(deliver)
            self._batches.add(future)
            future.add_done_callback(self._batches.discard)
            moved += len(batch)
        return moved

    def _gather(self, queue_url: str, size: int) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while len(batch) < size:
            got = self.sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=min(size - len(batch), 10), WaitTimeSeconds=0,
                AttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                break
            batch += got
        return batch

    def _deliver_sqs_batch(self, fn: Function, props: Mapping[str, Any], queue_url: str,
                           got: list[dict[str, Any]]) -> None:
        # As Lambda's mapping: the handled messages are deleted; the failed ones are left as they are,
        # to come back when their visibility runs out: the queue's own timeout from the receive, or what
        # the function set with ChangeMessageVisibility ("Handling errors for an SQS event source in
        # Lambda"). Nothing here shortens it.
        failed: set[str] = {m["MessageId"] for m in got}
        try:
            response = self.invoke(fn.logical_id, sqs_event(got, props["EventSourceArn"], self.region))
            if "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []):
                failed = {f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])}
            else:
                failed = set()
        except Exception as e:  # noqa: BLE001 - the batch returns to the queue, as Lambda does
            log.warning("%s failed a batch of %d: %s", fn.name, len(got), e)
        done = [m for m in got if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            chunk = done[start : start + 10]
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)]
            self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)

    def pump_streams(self) -> int:
        """Delivers one batch from each table stream event source (each lane of a shard's, with a
        ParallelizationFactor); returns how many records were handled."""
        return sum(self._pump_shard(fn, props, shard_id, cursor, lane) for fn, name, props in self.bindings("DynamoDB")
                   for shard_id, cursor in self._shards(fn, name, props) for lane in range(_factor(props)))

    def _pump_shard(self, fn: Function, props: Mapping[str, Any], shard_id: str, cursor: StreamCursor,
                    lane: int = 0, every: float = 0.0) -> int:
        """One batch of the shard's `lane`; the shard is read (GetRecords) when that lane has nothing pending,
        and not again within `every` seconds, whichever lane asks."""
        factor = _factor(props)
        with cursor.lock:
            target = cursor if factor == 1 else (cursor.lanes[lane] if cursor.lanes else None)
            due = time.monotonic() - cursor.fetched_at >= every
            if (target is None or not target.pending) and cursor.iterator and due:
                cursor.fetched_at = time.monotonic()
                out = self.streams.get_records(ShardIterator=cursor.iterator, Limit=1000)
                cursor.iterator = out.get("NextShardIterator")
                filters = [json.loads(f["Pattern"]) for f in props.get("FilterCriteria", {}).get("Filters", [])]
                for r in out.get("Records", []):
                    if not filters or any(matches_pattern(p, as_filter_input(r)) for p in filters):
                        (cursor if factor == 1 else cursor.lane(r, factor)).pending.append(r)
                target = cursor if factor == 1 else (cursor.lanes[lane] if cursor.lanes else None)
        if target is None or not target.pending:
            return 0
        batch = target.pending[: int(props.get("BatchSize", 100))]
        self._deliver_stream_batch(fn, props, target, batch, shard_id)
        return len(batch)

    def _deliver_stream_batch(
        self, fn: Function, props: Mapping[str, Any], cursor: StreamCursor, batch: list[dict[str, Any]], shard: str
    ) -> None:
        try:
            response = self.invoke(fn.logical_id, stream_event(batch, props["EventSourceArn"], self.region))
            failures = [f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])]
        except Exception as e:  # noqa: BLE001 - the whole batch is retried, as Lambda does
            log.warning("%s failed a stream batch: %s", fn.name, e)
            failures = [batch[0]["dynamodb"]["SequenceNumber"]]
        if not failures:
            del cursor.pending[: len(batch)]
            cursor.attempts = 0
            return
        first = min(
            (i for i, r in enumerate(batch) if r["dynamodb"]["SequenceNumber"] in failures), default=0
        )
        del cursor.pending[:first]  # checkpoint before the first failed record, retry from it
        cursor.attempts += 1
        if cursor.attempts > int(props.get("MaximumRetryAttempts", -1)) >= 0:
            dropped = cursor.pending.pop(0)
            cursor.attempts = 0
            destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            if destination:
                self.sqs.send_message(
                    QueueUrl=self._queue_by_arn(destination, fn.logical_id).ref,
                    MessageBody=json.dumps({"requestContext": {"functionArn": fn.logical_id, "condition":
                                            "RetryAttemptsExhausted"}, "DDBStreamBatchInfo": {
                                            "shardId": shard, "startSequenceNumber": dropped["dynamodb"][
                                                "SequenceNumber"]}}),
                )

    def _shards(self, fn: Function, name: str, props: Mapping[str, Any]) -> list[tuple[str, StreamCursor]]:
        stream = props["EventSourceArn"]
        shards = self.streams.describe_stream(StreamArn=stream)["StreamDescription"].get("Shards", [])
        out = []
        for shard in shards:
            key = (f"{fn.logical_id}/{name}", shard["ShardId"])
            if key not in self._cursors:
                it_type = "TRIM_HORIZON" if props.get("StartingPosition") == "TRIM_HORIZON" else "LATEST"
                iterator = self.streams.get_shard_iterator(
                    StreamArn=stream, ShardId=shard["ShardId"], ShardIteratorType=it_type
                )["ShardIterator"]
                self._cursors[key] = StreamCursor(iterator)
            out.append((shard["ShardId"], self._cursors[key]))
        return out

    def prime_streams(self) -> None:
        """Takes the stream positions now (LATEST means: from here on)."""
        for fn, name, props in self.bindings("DynamoDB"):
            self._shards(fn, name, props)

    def run_until_idle(
        self, timeout: float = 30.0, *, idle_rounds: int = 2, poll: Callable[[], int] | None = None
    ) -> None:
        """Pumps every event source until nothing moves for `idle_rounds` passes (or the timeout)."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while quiet < idle_rounds:
            moved = self.pump_event_bus() + self.pump_streams() + self.pump_sqs() + (poll() if poll else 0)
            quiet = 0 if moved else quiet + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"local stack still busy after {timeout} s")
            if not moved:
                time.sleep(0.05)

    def sources(self) -> dict[str, Callable[[], int]]:
        """Each event source by name, as one delivery round that returns how much it moved."""
        found: dict[str, Callable[[], int]] = {"event-bus": self.pump_event_bus}
        for fn, name, props in self.bindings("SQS"):
            in_flight = self._in_flight(fn, props)
            pool = ThreadPoolExecutor(in_flight, thread_name_prefix=f"esm-{fn.name}")
            self._pools.append(pool)
            found[f"{fn.logical_id}/{name}"] = functools.partial(
                self._feed_queue, fn, props, threading.Semaphore(in_flight), pool)
        for fn, name, props in self.bindings("DynamoDB"):
            for shard_id, cursor in self._shards(fn, name, props):
                for lane in range(_factor(props)):
                    # Lambda reads a shard 4 times a second, however many batches of it are in flight (its
                    # ParallelizationFactor): the lanes share those reads, not one poll each.
                    found[f"{fn.logical_id}/{name}/{shard_id}/{lane}"] = functools.partial(
                        self._pump_shard, fn, props, shard_id, cursor, lane, SHARD_READ_SECONDS)
        return found

    def start(self, *, schedules: bool = True, interval: float = 0.2) -> None:
        """Runs each event source (and a timer for each rate schedule) on a background thread of its own."""
        self._stop.clear()
        self._pools, self._batches, self._schedule_due = [], set(), {}
        loops = {name: functools.partial(self._poll, name, pump, interval) for name, pump in self.sources().items()}
        for fn, period in self._rate_schedules() if schedules else []:
            loops[f"{fn.logical_id}/schedule"] = functools.partial(self._poll, fn.logical_id, functools.partial(
                self._fire_every, fn, period), 0)
        self._scheduler = None
        if schedules and self.scheduler is not None:  # the schedules functions make (the cron jobs'), on time
            self._scheduler = LocalScheduler(self.scheduler, self.invoke_arn)
            loops["scheduler"] = functools.partial(self._poll, "scheduler", functools.partial(
                self._scheduler.pump, wait=False), 0.5)
        for name, loop in loops.items():
            t = threading.Thread(target=loop, name=f"esm-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _poll(self, name: str, pump: Callable[[], int], interval: float) -> None:
        while not self._stop.is_set():
            try:
                moved = pump()
            except Exception:  # keep serving; the failure is logged with its traceback
                log.exception("local event source %s", name)
                moved = 0
            if not moved:
                self._stop.wait(interval)

    def _fire_every(self, fn: Function, period: float) -> int:
        self._schedule_due[fn.logical_id] = time.monotonic() + period
        if not self._stop.wait(period):
            self.fire(fn.logical_id)
        return 1

    def schedules_quiet_for(self) -> float:
        """Seconds until the next rate schedule fires (0 while one is running, inf with none): a timed test
        starts a figure's run in a quiet spell, not in the minute's burst of sweep, sync and bake that
        shares this machine's cores and moto with it, as it shares nothing on AWS."""
        due = list(getattr(self, "_schedule_due", {}).values())
        return max(0.0, min(due) - time.monotonic()) if due else float("inf")

    def _rate_schedules(self) -> list[tuple[Function, float]]:
        out = []
        for fn, _name, props in self.bindings("Schedule"):
            period = parse_schedule(str(props.get("ScheduleExpression", "")), fn.logical_id)
            if period is not None:
                out.append((fn, period))
        return out

    def stop(self, timeout: float = 10.0) -> None:
        """Stops every source's thread and batch; one still inside a handler after `timeout` is named in the
        log, and ended with the invocations (`_end_invocations`)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("event source thread %s is still inside a handler", t.name)
        self._threads.clear()
        scheduler = getattr(self, "_scheduler", None)
        if scheduler is not None and not scheduler.join(max(0.0, deadline - time.monotonic())):
            log.warning("schedule invocations still inside a handler after %s s", timeout)
        if wait(list(getattr(self, "_batches", ())), timeout=max(0.0, deadline - time.monotonic())).not_done:
            log.warning("SQS batches still inside a handler after %s s", timeout)
        self._end_invocations()
        pools, self._pools = getattr(self, "_pools", []), []
        for pool in pools:
            pool.shutdown(wait=True)

    def _end_invocations(self) -> None:
        """Ends the invocations still running (the stack's environments)."""


def _factor(props: Mapping[str, Any]) -> int:
    """A stream mapping's ParallelizationFactor: batches of one shard in flight at once (1 to 10)."""
    return int(props.get("ParallelizationFactor", 1))
