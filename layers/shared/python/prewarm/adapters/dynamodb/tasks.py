"""Node items: one per node of a job's round (`JOB#<key>#<shard>`, sort key `NODE#<node>`), and the
job's excluded nodes beside them (`EXCL#<node>`). Phase changes of a batch and the job's counters are
written together in `TransactWriteItems`, each node item guarded by its `version`, so duplicated or
reordered reports can never double-count; progress writes only its node item."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prewarm.adapters.dynamodb.jobs import JobItems
from prewarm.adapters.dynamodb.table import (
    excluded_sk,
    from_item,
    job_pk,
    node_sk,
    shard_of,
    task_pk,
    to_attribute,
    to_item,
)
from prewarm.domain.job import JobRound
from prewarm.domain.jobs import JobState
from prewarm.domain.messages import NodePhase
from prewarm.domain.placement import ExcludedNode
from prewarm.domain.status import NodeTaskRecord, NodeUpdate, removal_deltas

# TransactWriteItems takes at most 100 actions (DynamoDB quotas): 99 node items and the job item.
MAX_NODES_PER_TRANSACTION = 99
# The sparse, keys-only `flight` index: only node items in flight (dispatched, not finished) carry
# `fpk` (the item's own pk), so the sweep reads those and not every node item of a running job. Set by
# the claim and by reports that move a node to `Pulling`, removed by a final phase; a progress report
# writes the same value again, which leaves the index unwritten.
FLIGHT = "flight"
FLIGHT_KEY = "fpk"
# Items saying a job's node items in flight are indexed: the node items of versions before the index are
# indexed once per job, by the first reader that finds its item missing.
_FLIGHT_INDEXED = "INDEX#flight"


def is_in_flight(task: NodeTaskRecord) -> bool:
    """Dispatched and not finished: the nodes the sweep watches for silence and lost sends."""
    return task.dispatched_at is not None and not task.phase.is_terminal


def in_flight_fields(fields: Mapping[str, Any], pk: str) -> dict[str, Any]:
    """A node update's fields with the sparse indexes' keys it moves: a node leaving `Waiting` leaves the
    `waiting` index; one dispatched or pulling is in flight, one finished no longer is."""
    fields = dict(fields)
    phase = fields.get("phase")
    if phase is not None and phase != NodePhase.WAITING.value:
        fields["wpk"] = None
    if phase is not None and NodePhase(phase).is_terminal:
        fields[FLIGHT_KEY] = None
    elif phase == NodePhase.PULLING.value or fields.get("dispatched_at") is not None:
        fields[FLIGHT_KEY] = pk
    return fields


class NodeTaskItems(JobItems):
    """The node items of each job round, and its excluded nodes."""

    @staticmethod
    def _task_item(key: str, task: NodeTaskRecord, shards: int) -> dict[str, Any]:
        pk = task_pk(key, shard_of(task.node, shards))
        waiting = task.phase is NodePhase.WAITING and task.dispatched_at is None
        return to_item(
            {
                "pk": pk,
                "sk": node_sk(task.node),
                "node": task.node,
                "round": task.round,
                "phase": task.phase.value,
                "dispatched_at": task.dispatched_at,
                "attempt": task.attempt,
                "seq": task.seq,
                "version": task.version,
                "bytes_done": task.bytes_done,
                "bytes_total": task.bytes_total,
                "image_id": task.image_id,
                "message": task.message,
                "started_at": task.started_at,
                "finished_at": task.finished_at,
                "updated_at": task.updated_at,
                "starts_at": task.starts_at,
                "held_at": task.held_at,
                # sparse index of the tasks still waiting for a parallelism slot, per shard
                "wpk": pk if waiting else None,
                # sparse index of the tasks in flight (dispatched, not finished), per shard
                FLIGHT_KEY: pk if task.dispatched_at is not None and not task.phase.is_terminal else None,
            }
        )

    @staticmethod
    def _task(values: dict[str, Any]) -> NodeTaskRecord:
        return NodeTaskRecord(
            node=values["node"],
            round=values["round"],
            phase=NodePhase(values["phase"]),
            dispatched_at=values.get("dispatched_at"),
            attempt=values.get("attempt", 0),
            seq=values.get("seq", 0),
            version=values.get("version", 0),
            bytes_done=values.get("bytes_done"),
            bytes_total=values.get("bytes_total"),
            image_id=values.get("image_id"),
            message=values.get("message", ""),
            started_at=values.get("started_at"),
            finished_at=values.get("finished_at"),
            updated_at=values.get("updated_at"),
            starts_at=values.get("starts_at"),
            held_at=values.get("held_at"),
        )

    def _shard_items(self, what: str, key: str, shards: int, prefix: str) -> Iterator[dict[str, Any]]:
        for pk in self._shard_pks(key, shards):
            yield from self._query(
                what, KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues={":pk": {"S": pk}, ":p": {"S": prefix}}, ConsistentRead=True,
            )

    def get_tasks(self, key: str, *, shards: int | None = None) -> list[NodeTaskRecord]:
        items = self._shard_items(f"read tasks of {key}", key, self._shards(key, shards), "NODE#")
        return sorted((self._task(v) for v in items), key=lambda t: t.node)

    def get_task(self, key: str, node: str, *, shards: int | None = None) -> NodeTaskRecord | None:
        pk = task_pk(key, shard_of(node, self._shards(key, shards)))
        out = self._call("get task", "get_item", Key=self._key(pk, node_sk(node)), ConsistentRead=True)
        return self._task(from_item(out["Item"])) if "Item" in out else None

    def get_tasks_of(self, ref: JobRound, nodes: Iterable[str]) -> dict[str, NodeTaskRecord]:
        keys = [self._key(task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n)) for n in sorted(set(nodes))]
        return {t.node: t for t in (self._task(v) for v in self._batch_get(f"read tasks of {ref.key}", keys))}

    def failed_nodes(self, key: str, *, shards: int | None = None) -> list[str]:
        return [t.node for t in self.get_tasks(key, shards=shards) if t.failed]

    def in_flight_tasks(self, ref: JobRound) -> list[NodeTaskRecord]:
        """The round's node items in flight (dispatched, not finished), by node: keys from the sparse
        `flight` index (eventually consistent), then the items themselves (consistent), re-checked."""
        self._index_in_flight(ref.key, ref.shards)
        keys = [
            self._key(v["pk"], v["sk"])
            for pk in self._shard_pks(ref.key, ref.shards)
            for v in self._query(f"list tasks in flight of {ref.key}", IndexName=FLIGHT,
                                 KeyConditionExpression=f"{FLIGHT_KEY} = :pk",
                                 ExpressionAttributeValues={":pk": {"S": pk}})
        ]
        tasks = (self._task(v) for v in self._batch_get(f"read tasks in flight of {ref.key}", keys))
        return sorted((t for t in tasks if is_in_flight(t) and t.round == ref.round), key=lambda t: t.node)

    def _index_in_flight(self, key: str, shards: int) -> None:
        """Once per job: indexes its node items in flight that a version before the index wrote (every
        write since keeps `fpk`), then marks the job indexed (an item `INDEX#flight`, sort key the job's
        key). Job by job, so a table of many jobs is indexed over the runs that have time for it."""
        indexed: set[str] = self.__dict__.setdefault("_flight_indexed", set())
        if key in indexed:
            return
        marker = {"pk": {"S": _FLIGHT_INDEXED}, "sk": {"S": key}}
        if "Item" not in self._call("read the index marker", "get_item", Key=marker, ConsistentRead=True):
            for values in self._shard_items(f"index tasks of {key}", key, shards, "NODE#"):
                if is_in_flight(self._task(values)) and FLIGHT_KEY not in values:
                    self._update(f"index task {values['sk']} of {key}", values["pk"], values["sk"],
                                 {FLIGHT_KEY: values["pk"]}, condition="attribute_exists(pk)")
            self._call("write the index marker", "put_item", Item=marker)
        indexed.add(key)

    def waiting_nodes(self, key: str, limit: int, *, shards: int | None = None, start: int = 0) -> list[str]:
        """Up to `limit` nodes still waiting for a slot (eventually consistent; claims re-check), read
        from shard `start` on (modulo the shards), then the shards after it in turn."""
        nodes: list[str] = []
        pks = self._shard_pks(key, self._shards(key, shards))  # at least one
        first = start % len(pks)
        for pk in pks[first:] + pks[:first]:
            if len(nodes) >= limit:
                break
            out = self._call(
                "read waiting tasks", "query", IndexName="waiting", KeyConditionExpression="wpk = :pk",
                ExpressionAttributeValues={":pk": {"S": pk}}, Limit=limit - len(nodes),
            )
            nodes += [item["sk"]["S"].removeprefix("NODE#") for item in out.get("Items", [])]
        return nodes

    def put_tasks(self, key: str, tasks: Sequence[NodeTaskRecord], *, shards: int) -> None:
        self._batch_write(f"write tasks of {key}",
                          [{"PutRequest": {"Item": self._task_item(key, t, shards)}} for t in tasks])
        # A plan writes its round's node items with their `fpk`: the job needs no indexing later.
        self._call("write the index marker", "put_item", Item={"pk": {"S": _FLIGHT_INDEXED}, "sk": {"S": key}})

    def delete_tasks(self, key: str, nodes: Sequence[str], *, shards: int) -> None:
        self._batch_write(
            f"delete tasks of {key}",
            [{"DeleteRequest": {"Key": self._key(task_pk(key, shard_of(n, shards)), node_sk(n))}} for n in nodes],
        )

    def get_excluded(self, key: str, *, shards: int | None = None) -> list[ExcludedNode]:
        items = self._shard_items(f"read excluded nodes of {key}", key, self._shards(key, shards), "EXCL#")
        return sorted((ExcludedNode(v["node"], v.get("reason", "")) for v in items), key=lambda e: e.name)

    def put_excluded(self, key: str, excluded: Sequence[ExcludedNode], *, shards: int) -> None:
        """Replaces the job's excluded nodes: each is an item of its own, so the job item never grows."""
        wanted = {e.name: e for e in excluded}
        stale = [e.name for e in self.get_excluded(key, shards=shards) if e.name not in wanted]
        requests = [
            {"PutRequest": {"Item": to_item({"pk": task_pk(key, shard_of(e.name, shards)), "sk": excluded_sk(e.name),
                                           "node": e.name, "reason": e.reason})}}
            for e in wanted.values()
        ]
        requests += [
            {"DeleteRequest": {"Key": self._key(task_pk(key, shard_of(n, shards)), excluded_sk(n))}} for n in stale
        ]
        self._batch_write(f"write excluded nodes of {key}", requests)

    def _node_update(self, ref: JobRound, update: NodeUpdate) -> dict[str, Any]:
        pk = task_pk(ref.key, shard_of(update.node, ref.shards))
        fields = in_flight_fields(update.fields, pk)
        return self._update_args(
            pk, node_sk(update.node), fields,
            condition="#version = :v AND #round = :r", values={":v": update.expected_version, ":r": ref.round},
            add={"version": 1},
        )

    def update_task(self, ref: JobRound, update: NodeUpdate) -> None:
        """One node item alone (progress): the job item is not written."""
        self._call(f"record {update.node} in {ref.key}", "update_item", **self._node_update(ref, update))

    def apply_updates(self, ref: JobRound, updates: Sequence[NodeUpdate], deltas: Mapping[str, int]) -> None:
        """Node items and one job counter update in one transaction (at most 99 nodes: 100 actions)."""
        if len(updates) > MAX_NODES_PER_TRANSACTION:
            raise ValueError(f"{len(updates)} node updates in one transaction; at most {MAX_NODES_PER_TRANSACTION}")
        items = [{"Update": self._node_update(ref, u)} for u in updates]
        adds: dict[str, Any] = {k: v for k, v in deltas.items() if v}
        if adds:
            adds["version"] = 1
            job = self._update_args(job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r",
                                    values={":u": ref.uid, ":r": ref.round}, add=adds)
            items.append({"Update": job})
        self._transact(f"record {len(updates)} nodes in {ref.key}", items)

    def _add_actions(self, ref: JobRound, tasks: Sequence[NodeTaskRecord], plan_id: str) -> list[dict[str, Any]]:
        puts = [
            {"Put": {
                "Item": self._task_item(ref.key, task, ref.shards),
                "ConditionExpression": "attribute_not_exists(pk) OR #round < :r",
                "ExpressionAttributeNames": {"#round": "round"},
                "ExpressionAttributeValues": {":r": to_attribute(ref.round)},
            }}
            for task in tasks
        ]
        job = self._update_args(
            job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r AND #planned = :p",
            values={":u": ref.uid, ":r": ref.round, ":p": plan_id},
            add={"desired": len(tasks), "waiting": len(tasks), "version": 1},
        )
        return [*puts, {"Update": job}]

    def add_task(self, ref: JobRound, task: NodeTaskRecord, *, plan_id: str) -> None:
        """Adds one node to a planned round, counting it, atomically (new nodes, edited selectors)."""
        self._transact(f"add {task.node} to {ref.key}", self._add_actions(ref, [task], plan_id))

    def add_tasks(self, ref: JobRound, tasks: Sequence[NodeTaskRecord], *, plan_id: str) -> list[str]:
        """Adds nodes to a planned round, counting them, up to 99 a transaction (a batch of hellos): the
        nodes added. A node already in the round is left out; a round or plan that changed adds none."""
        pending = list({t.node: t for t in tasks}.values())
        added: list[str] = []
        while pending:
            chunk = pending[:MAX_NODES_PER_TRANSACTION]
            reasons = self._transact_or_reasons(f"add {len(chunk)} nodes to {ref.key}",
                                                self._add_actions(ref, chunk, plan_id))
            if reasons is not None:
                if len(reasons) > len(chunk) and reasons[len(chunk)] == "ConditionalCheckFailed":
                    return added  # the job left this round or plan: the next plan selects the nodes
                present = {t.node for t, r in zip(chunk, reasons, strict=False) if r == "ConditionalCheckFailed"}
                pending = [t for t in pending if t.node not in present]
                continue
            added += [t.node for t in chunk]
            pending = pending[len(chunk):]
        return added

    def remove_task(self, ref: JobRound, task: NodeTaskRecord) -> None:
        """Removes one node from the round and from the counters, atomically (deselected nodes)."""
        delete = {
            "Key": self._key(task_pk(ref.key, shard_of(task.node, ref.shards)), node_sk(task.node)),
            "ConditionExpression": "#version = :v",
            "ExpressionAttributeNames": {"#version": "version"},
            "ExpressionAttributeValues": {":v": to_attribute(task.version)},
        }
        job = self._update_args(
            job_pk(ref.key), "JOB", {}, condition="#uid = :u AND #round = :r",
            values={":u": ref.uid, ":r": task.round}, add={**removal_deltas(task), "version": 1},
        )
        self._transact(f"remove {task.node} from {ref.key}", [{"Delete": delete}, {"Update": job}])

    def claim_tasks(self, ref: JobRound, nodes: Sequence[str], *, parallelism: int, now: float) -> list[str]:
        """Dispatches `nodes` in one transaction: each still waiting, and `active` stays within `parallelism`.

        A node another run claimed first cancels the transaction; it is dropped and the rest tried
        again, so the job item is written once per batch of claims, not once per node.
        """
        pending = list(dict.fromkeys(nodes))[:MAX_NODES_PER_TRANSACTION]
        while pending:
            claims = [
                self._update_args(
                    task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n),
                    {"dispatched_at": now, "starts_at": None, "held_at": None, "wpk": None,
                     FLIGHT_KEY: task_pk(ref.key, shard_of(n, ref.shards))},
                    condition="attribute_not_exists(dispatched_at) AND #round = :r AND #phase = :w",
                    values={":r": ref.round, ":w": NodePhase.WAITING.value}, add={"version": 1},
                )
                for n in pending
            ]
            job = self._update_args(
                job_pk(ref.key), "JOB", {}, condition="#active <= :most AND #round = :r AND #state = :running",
                values={":most": parallelism - len(pending), ":r": ref.round, ":running": JobState.RUNNING},
                add={"active": len(pending), "waiting": -len(pending), "version": 1},
            )
            reasons = self._transact_or_reasons(f"claim {len(pending)} nodes in {ref.key}",
                                                [{"Update": c} for c in claims] + [{"Update": job}])
            if reasons is not None:
                if len(reasons) > len(pending) and reasons[len(pending)] == "ConditionalCheckFailed":
                    # The job has fewer free slots than asked for (or left the round): ask for fewer.
                    pending = pending[:-1]
                    continue
                taken = {n for n, r in zip(pending, reasons, strict=False) if r == "ConditionalCheckFailed"}
                pending = [n for n in pending if n not in taken]
                continue
            return pending
        return []

    def record_pull_starts(self, ref: JobRound, starts: Mapping[str, float], *, held: Sequence[str] = (),
                           now: float) -> None:
        """Each node's paced start or hold, up to 99 node items a transaction (the version untouched: no
        report meets it); a node no longer claimed in the round drops out and the rest are written again."""
        pending: dict[str, dict[str, float]] = {**{n: {"held_at": now} for n in held},
                                                **{n: {"starts_at": at} for n, at in starts.items()}}
        while pending:
            chunk = list(pending)[:MAX_NODES_PER_TRANSACTION]
            updates = [{"Update": self._update_args(
                task_pk(ref.key, shard_of(n, ref.shards)), node_sk(n), pending[n],
                condition="attribute_exists(dispatched_at) AND #round = :r", values={":r": ref.round})}
                for n in chunk]
            reasons = self._transact_or_reasons(f"record {len(chunk)} pull starts in {ref.key}", updates)
            refused = {n for n, r in zip(chunk, reasons or [], strict=False) if r == "ConditionalCheckFailed"}
            for node in chunk if reasons is None or not refused else refused:
                pending.pop(node)
