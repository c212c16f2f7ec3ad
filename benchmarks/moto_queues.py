"""moto's SQS with and without the limits layer's queue patches (`prewarm_devtools.aws_limits.queues`).

moto walks every message of a queue on each call, several times; the patches compute the same answers
once per call. This times `SendMessageBatch` and `ReceiveMessage` (10 messages each, the mean of
`--calls` calls) on a queue that holds `--depths` messages, in-process (`mock_aws`), first with
moto's own code, then patched. The figures are moto's cost, which the status queue of a large local
stack or `fleet.py` pays on every batch; SQS itself does not grow with the queue.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import emit, print_machine


def _fill(sqs: Any, url: str, depth: int) -> None:
    """Adds visible messages until the queue holds `depth` (a count read once: moto walks them all)."""
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    for _ in range(0, max(0, depth - int(attributes["Attributes"]["ApproximateNumberOfMessages"])), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x" * 300} for i in range(10)])


def measure(depths: Sequence[int], calls: int, *, patched: bool) -> dict[str, dict[str, float]]:
    import boto3
    from moto import mock_aws

    from prewarm_devtools.aws_limits import patches

    if patched:
        patches.install(lambda: None)  # the patches alone: no quota is enforced
    try:
        figures: dict[str, dict[str, float]] = {}
        with mock_aws():
            sqs = boto3.client("sqs", region_name="us-west-2")
            url = sqs.create_queue(QueueName="bench")["QueueUrl"]
            for depth in depths:
                _fill(sqs, url, depth)
                started = time.perf_counter()
                for _ in range(calls):
                    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x" * 300}
                                                                  for i in range(10)])
                send = (time.perf_counter() - started) / calls
                started = time.perf_counter()
                for _ in range(calls):
                    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)
                receive = (time.perf_counter() - started) / calls
                figures[str(depth)] = {"send_batch_ms": round(send * 1000, 1), "receive_ms": round(receive * 1000, 1)}
                print(f"  {'patched' if patched else 'moto'}: {depth:>6} messages queued: SendMessageBatch(10) "
                      f"{send * 1000:8.1f} ms, ReceiveMessage(10) {receive * 1000:8.1f} ms")
        return figures
    finally:
        if patched:
            patches.uninstall()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/moto_queues.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="1000,5000", help="messages queued, comma-separated (default 1000,5000)")
    parser.add_argument("--calls", type=int, default=10, help="calls timed at each depth (default 10)")
    args = parser.parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",") if d]
    except ValueError:
        parser.error(f"--depths {args.depths!r}: comma-separated whole numbers")
    if not depths or min(depths) < 1 or args.calls < 1:
        parser.error("--depths and --calls must be at least 1")
    print_machine()
    print(f"moto_queues: SQS calls on a queue holding {', '.join(map(str, depths))} messages, {args.calls} calls each")
    emit({"moto": measure(depths, args.calls, patched=False), "patched": measure(depths, args.calls, patched=True)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
