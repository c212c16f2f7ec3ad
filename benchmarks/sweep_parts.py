"""What both of the sweep benchmark's scenarios use: the synthetic nodes, the counted Kubernetes client and
the function's budget."""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from typing import Any

BUDGET_S = 55.0  # the sweep function's Timeout in template.yaml
PEAK_MB = 256.0


def padded_nodes(count: int, images: int, seed: int = 11) -> list[dict[str, Any]]:
    """Synthetic EKS nodes, each with `images` images (the synthetic ones, then made-up ones)."""
    from prewarm_devtools.kubeapi.synthetic import generate_nodes

    rng = random.Random(seed)
    nodes = generate_nodes(count, seed=seed)
    for node in nodes:
        listed = node["status"]["images"]
        while len(listed) < images:
            repo = f"111122223333.dkr.ecr.us-west-2.amazonaws.com/team-{rng.randrange(40)}/app-{len(listed)}"
            digest = f"sha256:{rng.getrandbits(256):064x}"
            listed.append({"names": [f"{repo}@{digest}", f"{repo}:v{rng.randrange(100)}"],
                           "sizeBytes": rng.randrange(10**8, 10**10)})
    return nodes


class CountingCluster:
    """The Kubernetes adapter, counting requests by verb and representation (full or metadata)."""

    def __init__(self, cluster: Any, on_call: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.calls: collections.Counter[str] = collections.Counter()
        request = cluster._request

        def counted(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            shape = "metadata" if "PartialObjectMetadata" in kwargs.get("accept", "") else "full"
            what = "list" if path.endswith("/nodes") and method == "GET" else method.lower()
            # A POST names its collection last; other verbs, the object's after it.
            # A subresource (a node's /status) follows the object's name: "patch nodes/status".
            parts = path.split("/")
            subresource = what != "post" and parts[-1] == "status"
            kind = "nodes" if what == "list" else parts[-1 if what == "post" else -3 if subresource else -2]
            self.calls[f"{what} {kind}{'/status' if subresource else ''} ({shape})"] += 1
            if on_call is not None:  # named as capacity_calls.LATENCY_S names them
                verb = {"post": "create"}.get(what, what)
                op = f"{verb}_{kind.removesuffix('s')}{'_status' if subresource else ''}"
                on_call("kubernetes:list_nodes" if what == "list" else f"kubernetes:{op}")
            return request(method, path, *args, **kwargs)

        cluster._request = counted


def time_left_from(started: float) -> Callable[[], float]:
    """The seconds left of the function's budget for a run started at `started` (monotonic)."""
    return lambda: BUDGET_S - (time.monotonic() - started)


def outside_repairs(now: float, minutes: int) -> float:
    """`now`, moved back by whole minutes until the `minutes` from it hold none of the node repair's runs
    (the sweep's minute, one in `REPAIR_EVERY_RUNS`, reads and writes up to 20 Nodes: `services.node_facts`).
    The figures are of the sweep's other runs, and the wall clock must not decide which a run is."""
    from prewarm.services.node_facts import REPAIR_EVERY_RUNS

    while any(int(now // 60 + i) % REPAIR_EVERY_RUNS == 0 for i in range(minutes)):
        now -= 60
    return now
