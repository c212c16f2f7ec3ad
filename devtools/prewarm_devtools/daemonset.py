"""Local mode's DaemonSet controller and kubelet, for the one DaemonSet it runs: the agent's.

On EKS the DaemonSet controller gives `prewarm-system/prewarm-agent` a pod on every node its template
fits, and each node's kubelet reports that pod Ready while the agent runs. Local mode runs the agents
itself, beside the embedded API, so it plays both parts: `AgentDaemonSet.reconcile()` makes one pod per
fitting node (the template's labels, `spec.nodeName`, an owner reference to the DaemonSet), sets each
pod's status from its node's agent (running: Ready; stopped, killed or exited: not Ready; no agent on
the node: Pending) and writes the DaemonSet's `status` counts as the controller does. Anything that
reads the cluster (`prewarm doctor`, kubectl) then sees the agents as it would on EKS.

Writes go through the embedded API's registry, so they are validated, versioned and watched as any
client's would be. The pure parts (where a pod fits, its body, its status, the DaemonSet's counts)
are functions of their own.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from prewarm.domain.placement import AgentPlacement, daemon_tolerations

log = logging.getLogger(__name__)

Obj = dict[str, Any]

TEMPLATE_GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
TEMPLATE_GENERATION_LABEL = "pod-template-generation"
REVISION_HASH_LABEL = "controller-revision-hash"


class AgentState(StrEnum):
    """What runs as a node's agent, which decides its pod's status."""

    RUNNING = "running"
    STOPPED = "stopped"  # SIGTERM: drained and exited 0
    KILLED = "killed"  # SIGKILL: 137
    EXITED = "exited"  # ended on its own
    ABSENT = "absent"  # no agent on the node (a node added with --no-agent, or not Ready at start)


# -- where a daemon pod fits ------------------------------------------------------------------------


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def fits(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the DaemonSet controller puts a pod of `pod_spec` on `node`: the rule jobs' placement uses
    (`prewarm.domain.placement.AgentPlacement`), the startup taint included, as the controller sees it."""
    return AgentPlacement.of_pod_spec(pod_spec, transient_taints=frozenset()).misfit(node) is None


# -- the pod and its status -------------------------------------------------------------------------


