"""`prewarm doctor`'s "container runtimes": the containerd version of each agent node, as its kubelet
reports it (`status.nodeInfo.containerRuntimeVersion`: no call beyond the nodes the DaemonSet check
listed), the node settings that made pulls faster or safer on those versions (benchmarks/pull_limit.py),
and a warning where pinning cannot keep an image from kubelet's image garbage collection: containerd
before 1.7.10, or a kubelet (`status.nodeInfo.kubeletVersion`) that ignores what the CRI reports pinned
(`prewarm.domain.runtimes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prewarm.domain.mirrors import NodeMirrors, judge_mirrors
from prewarm.domain.nodes import RegisteredNode
from prewarm.domain.runtimes import ContainerRuntime, KubeletVersion, KubeletVersionError, RuntimeVersionError
from prewarm_cli.doctor.checks import CheckResult, skipped
from prewarm_cli.output import listed

NAME = "container runtimes"
PIN_FIX = ("pinned jobs' images may be removed by kubelet's image garbage collection there: run containerd "
           "1.7.10 or later (EKS AL2023 AMIs run 2.x) and kubelet 1.29 or later, or 1.28.2, 1.27.6, 1.26.9, "
           "1.25.14 or a later patch of theirs (kubernetes#119986; docs/agent.md, \"Pinning\")")


def _node_info(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("status") or {}).get("nodeInfo") or {}


def _runtime(node: Mapping[str, Any]) -> ContainerRuntime | str:
    reported = _node_info(node).get("containerRuntimeVersion") or ""
    try:
        return ContainerRuntime.parse(reported)
    except RuntimeVersionError:
        return reported or "not reported"


def _kubelet_ignoring_pins(node: Mapping[str, Any]) -> str | None:
    """The kubelet version of a node whose kubelet ignores pinned images; None when it honours them or
    reports no version it can be judged by (the runtime's own check still covers the node)."""
    reported = _node_info(node).get("kubeletVersion") or ""
    try:
        return None if KubeletVersion.parse(reported).honours_pins else f"kubelet {reported}"
    except KubeletVersionError:
        return None


def check_container_runtimes(nodes: Sequence[Mapping[str, Any]]) -> CheckResult:
    """Counts the agent nodes by runtime version; warns naming the nodes where pinning cannot work."""
    if not nodes:
        return skipped(NAME, "no node for the agents")
    by_version: dict[str, list[str]] = {}
    cannot_pin: dict[str, list[str]] = {}
    advice: dict[str, None] = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        runtime = _runtime(node)
        shown = f"{runtime.name} {runtime.version}" if isinstance(runtime, ContainerRuntime) else runtime
        by_version.setdefault(shown, []).append(name)
        if isinstance(runtime, ContainerRuntime):
            advice.update(dict.fromkeys(runtime.pull_advice))
        if not isinstance(runtime, ContainerRuntime) or not runtime.pins:
            cannot_pin.setdefault(name, []).append(shown)
        if kubelet := _kubelet_ignoring_pins(node):
            cannot_pin.setdefault(name, []).append(kubelet)
    counts = "; ".join(f"{version} on {len(names)} node{'s' if len(names) != 1 else ''}"
                       for version, names in sorted(by_version.items()))
    if advice:
        counts += f" (for pulls: {'; '.join(advice)})"
    if not cannot_pin:
        return CheckResult(NAME, True, counts)
    where = listed([f"{node} ({', '.join(why)})" for node, why in sorted(cannot_pin.items())])
    return CheckResult(NAME, True, f"{counts}; pinning cannot work on {len(cannot_pin)}: {where}", PIN_FIX,
                       warning=True)


MIRRORS = "registry mirrors"


def check_registry_mirrors(registered: Sequence[RegisteredNode],
                           nodes: Sequence[Mapping[str, Any]] | None) -> CheckResult:
    """Node-local mirrors in the agents' containerd config (their hellos), and a warning where containerd
    2.1+ ignores them (`prewarm.domain.mirrors`); `nodes`: the cluster's, for their runtime versions."""
    reporting = [n for n in registered if n.mirror_config is not None]
    if not reporting:
        return skipped(MIRRORS, "no agent has reported its containerd's registry config (agents older than "
                                "the report, or none said hello)")
    runtimes = {str(n["metadata"]["name"]): runtime for n in nodes or ()
                if isinstance(runtime := _runtime(n), ContainerRuntime)}
    finding = judge_mirrors([NodeMirrors(n.name, n.mirror_config.mirrors, n.mirror_config.local_image_pull,
                                         runtimes.get(n.name)) for n in reporting if n.mirror_config is not None],
                            reported=len(reporting))
    return CheckResult(MIRRORS, True, finding.text, finding.fix, warning=finding.warning)
