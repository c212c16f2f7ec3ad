"""capacity.py's cost model of one invocation: the published latency of each AWS and Kubernetes call, and
the calls an invocation makes, recorded with their threads, times and CPU (`CallTrace`, `RecordingCluster`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.measure import BenchmarkError

# --- published latencies ------------------------------------------------------------------------
#
# DynamoDB: "single-digit millisecond performance at any scale" (Amazon DynamoDB developer guide,
# "What is Amazon DynamoDB?", and the DynamoDB FAQ). Single-item calls and a one-partition Query are
# modeled at 5 ms, the middle of that bound. AWS publishes no latency for batch or transactional
# calls: BatchGetItem (up to 100 items, read in parallel server-side) at 10 ms and TransactWriteItems
# (two-phase, up to 100 actions; developer guide "Amazon DynamoDB Transactions: How it works") at
# 20 ms are ASSUMPTIONS, 2x and 4x a single write.
# SQS: "Typical latencies for SendMessage, ReceiveMessage, and DeleteMessage API requests are in the
# tens or low hundreds of milliseconds" (Amazon SQS FAQ); the developer guide's example of a client in
# the same Region averages 20 ms ("Increasing throughput using horizontal scaling and action
# batching"). SendMessage and the other single-queue calls at 20 ms, SendMessageBatch (up to 10) at
# 30 ms (an ASSUMPTION).
# Kubernetes: a GET of one object from the EKS API server in the same Region at 10 ms, a filtered
# LIST at 20 ms, a PATCH of one object (a first hello's PrewarmWarm condition, a warm node's startup taint)
# at 15 ms: ASSUMPTIONS (EKS publishes none).
LATENCY_S: dict[str, float] = {
    "dynamodb:GetItem": 0.005, "dynamodb:PutItem": 0.005, "dynamodb:UpdateItem": 0.005,
    "dynamodb:DeleteItem": 0.005, "dynamodb:Query": 0.005,
    "dynamodb:BatchGetItem": 0.010, "dynamodb:BatchWriteItem": 0.010,
    "dynamodb:TransactWriteItems": 0.020, "dynamodb:TransactGetItems": 0.010,
    "sqs:SendMessage": 0.020, "sqs:SendMessageBatch": 0.030, "sqs:CreateQueue": 0.020,
    "sqs:GetQueueUrl": 0.020, "sqs:ChangeMessageVisibility": 0.020, "sqs:ChangeMessageVisibilityBatch": 0.030,
    "sqs:DeleteMessage": 0.020, "sqs:GetQueueAttributes": 0.020, "sqs:SetQueueAttributes": 0.020,
    "sqs:ListQueueTags": 0.020, "sqs:TagQueue": 0.020,
    "kubernetes:get_node": 0.010, "kubernetes:list_pods": 0.020, "kubernetes:list_nodes": 0.020,
    # The sweep's: SQS's list at a single-queue call's cost; a Kubernetes write at a GET's (ASSUMPTIONS).
    "sqs:ListQueues": 0.020, "kubernetes:get_configmap": 0.010, "kubernetes:create_event": 0.010,
    "kubernetes:get_object": 0.010, "kubernetes:patch_node": 0.015, "kubernetes:patch_node_status": 0.015,
}
# The agent's SendMessage of its report to the status queue, before any poller can see it.
REPORT_SEND_S = LATENCY_S["sqs:SendMessage"]
# Lambda's own cost of invoking a warm function from the event source mapping: an ASSUMPTION.
INVOKE_OVERHEAD_S = 0.020
# One vCPU at 1,769 MB (Lambda developer guide, "Configure Lambda function memory").
FULL_VCPU_MB = 1769


# --- recording the calls an invocation makes -------------------------------------------------------


@dataclass(frozen=True)
class Call:
    op: str  # "dynamodb:UpdateItem", "kubernetes:get_node"
    thread: int
    start: float
    end: float
    cpu: float  # CPU moto spent serving it on the calling thread: AWS's work, not the function's


class CallTrace:
    """Every AWS call of the clients it is attached to, and every call of a `RecordingCluster`.

    The CPU moto spends answering (in-process, on the caller's thread) is measured around moto's
    request handler alone, so the client's own work (serializing, signing, parsing) stays the
    function's CPU."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._open = threading.local()
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-call", self._before)
        events.register("after-call", self._after)
        events.register("after-call-error", self._after)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Measures moto's CPU per call while inside."""
        from moto.core.botocore_stubber import BotocoreStubber

        original = BotocoreStubber.__call__
        trace = self

        def measured(stub: Any, *args: Any, **kwargs: Any) -> Any:
            cpu = time.thread_time()
            try:
                return original(stub, *args, **kwargs)
            finally:
                stack = trace._stack()
                if stack:
                    stack[-1][3][0] += time.thread_time() - cpu

        BotocoreStubber.__call__ = measured  # type: ignore[method-assign]
        try:
            yield
        finally:
            BotocoreStubber.__call__ = original  # type: ignore[method-assign]

    def _before(self, event_name: str, **_: Any) -> None:
        _, service, operation = event_name.split(".", 2)
        self.begin(f"{service}:{operation}")

    def _after(self, **_: Any) -> None:
        self.end()

    def begin(self, op: str) -> None:
        self._stack().append((op, time.perf_counter(), threading.get_ident(), [0.0]))

    def end(self) -> None:
        op, start, thread, served = self._stack().pop()
        call = Call(op, thread, start, time.perf_counter(), served[0])
        with self._lock:
            self.calls.append(call)

    def _stack(self) -> list[tuple[str, float, int, list[float]]]:
        if not hasattr(self._open, "stack"):
            self._open.stack = []
        return self._open.stack  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def invocation(self) -> Iterator[Invocation]:
        """Records one invocation: its calls and its own CPU time (all threads, less moto's)."""
        with self._lock:
            self.calls = []
        inv = Invocation()
        cpu = time.process_time()
        yield inv
        inv.cpu_s = time.process_time() - cpu
        with self._lock:
            inv.calls = list(self.calls)
        inv.cpu_s = max(0.0, inv.cpu_s - sum(c.cpu for c in inv.calls))


class RecordingCluster:
    """A `Cluster` whose calls go into the trace (their latency is the API server's, modeled)."""

    def __init__(self, cluster: Any, trace: CallTrace) -> None:
        self._cluster, self._trace = cluster, trace

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._cluster, name)
        if not callable(inner):
            return inner

        def call(*args: Any, **kwargs: Any) -> Any:
            # The fake answers from memory: its (small) CPU stands in for the client's.
            self._trace.begin(f"kubernetes:{name}")
            try:
                return inner(*args, **kwargs)
            finally:
                self._trace.end()

        return call