def template_generation(daemon_set: Mapping[str, Any]) -> str:
    return str(((daemon_set.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_GENERATION_ANNOTATION, "1"))


def revision_hash(template: Mapping[str, Any]) -> str:
    """A stable short hash of the pod template, as the controller labels its pods with."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def daemon_pod(daemon_set: Mapping[str, Any], node: str) -> Obj:
    """The pod the controller creates for `node`: the template, bound to the node, owned by the DaemonSet."""
    meta = daemon_set["metadata"]
    template = copy.deepcopy(daemon_set["spec"]["template"])
    template_meta = template.get("metadata") or {}
    spec = template["spec"]
    spec["nodeName"] = node
    own = list(spec.get("tolerations") or ())
    spec["tolerations"] = [*own, *(dict(t) for t in daemon_tolerations(spec) if t not in own)]
    labels = {**(template_meta.get("labels") or {}), REVISION_HASH_LABEL: revision_hash(daemon_set["spec"]["template"]),
              TEMPLATE_GENERATION_LABEL: template_generation(daemon_set)}
    metadata: Obj = {
        "generateName": f"{meta['name']}-", "namespace": meta["namespace"], "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"], "uid": meta["uid"],
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if template_meta.get("annotations"):
        metadata["annotations"] = dict(template_meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _container_state(state: AgentState, now: str) -> Obj:
    if state is AgentState.RUNNING:
        return {"running": {"startedAt": now}}
    if state is AgentState.ABSENT:
        return {"waiting": {"reason": "ContainerCreating"}}
    code, reason = {AgentState.STOPPED: (0, "Completed"), AgentState.KILLED: (137, "Error")}.get(state, (1, "Error"))
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}}


def _signature(status: Mapping[str, Any]) -> tuple[Any, ...]:
    container = (status.get("containerStatuses") or [{}])[0]
    state = container.get("state") or {}
    kind = next(iter(state), None)
    return status.get("phase"), kind, (state.get(kind) or {}).get("reason") if kind else None, container.get("ready")


def pod_status(pod: Mapping[str, Any], state: AgentState, now: str) -> Obj:
    """The kubelet's status of a daemon pod whose agent is in `state`: the current status itself when
    nothing changed, so that an unchanged pod is not written again."""
    old: Obj = dict(pod.get("status") or {})
    container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    old_container = (old.get("containerStatuses") or [{}])[0]
    ready = state is AgentState.RUNNING
    running_state = _container_state(state, now)
    new: Obj = {
        **{k: v for k, v in old.items() if k == "qosClass"},
        "phase": "Pending" if state is AgentState.ABSENT else "Running",
        "hostIP": "127.0.0.1",
        "startTime": old.get("startTime", now),
    }
    new["containerStatuses"] = [{"name": container.get("name"), "ready": ready, "state": running_state}]
    if _signature(new) == _signature(old):
        return old
    old_kind = next(iter(old_container.get("state") or {}), None)
    readiness = "True" if ready else "False"
    not_ready = {} if ready else {"reason": "ContainersNotReady",
                                  "message": f"containers with unready status: [{container.get('name')}]"}
    new["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "True" if new["phase"] == "Running" else "False",
         "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": new["startTime"]},
        {"type": "Ready", "status": readiness, "lastTransitionTime": now, **not_ready},
        {"type": "ContainersReady", "status": readiness, "lastTransitionTime": now, **not_ready},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": new["startTime"]},
    ]
    container_status: Obj = {
        "name": container.get("name"), "image": container.get("image"), "imageID": "", "ready": ready,
        "started": ready, "state": running_state,
        # A container that ran and runs again was restarted, as the kubelet counts it.
        "restartCount": int(old_container.get("restartCount") or 0) + (1 if ready and old_kind == "terminated" else 0),
    }
    if old_kind == "terminated":
        container_status["lastState"] = {"terminated": old_container["state"]["terminated"]}
    new["containerStatuses"] = [container_status]
    return new


def daemon_set_status(daemon_set: Mapping[str, Any], wanted: set[str], pods: Mapping[str, Mapping[str, Any]]) -> Obj:
    """The DaemonSet controller's counts: `pods` holds the one pod per node it keeps (it deletes any other,
    so none is misscheduled)."""
    generation = template_generation(daemon_set)
    scheduled = [pods[n] for n in sorted(wanted) if n in pods]
    ready = sum(is_ready(p) for p in scheduled)
    updated = sum(_labels(p).get(TEMPLATE_GENERATION_LABEL) == generation for p in scheduled)
    status: Obj = {
        "currentNumberScheduled": len(scheduled), "numberMisscheduled": 0,
        "desiredNumberScheduled": len(wanted), "numberReady": ready,
        "observedGeneration": int((daemon_set.get("metadata") or {}).get("generation") or 1),
    }
    # omitempty in apps/v1: zero counts are not written.
    for key, value in (("updatedNumberScheduled", updated), ("numberAvailable", ready),
                       ("numberUnavailable", len(wanted) - ready)):
        if value:
            status[key] = value
    return status


# -- the controller ---------------------------------------------------------------------------------


class AgentDaemonSet:
    """Keeps the agent DaemonSet's pods and status current in the embedded API (`kube`, a `KubeApiServer`).

    `agent_state(node)` says what runs as that node's agent. `reconcile()` is called after anything that
    changes an agent or a node, and every `interval` seconds by `start()` (an agent can die by itself).
    """

    def __init__(self, kube: Any, agent_state: Callable[[str], AgentState], *, namespace: str, name: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.agent_state = agent_state
        self.namespace = namespace
        self.name = name
        self.clock = clock
        self._lock = threading.Lock()
        self._ticker: Any = None

    def start(self, interval: float = 1.0) -> AgentDaemonSet:
        from prewarm_devtools.node.process import Ticker

        self.reconcile()
        self._ticker = Ticker("prewarm-local-daemonset", self.reconcile, interval).start()
        return self

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def reconcile(self) -> None:
        from prewarm_devtools.kubeapi.errors import StatusError
        from prewarm_devtools.kubeapi.resources.apps import DAEMON_SETS
        from prewarm_devtools.kubeapi.resources.pods import PODS

        with self._lock:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
            daemon_set = self.kube.get_object("daemonsets", self.name, self.namespace)
            uid = (daemon_set or {}).get("metadata", {}).get("uid")
            kept: dict[str, Obj] = {}
            nodes = {n["metadata"]["name"]: n for n in self.kube.list_objects("nodes")}
            wanted: set[str] = set()
            if daemon_set is not None:
                template_spec = daemon_set["spec"]["template"]["spec"]
                wanted = {name for name, node in nodes.items() if fits(template_spec, node)}
            generation = template_generation(daemon_set or {})
            ours = [p for p in self.kube.list_objects("pods", self.namespace) if self._owner_of(p) is not None]
            for pod in sorted(ours, key=lambda p: p["metadata"].get("creationTimestamp", "")):
                node = pod["spec"].get("nodeName", "")
                current = self._owner_of(pod) == uid and _labels(pod).get(TEMPLATE_GENERATION_LABEL) == generation
                if node in wanted and current and node not in kept:
                    kept[node] = pod
                else:
                    # Its DaemonSet is gone (the garbage collector's part), its template changed (rolled at once),
                    # its node left or no longer fits, or it is a duplicate: the controller deletes it.
                    self.kube.remove_object("pods", pod["metadata"]["name"], self.namespace)
            if daemon_set is None:
                return
            for node in sorted(wanted - kept.keys()):
                kept[node] = self.kube.registry.create(PODS, self.namespace, daemon_pod(daemon_set, node))
            for node, pod in kept.items():
                status = pod_status(pod, self.agent_state(node), now)
                if status != pod.get("status"):
                    kept[node] = self.kube.registry.replace(PODS, self.namespace, pod["metadata"]["name"],
                                                            {**pod, "status": status}, subresource="status")
            status = daemon_set_status(daemon_set, wanted, kept)
            if status != daemon_set.get("status"):
                try:
                    self.kube.registry.replace(DAEMON_SETS, self.namespace, self.name,
                                               {**daemon_set, "status": status}, subresource="status")
                except StatusError as e:
                    if e.code != 409:
                        raise
                    # `prewarm install` replaced it meanwhile: the next reconcile counts again.

    def _owner_of(self, pod: Mapping[str, Any]) -> str | None:
        """The uid of the DaemonSet of this name that owns `pod`, or None when none does."""
        for owner in (pod.get("metadata") or {}).get("ownerReferences") or ():
            if owner.get("kind") == "DaemonSet" and owner.get("name") == self.name:
                return str(owner.get("uid"))
        return None
