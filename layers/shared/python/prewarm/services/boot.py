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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prewarm.domain.boot import WarmCondition, at_hello, at_warm, boot_due, boot_record
from prewarm.domain.clusters import DEFAULT_CLUSTER
from prewarm.domain.messages import ALREADY_PRESENT, Hello, NodePhase, RequiredImage, Warmed
from prewarm.domain.nodes import NodeBoot, NodeWarm, RegisteredNode
from prewarm.domain.retry import retry_on_conflict
from prewarm.domain.status import NodeTaskRecord
from prewarm.domain.warming import AGENT_NAME, AGENT_NAMESPACE, StartupTaint, WarmLimits
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


def releasable(hello: Hello, boot: NodeBoot, *, now: float) -> bool:
    """Whether a node's first hello lets its startup taint come off at once: it holds the taint and has every
    required image (none required counts: its agent would release it on the empty list)."""
    return hello.warm_until is not None and hello.warm_until > now and (boot.all_present or not boot.required)


def judge_boots(writes: NodeWarmWrites | None, judged: Mapping[str, tuple[Hello, NodeBoot, Mapping[str, Any] | None]],
                *, now: float, each: Callable[[Callable[[str], None], list[str]], object]) -> None:
    """`judge_boot` for each node of a batch of first hellos (node → its hello, its images at boot, its Node as
    registering it read it, None when not read), through `each` (the batch's concurrent calls). The agents'
    ConfigMap is read once, and only when some node is to be released."""
    if writes is None or not judged:
        return
    taint: StartupTaint | None = None
    if releasing := sorted(n for n, (hello, boot, _) in judged.items() if releasable(hello, boot, now=now)):
        try:
            taint = agent_taint(writes)
        except ClusterError as e:
            log.warning("nodes %s: their warm-up at boot not written on the Node (their agents remove the taint "
                        "themselves): %s", ", ".join(releasing), e)
    each(lambda n: judge_boot(writes, *judged[n], taint=taint, now=now), list(judged))


def judge_boot(writes: NodeWarmWrites, hello: Hello, boot: NodeBoot, seen: Mapping[str, Any] | None = None, *,
               taint: StartupTaint | None, now: float) -> None:
    """After a node's first hello: removes its startup taint at once when it holds it and has every required
    image, then sets its `PrewarmWarm` condition. `seen`: the Node as last read (None: read it); `taint`: the
    startup taint as the agents' ConfigMap names it (None: that could not be read, and a node to release is
    left to its agent, its condition with it)."""
    try:
        if releasable(hello, boot, now=now):
            if taint is None:
                return
            release_taint(writes, hello.node, taint, seen)
        set_condition(writes, hello.node, at_hello(boot), now=now)
    except ClusterError as e:
        log.warning("node %s: its warm-up at boot not written on the Node (its agent removes the taint "
                    "itself): %s", hello.node, e)


def agent_taint(writes: NodeWarmWrites) -> StartupTaint:
    """The startup taint, as the agents' ConfigMap names it."""
    config = writes.get_object("v1", "configmaps", AGENT_NAME, AGENT_NAMESPACE)
    return WarmLimits.of_agent_config((config or {}).get("data")).taint


def release_taint(writes: NodeWarmWrites, node: str, taint: StartupTaint, seen: Mapping[str, Any] | None = None
                  ) -> bool:
    """Removes `taint` from `node`; False when it did not hold it. The guarded patch is made from `seen` (the
    Node as last read) when given; a Node changed since the read (its guard failed) is read again."""
    read = [seen] if seen is not None else []

    def once() -> bool:
        current = read.pop() if read else writes.get_node(node)
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