@dataclass
class Invocation:
    calls: list[Call] = field(default_factory=list)
    cpu_s: float = 0.0

    def groups(self) -> list[list[Call]]:
        """The calls in groups that overlapped in time (ran concurrently), in order."""
        out: list[list[Call]] = []
        end = -1.0
        for c in sorted(self.calls, key=lambda c: c.start):
            if out and c.start < end:
                out[-1].append(c)
                end = max(end, c.end)
            else:
                out.append([c])
                end = c.end
        return out

    def sequential(self) -> tuple[int, float]:
        """(round trips, modeled seconds) one after another: per group, its busiest thread's."""
        trips, seconds = 0, 0.0
        for group in self.groups():
            by_thread: dict[int, list[Call]] = {}
            for c in group:
                by_thread.setdefault(c.thread, []).append(c)
            trips += max(len(cs) for cs in by_thread.values())
            seconds += max(sum(latency(c.op) for c in cs) for cs in by_thread.values())
        return trips, seconds

    def modeled_s(self, memory_mb: int) -> float:
        return self.sequential()[1] + self.cpu_s * FULL_VCPU_MB / memory_mb + INVOKE_OVERHEAD_S


def latency(op: str) -> float:
    if op not in LATENCY_S:
        raise BenchmarkError(f"no published latency for {op}: add it to LATENCY_S with its source")
    return LATENCY_S[op]
