"""Warm as a node fact, on the control plane's side (docs/agent.md, "Warm at boot"): a node's first hello
records which of its required images were present at boot; a node that holds the startup taint and has
them all loses the taint at once, without waiting for its agent's pulls; and the node's `PrewarmWarm`
condition says where its warm-up stands, from that hello and from its agent's `Warmed`.

The writes on the Node are `record_status`'s (the group `prewarm-startup-taint` may remove the startup
taint and change nothing else, `prewarm-node-warm` may set this condition and nothing else:
cli/prewarm_cli/install/manifests). A write the API refuses is logged and left: the agent removes the
taint itself once its list of required images arrives, and the next warm-up event sets the condition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prewarm.domain.boot import WarmCondition, at_hello, at_warm, boot_due, boot_record
from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.messages import ALREADY_PRESENT, Hello, NodePhase, RequiredImage, Warmed
from prewarm.domain.nodes import NodeBoot, NodeWarm, RegisteredNode
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.status import NodeTaskRecord
from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE, WarmLimits
from prewarm.services.ports import (
    AgentItems,
    ClusterError,
    ClusterInvalidError,
    ClusterNotFoundError,
    NodeItems,
    NodeWarmWrites,
    StoreError,
)

log = logging.getLogger(__name__)


def record_boots(
    store: NodeItems,
    hellos: Mapping[str, tuple[RegisteredNode | None, Hello, Sequence[RequiredImage]]],
    *,
    cluster: str = DEFAULT_CLUSTER,
    now: float,
) -> tuple[dict[str, NodeBoot], dict[str, StoreError]]:
    """For each node whose hello is its first (`boot_due`: node → its registration before the hello, the
    hello, the images required of it), records which of those images its hello's digests hold. Returns
    them, and the nodes whose write the store refused (their hellos come again)."""
    boots: dict[str, NodeBoot] = {}
    failed: dict[str, StoreError] = {}
    for node, (prior, hello, required) in hellos.items():
        if not boot_due(prior, hello):
            continue
        boot = boot_record(required, hello.images, at=now)
        try:
            store.record_boot(node, boot, cluster)
        except StoreError as e:
            failed[node] = e
            continue
        boots[node] = boot
        log.info("node %s: %d of %d required images present at boot", node, len(boot.present), len(boot.required))
    return boots, failed


def record_warm(store: AgentItems, warmed: Warmed, writes: NodeWarmWrites | None, *, now: float) -> NodeWarm:
    """Stores how a node's startup taint came off, for `describe node` and `get nodes`, and sets its
    condition (given `writes`). A node not registered yet raises `StoreConflictError` (SQS may deliver the
    `Warmed` before the hello: it comes again)."""
    warm = NodeWarm(
        joined_at=warmed.joined_at, hello_at=warmed.hello_at, warm_at=warmed.warm_at, outcome=warmed.outcome,
        missing=tuple(warmed.missing), missing_total=max(warmed.missing_total, len(warmed.missing)),
    )
    registered = store.record_warm(warmed.node, warm, warmed.cluster)
    judge_warm(writes, registered, now=now)
    return warm


@dataclass(frozen=True)
class BootOutcome:
    """What `judge_boot` did on the Node: the condition it set, and whether it removed the startup taint."""

    condition: WarmCondition
    released: bool = False
    problem: str = ""  # why a write was refused (empty: none was)


def judge_boot(writes: NodeWarmWrites | None, hello: Hello, boot: NodeBoot, *, now: float) -> BootOutcome:
    """After a node's first hello: removes its startup taint at once when it holds it and has every
    required image (none required counts: its agent would release it on the empty list), then sets its
    `PrewarmWarm` condition."""
    condition = at_hello(boot)
    if writes is None:
        return BootOutcome(condition, problem="no cluster access")
    released, problem = False, ""
    try:
        if hello.warm_until is not None and hello.warm_until > now and (boot.all_present or not boot.required):
            released = release_taint(writes, hello.node)
        set_condition(writes, hello.node, condition, now=now)
    except ClusterError as e:
        problem = str(e)
        log.warning("node %s: its warm-up at boot not written on the Node (its agent removes the taint "
                    "itself): %s", hello.node, e)
    return BootOutcome(condition, released, problem)


def release_taint(writes: NodeWarmWrites, node: str) -> bool:
    """Removes the startup taint (the agents' ConfigMap's) from `node`; False when it did not hold it.
    A Node changed between the read and the patch (its guard failed) is read again."""
    config = writes.get_object("v1", "configmaps", AGENT_NAME, AGENT_NAMESPACE)
    taint = WarmLimits.of_agent_config((config or {}).get("data")).taint

    def once() -> bool:
        current = writes.get_node(node)
        ops = taint.removal_patch(current) if current is not None else None
        if ops is None:
            return False
        writes.patch_node(node, ops)
        return True

    try:
        released = retry_on_conflict(once, conflict=ClusterInvalidError, attempts=3)
    except ClusterNotFoundError:
        return False
    if released:
        log.info("node %s: every required image present at boot, startup taint %s removed", node, taint)
    return released


def set_condition(writes: NodeWarmWrites, node: str, condition: WarmCondition, *, now: float) -> None:
    """Sets the node's `PrewarmWarm` condition (a strategic merge patch of its status: the kubelet's own
    conditions stay)."""
    writes.patch_node_status(node, condition.patch(now=now))


def bytes_pulled(tasks: Iterable[NodeTaskRecord]) -> int:
    """What the node's pulls downloaded: the bytes of its Succeeded pulls that were not already present
    (the report of an image already there carries its size, not bytes pulled)."""
    return sum(t.bytes_done or 0 for t in tasks if t.phase is NodePhase.SUCCEEDED and t.message != ALREADY_PRESENT)


def node_bytes_pulled(store: AgentItems, node: str, cluster: str = DEFAULT_CLUSTER) -> int:
    """What the node's pulls for the running `Never` jobs (its required images) downloaded, summed from
    their reports as stored: read when shown, since a node's last report may come after its `Warmed`."""
    return sum(bytes_pulled(store.get_tasks_of(record.ref, [node]).values())
               for record in store.list_running_jobs(cluster) if record.is_running_never)


def judge_warm(writes: NodeWarmWrites | None, registered: RegisteredNode, *, now: float) -> None:
    """After the node's `Warmed` is stored (`registered`: its registration as that write left it): sets its
    condition, when there is a cluster to write to."""
    if writes is None or registered.warm is None:
        return
    try:
        set_condition(writes, registered.name, at_warm(registered.warm, registered.boot), now=now)
    except ClusterError as e:
        log.warning("node %s: its PrewarmWarm condition not set: %s", registered.name, e)
