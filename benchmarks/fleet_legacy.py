"""fleet.py's old status path: one transaction per report that writes the job item (before commit 8703751)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.fleet_moto import REGION, Json, SimClock
from benchmarks.fleet_stack import Fleet, RoundResult

STATUS_MAX_RECEIVES = 5  # StatusQueue's RedrivePolicy maxReceiveCount
OLD_CONCURRENCY = 10
OLD_BATCH = 10


def _s(value: Any) -> Json:
    """A DynamoDB attribute value (floats as exact decimals, sets of strings as SS)."""
    from decimal import Decimal

    from boto3.dynamodb.types import TypeSerializer

    if isinstance(value, float):
        value = Decimal(repr(value))
    return TypeSerializer().serialize(value)  # type: ignore[no-any-return]


class LegacyStatusPath:
    """The status path of commit 8703751, DynamoDB call for call, on a table of its design.

    Per report (`services/reports.py` record_report then `adapters/dynamodb/tasks.py` apply_updates): the job
    item read, the node item read, the counting rules, then one `TransactWriteItems` of the node item
    (guarded by its version) and the job item (counters, `version`, the `failed_nodes` string set).
    The table keeps every node item under the job's partition key and the `by_kind` GSI projects
    every attribute (node items under one index key, `task`). The job item carries `excluded` as JSON.
    A failed condition re-reads and decides again (10 tries); throttling or a transaction conflict
    sends the report back to the queue. Not replayed: `fill_slots` and `finish_if_done` after a
    final report (more writes of the job item), the SDK's own retries (the simulated clock stands
    still within a second, so they could not succeed: the report comes back the next second instead).
    """

    def __init__(self, client: Any, table: str, key: str) -> None:
        from prewarm.adapters.dynamodb import DynamoJobStore

        self.client, self.table, self.key = client, table, key
        self.pk = f"JOB#{key}"
        self._expressions = DynamoJobStore(table, client)  # the adapter's own update expressions

    def _update(self, sk: str, fields: Json, *, add: Json, condition: str, values: Json) -> Json:
        update: Json = self._expressions._update_args(self.pk, sk, fields, condition, values, add)
        update["TableName"] = self.table
        return update

    @staticmethod
    def create_table(client: Any, table: str) -> None:
        client.create_table(
            TableName=table, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ("pk", "sk", "kind")],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            GlobalSecondaryIndexes=[{"IndexName": "by_kind", "Projection": {"ProjectionType": "ALL"}, "KeySchema": [
                {"AttributeName": "kind", "KeyType": "HASH"}, {"AttributeName": "pk", "KeyType": "RANGE"}]}],
        )

    def seed(self, job_item: Json, excluded: Sequence[Any], tasks: Sequence[Any], clock: SimClock) -> None:
        """The job item as the old design held it, and every node item under the job's partition key."""
        item = {k: v for k, v in job_item.items() if k != "shards"}
        item["excluded"] = _s(json.dumps([{"name": e.name, "reason": e.reason} for e in excluded]))
        self.client.put_item(TableName=self.table, Item=item)
        items = []
        for t in tasks:
            values = {"pk": self.pk, "sk": f"NODE#{t.node}", "kind": "task", "node": t.node, "round": t.round,
                      "phase": t.phase.value, "dispatched_at": t.dispatched_at, "attempt": t.attempt, "seq": t.seq,
                      "version": t.version, "updated_at": t.updated_at}
            items.append({k: _s(v) for k, v in values.items() if v is not None})
        for start in range(0, len(items), 25):
            # The old design puts them all on one partition key: seed at under its 1,000 WCU/s.
            clock.set(clock.now + 25 / 900)
            pending = {self.table: [{"PutRequest": {"Item": i}} for i in items[start : start + 25]]}
            while pending:
                pending = self.client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}

    def apply(self, report: Any) -> str:
        """`applied`, `stale` (changes nothing), or `retry` (throttled or in conflict: deliver again)."""
        from botocore.exceptions import ClientError

        from prewarm.domain.messages import NodePhase
        from prewarm.domain.status import FAILED_PHASES, NodeTaskRecord, report_change

        try:
            for _ in range(10):
                job = self.client.get_item(TableName=self.table, Key={"pk": {"S": self.pk}, "sk": {"S": "JOB"}},
                                           ConsistentRead=True)["Item"]
                if job["uid"]["S"] != report.job_uid or int(job["round"]["N"]) != report.round:
                    return "stale"
                node = self.client.get_item(TableName=self.table, ConsistentRead=True,
                                            Key={"pk": {"S": self.pk}, "sk": {"S": f"NODE#{report.node}"}}).get("Item")
                if node is None:
                    return "stale"
                task = NodeTaskRecord(
                    node=report.node, round=int(node["round"]["N"]), phase=NodePhase(node["phase"]["S"]),
                    dispatched_at=float(node["dispatched_at"]["N"]) if "dispatched_at" in node else None,
                    attempt=int(node.get("attempt", {"N": "0"})["N"]), seq=int(node.get("seq", {"N": "0"})["N"]),
                    version=int(node["version"]["N"]),
                    started_at=float(node["started_at"]["N"]) if "started_at" in node else None,
                )
                change = report_change(task, report, now=time.time())
                if change is None:
                    return "stale"
                node_update = self._update(f"NODE#{report.node}", {**change.fields, "wpk": None},
                                           add={"version": 1}, condition="#version = :v AND #round = :r",
                                           values={":v": task.version, ":r": report.round})
                adds: Json = {k: v for k, v in change.deltas.items() if v}
                adds["version"] = 1
                if change.phase in FAILED_PHASES and task.phase not in FAILED_PHASES:
                    adds["failed_nodes"] = {report.node}
                job_update = self._update("JOB", {}, add=adds, condition="#uid = :u AND #round = :r",
                                          values={":u": report.job_uid, ":r": report.round})
                if task.phase in FAILED_PHASES and change.phase is NodePhase.SUCCEEDED:
                    # The old adapter's _delete_from_set: the node leaves failed_nodes.
                    job_update["UpdateExpression"] += " DELETE #failed_nodes :failed_node"
                    job_update["ExpressionAttributeNames"]["#failed_nodes"] = "failed_nodes"
                    job_update["ExpressionAttributeValues"][":failed_node"] = {"SS": [report.node]}
                try:
                    self.client.transact_write_items(TransactItems=[{"Update": node_update}, {"Update": job_update}])
                except ClientError as e:
                    reasons = [r.get("Code", "") for r in e.response.get("CancellationReasons", [])]
                    if "ConditionalCheckFailed" in reasons and not {"ThrottlingError", "TransactionConflict"} & set(
                            reasons):
                        continue  # another report of this node came first: decide again
                    return "retry"
                return "applied"
            return "retry"
        except ClientError:
            return "retry"  # a throttled read

    def job_item_bytes_at(self, failed_nodes: Iterable[str]) -> int:
        """The old job item's size with `failed_nodes` as its set (and the seeded `excluded` JSON)."""
        from prewarm_devtools.aws_limits import item_size

        item = self.client.get_item(TableName=self.table, Key={"pk": {"S": self.pk}, "sk": {"S": "JOB"}},
                                    ConsistentRead=True)["Item"]
        failed = sorted(failed_nodes)
        if failed:
            item["failed_nodes"] = {"SS": failed}
        else:
            item.pop("failed_nodes", None)
        return int(item_size(item))


