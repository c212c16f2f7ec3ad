"""Issue #36, warm as a node fact after the first hello, on a real local stack: a rule's `spec.nodeLabel`
appears on a node once the pushed image is there (and on a node that joins after the push, once its `Never`
job pulled it), and a node that joins without the startup taint has its
`PrewarmWarm` condition turn from `Pulling` to `ImagesPulled` when its agent's pull succeeds (it sends no
`Warmed`: the reports do it), and stay `ImagesPulled` through the daily re-pull once its kubelet lists the
image on the Node (`status.images`), though the re-pull's node reads `Pulling` for seconds (the registry's
manifest quota refuses it meanwhile). All read through the official kubernetes client.

A real local stack: moto behind the AWS limits layer, the functions on their event sources, the embedded
Kubernetes API under the RBAC and admission policies install ships, the registry that plays ECR, and a
private containerd and agent per node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from prewarm.domain.boot import CONDITION_TYPE, PULLED, PULLING, digests_on_node
from prewarm.domain.status import NodePhase
from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localmode import LocalMode, missing_prerequisites
from tests.support.local_mode import apply_planned, manifests_refused, never_job, running_local_mode
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

LABEL = "prewarm.dev/e2e-label"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    with running_local_mode(tmp_path_factory, "nodefacts", nodes=1) as mode:
        yield mode


def read_node(local: LocalMode, name: str) -> dict[str, Any]:
    """The Node as the official kubernetes client reads it, as JSON: the client's models refuse a local node's
    `nodeInfo`, which has no osImage."""
    assert local.kube is not None
    with local.kube.api_client() as client:
        return dict(json.loads(CoreV1Api(client).read_node(name, _preload_content=False).data))


def labels(local: LocalMode, name: str) -> dict[str, str]:
    return dict(read_node(local, name)["metadata"].get("labels") or {})


def warm_condition(local: LocalMode, name: str) -> dict[str, Any] | None:
    conditions = read_node(local, name)["status"].get("conditions") or ()
    return next((c for c in conditions if c["type"] == CONDITION_TYPE), None)


def test_a_rules_node_label_appears_once_the_pushed_image_is_on_the_node(local: LocalMode) -> None:
    # Given a rule with spec.nodeLabel for the "labelled" pool, and a node of that pool
    rule = {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "e2e-label"},
            "spec": {"repositories": ["e2e/label"], "nodeLabel": LABEL,
                     "template": {"spec": {"selector": {"matchLabels": {"pool": "labelled"}}, "parallelism": 5}}}}
    apply_manifest(local.job_store(), rule, now=time.time())
    local.add_node("label-1", labels={"pool": "labelled"}, taints=[])
    try:
        wait_until(lambda: local.job_store().get_node("label-1") is not None, 20, "label-1's hello")
        assert LABEL not in labels(local, "label-1")

        # When an image the rule matches is pushed (its job pulls it on the node)
        pushed = local.push("e2e/label", "v1", size_mb=2)

        # Then the node carries the label once the image is there, and keeps its other labels
        wait_until(lambda: labels(local, "label-1").get(LABEL) == "true", 60,
                   "the rule's node label on label-1")
        assert local.nodes["label-1"].image_present(pushed.reference)
        assert labels(local, "label-1")["pool"] == "labelled"

        # When a node of the pool joins after the push, with a Never job keeping the pushed digest warm there
        # (the rule's job, Always, finished before it joined)
        apply_planned(local, never_job("label-keep", pushed.reference, "labelled"))
        local.add_node("label-2", labels={"pool": "labelled"}, taints=[])

        # Then it gets the label too once its Never job pulled the image, with no new push
        wait_until(lambda: labels(local, "label-2").get(LABEL) == "true", 60,
                   "the rule's node label on label-2, which joined after the push")
        assert local.nodes["label-2"].image_present(pushed.reference)
    finally:
        local.remove_node("label-1")
        if "label-2" in local.nodes:
            local.remove_node("label-2")


def test_an_untainted_node_s_condition_turns_true_once_its_agent_pulled_its_image(local: LocalMode) -> None:
    # Given a Never job for the "plain" pool that pulls even a present image (imagePullPolicy Always)
    pushed = local.push("e2e/plain", "v1", size_mb=2)
    job = never_job("plain", pushed.reference, "plain")
    job["spec"]["imagePullPolicy"] = "Always"
    apply_planned(local, job)

    # When a node of that pool joins without the startup taint (its agent sends no Warmed) and without the image
    try:
        with manifests_refused(local):
            local.add_node("plain-1", labels={"pool": "plain"}, taints=[])
            # Then its first hello sets its condition Pulling, while the registry holds its pull back
            wait_until(lambda: (c := warm_condition(local, "plain-1")) is not None and c["reason"] == PULLING, 30,
                       "plain-1's PrewarmWarm condition Pulling")
        # ... which turns ImagesPulled when its pull succeeds
        wait_until(lambda: (c := warm_condition(local, "plain-1")) is not None and c["reason"] != PULLING, 60,
                   "plain-1's condition no longer Pulling")
        condition = warm_condition(local, "plain-1")
        assert condition is not None and (condition["status"], condition["reason"]) == ("True", PULLED), condition
        assert local.nodes["plain-1"].image_present(pushed.reference)

        # When its kubelet lists the image on the Node by digest (its image cache, 30 s, then its status loop)
        wait_until(lambda: pushed.reference in digests_on_node(read_node(local, "plain-1")), 60,
                   "plain-1's Node listing the image in status.images")
        # and the daily re-pull starts the job's next round, whose pull the registry holds up for seconds
        store = local.job_store()
        before = store.get_job("default/plain")
        assert before is not None
        reasons = set()

        def next_round(phase: NodePhase) -> bool:
            reasons.add((warm_condition(local, "plain-1") or {}).get("reason"))
            task = store.get_task("default/plain", "plain-1")
            return task is not None and task.round > before.round and task.phase == phase

        with manifests_refused(local):
            local.fire("repull")
            wait_until(lambda: next_round(NodePhase.PULLING), 60, "plain-1's task of the next round Pulling")
            held_until = time.monotonic() + 5  # the reports' function judges the node after storing its phase
            while time.monotonic() < held_until:
                next_round(NodePhase.PULLING)
                time.sleep(0.2)
        wait_until(lambda: next_round(NodePhase.SUCCEEDED), 90, "plain-1's task of the next round succeeded")
        # Then its condition never read Pulling meanwhile: the node held the digest all along
        assert reasons == {PULLED}, reasons
    finally:
        if "plain-1" in local.nodes:
            local.remove_node("plain-1")
