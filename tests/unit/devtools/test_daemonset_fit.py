"""Local mode's DaemonSet controller places agents by the rule jobs' placement uses; only the startup taint
differs: the controller keeps a pod off a node it is not tolerated on, where placement waits for it to go."""

from __future__ import annotations

from typing import Any

from prewarm.domain.placement import AgentPlacement
from prewarm_devtools.daemonset import daemon_pod, fits

WARMING = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


def node(*taints: dict[str, str], **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux", **labels}},
            "spec": {"taints": list(taints)}}


def daemon_set(**pod_spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "prewarm-agent", "namespace": "prewarm-system", "uid": "u1"},
            "spec": {"template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [], **pod_spec}}}}


def test_a_node_fits_as_placement_says() -> None:
    spec = {"nodeSelector": {"pool": "general"}}
    assert fits(spec, node(pool="general"))
    assert not fits(spec, node(pool="gpu"))
    assert not fits({}, node({"key": "dedicated", "effect": "NoExecute"}))


def test_the_controller_keeps_a_pod_off_an_untolerated_startup_taint_that_placement_ignores() -> None:
    spec = {"tolerations": [{"key": "gpu", "operator": "Exists"}]}
    assert not fits(spec, node(WARMING))
    assert AgentPlacement.of_pod_spec(spec).misfit(node(WARMING)) is None
    assert fits({"tolerations": [{"operator": "Exists"}]}, node(WARMING))


def test_a_daemon_pod_gets_the_controllers_tolerations_and_network_unavailable_only_with_host_network() -> None:
    own = {"key": "gpu", "operator": "Exists"}
    tolerations = daemon_pod(daemon_set(tolerations=[own]), "n1")["spec"]["tolerations"]
    assert tolerations[0] == own
    assert {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"} in tolerations
    assert "node.kubernetes.io/network-unavailable" not in [t["key"] for t in tolerations]
    host = daemon_pod(daemon_set(hostNetwork=True), "n1")["spec"]["tolerations"]
    assert {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"} in host