def replay_old_path(fleet: Fleet, result: RoundResult, window_s: float, excluded: Sequence[Any],
                    job_item: Json, tasks: Sequence[Any], failed_nodes: Iterable[str]) -> Json:
    """The reports of the round's first `window_s` simulated seconds through `LegacyStatusPath`."""
    import boto3
    from botocore.config import Config

    from prewarm.domain.messages import parse_agent_message

    started = time.perf_counter()
    client = boto3.client("dynamodb", endpoint_url=fleet.moto.url, region_name=REGION,
                          config=Config(retries={"total_max_attempts": 1}, max_pool_connections=OLD_CONCURRENCY + 4))
    table = f"legacy-{result.label}"
    LegacyStatusPath.create_table(client, table)
    old = LegacyStatusPath(client, table, result.key)
    fleet.clock.set(fleet.clock.now + 10)
    old.seed(job_item, excluded, tasks, fleet.clock)
    fleet.clock.set(math.floor(fleet.clock.now) + 10)
    fleet.moto.reset()
    base = fleet.clock.now
    by_second: dict[int, list[str]] = {}
    for second, body in result.sent:
        if second < window_s:
            by_second.setdefault(int(second), []).append(body)
    outcomes: dict[str, int] = {"applied": 0, "stale": 0, "retry": 0}
    retries: list[tuple[str, int]] = []  # (body, deliveries so far), delivered again the next second
    dlq = 0
    lock = threading.Lock()

    def invoke(batch: list[tuple[str, int]]) -> None:
        nonlocal dlq
        for body, deliveries in batch:  # one report after the other, as the old handler did
            outcome = old.apply(parse_agent_message(body))
            with lock:
                outcomes[outcome] += 1
                if outcome != "retry":
                    continue
                if deliveries + 1 >= STATUS_MAX_RECEIVES:
                    dlq += 1
                else:
                    retries.append((body, deliveries + 1))

    replayed = 0
    second = 0
    with ThreadPoolExecutor(max_workers=OLD_CONCURRENCY) as pool:
        while second < window_s or retries:
            fleet.clock.set(base + second)
            work = [(b, 0) for b in by_second.get(second, [])] + retries
            replayed += sum(1 for _, n in work if n == 0)
            retries.clear()
            list(pool.map(invoke, [work[i : i + OLD_BATCH] for i in range(0, len(work), OLD_BATCH)]))
            second += 1
    stats = fleet.moto.stats()
    job_key_writes = next((u.writes for u in stats["keys"] if u.key.table == table and u.key.index_name is None
                           and u.key.value == old.pk), 0)
    hot = max(stats["keys"], key=lambda u: u.wcu, default=None)
    job_bytes_start = old.job_item_bytes_at([])
    job_bytes_end = old.job_item_bytes_at(failed_nodes)
    # What the old path asks of its partition at this report rate: a node item and the job item per
    # report, both transactional (2 WCU per KB each).
    from prewarm_devtools.aws_limits import write_units

    offered = result.peak_reports_per_s * (write_units(job_bytes_end, True) + write_units(200, True))
    return {
        "reports": replayed,
        "sim_seconds": second,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "hottest_key": str(hot.key) if hot else None,
        # Per report applied: a refused delivery writes nothing.
        "hottest_key_writes_per_report": round(hot.writes / max(1, outcomes["applied"]), 3) if hot else 0.0,
        "job_item_writes_per_report": round(job_key_writes / max(1, outcomes["applied"]), 3),
        "hottest_key_wcu_per_s": round(hot.peak_wcu_per_s, 1) if hot else 0.0,
        "offered_wcu_per_s_at_peak_rate": offered,
        "throttles": stats["throttles"],
        "transaction_conflicts": stats["conflicts"],
        "dlq_messages": dlq,
        "lost_reports": dlq,
        "applied": outcomes["applied"], "stale": outcomes["stale"], "deliveries_refused": outcomes["retry"],
        "job_item_bytes": job_bytes_end,
        "job_item_bytes_at_start": job_bytes_start,
    }
