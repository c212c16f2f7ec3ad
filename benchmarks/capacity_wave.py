"""capacity.py's `wave` scenario: every node's final `Succeeded` report arriving at once, so that several
`record_status` invocations transact on the one job item at the same time (the status path's hot spot).

Each final report changes its node's phase, and a batch's phase changes of one job are written in
transactions of up to 99 node items plus one counter update of the job item (`services/reports.py`): with
`MaximumConcurrency` invocations at once, their transactions meet on that item. DynamoDB cancels a
transaction that includes an item another transaction holds (`TransactionConflict`, DynamoDB developer
guide, "Transaction conflict handling in DynamoDB"); record_status backs off and tries again what is left
(`services/reports.py`'s `_ATTEMPTS` and `REFUSED_BATCH_BACKOFF`: full jitter, drawn here from `--seed`), then
hands the reports back to the queue.

The batches run for real one at a time (capacity.py's model), so the conflicts are modeled on the recorded
calls (`conflicts`): each invocation starts where the event source started it; its calls happen at their
modeled offsets (`call_offsets`: the invoke overhead, then each group of overlapping calls after the ones
before it, the function's CPU spread evenly between the groups); every `TransactWriteItems` holds the job
item for its modeled latency (`LATENCY_S`, 20 ms: an assumption, none is published). In start order, a
transaction that begins while another invocation's holds the item is cancelled: the invocation sleeps the
backoff (and the refused call's latency) and everything after it moves by that much. A transaction
refused `_ATTEMPTS` times gives its reports back, which run once more after record_status's backoff. A
delayed invocation holds its slot longer: the starts are scheduled again on `MaximumConcurrency` slots
with the delays and the conflicts modeled again, until the starts no longer move (`conflicts`). First
order: the batches keep the reports the event source gave them, a given-up batch's second run meets
nobody, and single writes on the job item (slot fills, completion) are not counted.

Throttling is read two ways: the refusals the limits layer made while the batches ran (wall time, one at a
time: a lower bound), and the job item's peak write units in any modeled second against a partition's
1,000 (DynamoDB developer guide, "Partitions"): a transactional write costs 2 WCU per KB of the item.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.capacity_calls import FULL_VCPU_MB, INVOKE_OVERHEAD_S, LATENCY_S, REPORT_SEND_S, Invocation, latency
from benchmarks.capacity_delivery import Delivery, deliver
from benchmarks.capacity_stack import FunctionConfig, Stack
from benchmarks.fleet_agents import IMAGE_BYTES

Json = dict[str, Any]

TRANSACTION = "dynamodb:TransactWriteItems"
PARTITION_WCU_PER_S = 1000.0


def call_offsets(inv: Invocation, memory_mb: int) -> list[tuple[float, str]]:
    """Each call of `inv` as (modeled seconds after the invocation's start, operation), in order."""
    groups = inv.groups()
    cpu = inv.cpu_s * FULL_VCPU_MB / memory_mb
    out: list[tuple[float, str]] = []
    at = INVOKE_OVERHEAD_S
    for n, group in enumerate(groups):
        at += cpu / max(1, len(groups)) if n else 0.0
        by_thread: dict[int, float] = {}
        longest = 0.0
        for call in group:
            begins = at + by_thread.get(call.thread, 0.0)
            by_thread[call.thread] = by_thread.get(call.thread, 0.0) + latency(call.op)
            longest = max(longest, by_thread[call.thread])
            out.append((begins, call.op))
        at += longest
    return sorted(out)


def reschedule(delivery: Delivery, added: Sequence[float], concurrency: int) -> list[float]:
    """Each invocation's start when invocation i lasts `added[i]` longer: on the first free of `concurrency`
    slots, not before the batch closed (`delivery.starts`, the event source's schedule without the delays)."""
    slots = [0.0] * concurrency
    starts = []
    for closed, seconds, more in zip(delivery.starts, delivery.durations, added, strict=True):
        start = max(closed, heapq.heappop(slots))
        starts.append(start)
        heapq.heappush(slots, start + seconds + more)
    return starts


def conflicts(delivery: Delivery, config: FunctionConfig, *, item_wcu: int, seed: int = 0) -> Json:
    """The job item's transactions of every invocation in modeled time: conflicts, retries, delays. The
    invocations' starts and their delays are settled together: a delayed invocation holds its slot longer,
    which moves the later ones, whose transactions then meet others. The backoffs' jitter is drawn from
    `seed`, the same draws for each settling pass."""
    starts, model = list(delivery.starts), _conflicts(delivery, delivery.starts, config.memory_mb, item_wcu, seed)
    for _ in range(20):
        moved = reschedule(delivery, model["delays"], config.concurrency)
        if moved == starts:
            break
        starts, model = moved, _conflicts(delivery, moved, config.memory_mb, item_wcu, seed)
    model["starts"] = starts
    return model


def _conflicts(delivery: Delivery, starts: Sequence[float], memory_mb: int, item_wcu: int, seed: int) -> Json:
    from dataclasses import replace

    from prewarm.domain.retry import redelivery_seconds
    from prewarm.services.reports import _ATTEMPTS, REFUSED_BATCH_BACKOFF

    backoff = replace(REFUSED_BATCH_BACKOFF, rng=random.Random(seed))

    hold = LATENCY_S[TRANSACTION]
    transactions = [[at for at, op in call_offsets(inv, memory_mb) if op == TRANSACTION]
                    for inv in delivery.invocations]
    delay = [0.0] * len(transactions)
    refusals = [0] * len(transactions)
    gave_up = [False] * len(transactions)
    queue = [(starts[i] + offs[0], i, 0) for i, offs in enumerate(transactions) if offs]
    heapq.heapify(queue)
    held_until, held_by = -1.0, -1
    conflicted = retries = 0
    writes: list[float] = []
    while queue:
        at, i, k = heapq.heappop(queue)
        if at < held_until and held_by != i:
            conflicted += 1
            refusals[i] += 1
            if refusals[i] >= _ATTEMPTS:
                gave_up[i] = True  # its reports go back to the queue; nothing after is written
                continue
            retries += 1
            wait = backoff.delay(refusals[i]) + hold
            delay[i] += wait
            heapq.heappush(queue, (at + wait, i, k))
            continue
        held_until, held_by = at + hold, i
        writes.append(at)
        if k + 1 < len(transactions[i]):
            heapq.heappush(queue, (starts[i] + transactions[i][k + 1] + delay[i], i, k + 1))
    peak = max((sum(1 for w in writes if s <= w < s + 1.0) for s in writes), default=0)
    ends = [starts[i] + d + delay[i] for i, d in enumerate(delivery.durations)]
    # What an invocation gave up on comes back after record_status's own backoff and runs once more
    # (first order: on a free slot, meeting nobody).
    stored = [e + redelivery_seconds(1) + d if g else e
              for e, d, g in zip(ends, delivery.durations, gave_up, strict=True)]
    return {
        "transactions_on_job_item": sum(len(t) for t in transactions),
        "conflicts": conflicted, "retries": retries, "gave_up_invocations": sum(gave_up),
        "most_refusals_of_one_invocation": max(refusals, default=0),
        "added_s_max": round(max(delay, default=0.0), 3), "added_s_total": round(sum(delay), 3),
        "peak_job_item_wcu_per_s": peak * item_wcu,
        "delays": delay, "ends": ends, "stored": stored,
    }


def job_item_wcu(stack: Stack, key: str) -> int:
    """What one transactional write of the job item costs: 2 WCU per KB (rounded up) of the item."""
    item = stack.store.client.get_item(TableName="jobs", Key={"pk": {"S": f"JOB#{key}"}, "sk": {"S": "JOB"}})
    size = len(json.dumps(item.get("Item", {})))
    return 2 * max(1, math.ceil(size / 1024))


def wave_scenario(args: argparse.Namespace, config: FunctionConfig, *, node_names: Any, store_job: Any,
                  in_batches: Any) -> Json:
    from prewarm.domain.messages import StatusReport
    from prewarm_devtools import aws_limits
    from tests.reliability.invariants import invariant_problems
    from tests.support.cluster import FakeCluster, make_node

    rng = random.Random(args.seed)
    nodes = node_names(args.nodes, 3)
    cluster = FakeCluster(nodes=[make_node(n, pool="gpu") for n in nodes])
    with Stack() as stack:
        started = time.perf_counter()
        key = store_job(stack, cluster, "wave", "Always", args.nodes)
        record = stack.store.get_job(key)
        assert record is not None

        def report(node: str, phase: str, seq: int) -> str:
            done = IMAGE_BYTES if phase == "Succeeded" else 0
            return StatusReport(job=key, job_uid=record.uid, round=record.round, node=node, phase=phase,
                                attempt=1, seq=seq, bytes_done=done, bytes_total=IMAGE_BYTES,
                                started_at=time.time(), finished_at=time.time() if done else None,
                                ).model_dump_json(exclude_none=True)

        in_batches(stack, [report(n, "Pulling", 1) for n in nodes], config)
        print(f"  set-up: {args.nodes} nodes pulling one Always job ({time.perf_counter() - started:.0f} s wall)")
        sent = sorted(rng.uniform(0, args.wave_window) for _ in nodes)
        bodies = [report(n, "Succeeded", 2) for n in nodes]
        print(f"  {len(bodies)} Succeeded reports within {args.wave_window:g} s, batches of up to "
              f"{config.batch_size}, window {config.window_s:g} s, {config.concurrency} at once")
        layer = aws_limits.active()
        refused_before = sum(layer.stats.refusals.values()) if layer is not None else 0
        delivery = deliver([t + REPORT_SEND_S for t in sent],
                           lambda ids: stack.invoke([bodies[i] for i in ids], config), config, verbose=args.verbose)
        layer_refusals = (sum(layer.stats.refusals.values()) if layer is not None else 0) - refused_before
        model = conflicts(delivery, config, item_wcu=job_item_wcu(stack, key), seed=args.seed)
        starts, ends, stored = model.pop("starts"), model.pop("ends"), model.pop("stored")
        del model["delays"]
        record = stack.store.get_job(key)
        assert record is not None
        in_flight = max((sum(1 for s, e in zip(starts, ends, strict=True) if s <= t < e) for t in starts), default=0)
        figures: Json = {
            "nodes": args.nodes, "wave_window_s": args.wave_window, "batches": len(delivery.durations),
            "invocations_at_once": in_flight,
            "completed_s_without_conflicts": round(max(delivery.stored_at.values(), default=0.0), 3),
            "completed_s": round(max(stored, default=0.0), 3),
            "longest_invocation_s": round(max(e - s for s, e in zip(starts, ends, strict=True)), 3),
            **model, "layer_refusals": layer_refusals, "returned": delivery.returned, "dlq": delivery.dlq,
            "state": str(record.state), "succeeded": record.counters.succeeded,
            "counters_exact": not invariant_problems(stack.store, key) and record.counters.succeeded == args.nodes,
            "wall_seconds": round(time.perf_counter() - started, 1),
        }
    print(f"  Succeeded wave: {figures['batches']} batches, up to {figures['invocations_at_once']} at once; "
          f"{figures['transactions_on_job_item']} transactions on the job item: {figures['conflicts']} conflicts, "
          f"{figures['retries']} retries, {figures['gave_up_invocations']} invocations gave up; throttles: "
          f"{figures['layer_refusals']} refused by the limits layer, peak {figures['peak_job_item_wcu_per_s']} "
          f"WCU/s on the job item (a partition takes {PARTITION_WCU_PER_S:g}); job {figures['state']} "
          f"{figures['completed_s']} s after the first report ({figures['completed_s_without_conflicts']} s "
          f"without conflicts), longest invocation {figures['longest_invocation_s']} s; counters exact "
          f"{figures['counters_exact']}, returned {figures['returned']}, DLQ {figures['dlq']}")
    return figures


def wave_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wave-window", type=float, default=5.0,
                        help="seconds within which every node's Succeeded report is sent (default 5)")
